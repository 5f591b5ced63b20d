#!/usr/bin/env bash
# The timing-sensitive tests under -race, COUNT times each (default 3), beside two busy loops
# (`yes > /dev/null`) that take the two cores' spare cycles, as a loaded CI runner or a
# neighbour's build would. Run it before you stop when you touched a timeout, a breaker, a
# failover, a write deadline or a test that bounds a latency; it must end green.
#
#   scripts/flakehunt.sh                 # the packages and binary tests below, 3 times each
#   COUNT=5 PKGS=./limits scripts/flakehunt.sh
#   BUSY=0 scripts/flakehunt.sh          # without the busy loops
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/test-deps.sh

count=${COUNT:-3}
busy=${BUSY:-2}
# Packages whose tests bound latencies (the Guard and its breakers, the coalescer, Cluster and
# Sentinel failovers; the upstream pool's deadlines and idle closes; the proxy's write stalls
# and cutoffs; webhook delivery retries).
pkgs=${PKGS:-./limits ./h1 ./proxy ./notify}
# The gateway binary's tests that bound a latency: the sequential ones (docs/contributing.md,
# "Tests that hold on a busy machine"). The parallel ones only wait.
run=${RUN:-'TestSentinelFailoverUnderLoad|TestClusterFailoverUnderLoad|TestRedisKilledMidLoad|TestRedisSlowed|TestUpstreamFaults|TestRedisPausedDuringBatch|TestUpstreamIdleCloseRace|TestUpstreamIdleTimeoutApplied|TestKeepAliveOnRefusals|TestRefusalsCloseOnLargeOrSlowBodies|TestFailoverOvershoot|TestReadyWhileRedisIsDown|TestRedisKilledAndRestarted|TestUpstreamEarlyCloseAndResets|TestStalledReaderFreesItsSlot'}

loops=()
stop_loops() {
  for pid in "${loops[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${loops[@]}"; do wait "$pid" 2>/dev/null || true; done
}
trap stop_loops EXIT
for _ in $(seq 1 "$busy"); do
  yes >/dev/null &
  loops+=($!)
done
echo "flakehunt: $busy busy loops (pids ${loops[*]:-none}), -count=$count"

start=$SECONDS
# shellcheck disable=SC2086 # pkgs is a list of package patterns
go test -race -count="$count" -timeout 45m $pkgs
if [ -n "$run" ]; then
  go test -race -count="$count" -timeout 45m -run "^($run)\$" ./cmd/gateway
fi
echo "flakehunt: green, ${count} runs each, $((SECONDS - start))s"
