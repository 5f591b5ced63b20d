#!/usr/bin/env bash
# The benchmark suite behind `make bench`: installs what it needs (wrk, redis-server and
# redis-cli through apt-get when missing and root; vegeta and go-redis through the nested Go
# module bench/), builds the binaries, runs the Go benchmarks of the handler chain and the
# validators, then bench/cmd/benchrun (interleaved rounds of direct, bare, gateway-memory,
# gateway-redis, gateway-cluster) and prints the Markdown table it writes.
#
# Knobs (environment):
#   ROUNDS=3 DURATION=4s WARMUP=1s CONNS=50 RATE=2000 STREAMS=5000 PROFILE=10s PIN=1
#   PROFILE_WORKLOAD=agent_job (the closed-loop workload the profile is taken under)
#   PROFILE_VARIANT=gateway-redis (the variant profiled)
#   PAIRS=10 PAIR_DURATION=3s (back-to-back closed-loop runs of bare and gateway-redis on
#     agent_job, assistant_message and assistant_message_v2 (those selected), the throughput
#     ratios' measurement; 0 skips them)
#   NOTIFY_PAIRS=6 (back-to-back closed-loop agent_job runs of gateway-redis with notifications
#     off and on, nothing crossed: what notifications cost the request path; 0 skips them)
#   OPEN_SETS=12 OPEN_SET_DURATION=3s (back-to-back open-loop runs of bare, gateway-redis and
#     gateway-redis-nocoalesce on agent_job at RATE, the six orders in turn: the latency
#     comparisons; at least 6 for a verdict, 0 skips them)
#   VARIANTS=direct,bare,gateway-memory,gateway-redis,gateway-full,gateway-redis-nocoalesce,gateway-redis-stdtransport,gateway-cluster,gateway-replicated,gateway-wait1
#     (gateway-full: every feature of config.example.yaml on, tracing at its default ratio; its own
#     paired runs against bare on agent_job)
#   WORKLOADS="agent_job,assistant_message,assistant_message_v2,401/429 mix,streams" (streams: the
#     per-part delay and idle streams, each on v1 and v2)
#   GOBENCH=1 (0 skips the go test benchmarks)   BENCHTIME=1s   GOBENCH_COUNT=5
#   SCALE=1 (0 skips the GOMAXPROCS=2 run of bare and gateway-redis on agent_job, unpinned,
#     written beside OUT as <name>-gomaxprocs2.md: how the gateway scales to two cores)
#   REV=<git revision> builds the gateway from that revision (git archive) instead of the
#     working tree.   OUT=bench/results/latest.md
#   BASE=<git revision> also builds the gateway from that revision as gateway-redis-base: it
#     runs in every round beside the others, and PAIRS pairs of it against gateway-redis on
#     agent_job and both streamed routes measure a change against what it changes, in one run;
#     with gateway-full among VARIANTS, PAIRS pairs of gateway-full-base (the base revision
#     with the full config: registry mode) against gateway-full on agent_job and
#     assistant_message too
# Smoke run: ROUNDS=1 DURATION=1s WARMUP=300ms STREAMS=500 PROFILE=0 GOBENCH_COUNT=1 make bench
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-4s}
WARMUP=${WARMUP:-1s}
CONNS=${CONNS:-50}
RATE=${RATE:-2000}
STREAMS=${STREAMS:-5000}
PROFILE=${PROFILE:-10s}
PROFILE_WORKLOAD=${PROFILE_WORKLOAD:-agent_job}
PROFILE_VARIANT=${PROFILE_VARIANT:-gateway-redis}
PIN=${PIN:-1}
PAIRS=${PAIRS:-10}
PAIR_DURATION=${PAIR_DURATION:-3s}
NOTIFY_PAIRS=${NOTIFY_PAIRS:-6}
OPEN_SETS=${OPEN_SETS:-12}
OPEN_SET_DURATION=${OPEN_SET_DURATION:-3s}
VARIANTS=${VARIANTS:-direct,bare,gateway-memory,gateway-redis,gateway-full,gateway-redis-nocoalesce,gateway-redis-stdtransport,gateway-cluster,gateway-replicated,gateway-wait1}
WORKLOADS=${WORKLOADS:-agent_job,assistant_message,assistant_message_v2,401/429 mix,streams}
GOBENCH=${GOBENCH:-1}
BENCHTIME=${BENCHTIME:-1s}
GOBENCH_COUNT=${GOBENCH_COUNT:-5}
SCALE=${SCALE:-1}
OUT=${OUT:-bench/results/latest.md}
GO=${GO:-go}

# --- tools
missing=()
command -v wrk >/dev/null || missing+=(wrk)
command -v redis-server >/dev/null || missing+=(redis-server)
command -v redis-cli >/dev/null || missing+=(redis-tools)
command -v taskset >/dev/null || missing+=(util-linux)
if ((${#missing[@]})); then
	if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null; then
		echo "== apt-get install ${missing[*]}"
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
	else
		echo "bench: missing ${missing[*]}; run: sudo apt-get install -y ${missing[*]}" >&2
		exit 1
	fi
fi

# Idle streams: the gateway holds two sockets per stream, the client one.
hard=$(ulimit -Hn)
if [[ $hard == unlimited || $hard -gt 65536 ]]; then hard=65536; fi
ulimit -n "$hard" || true
if (($(ulimit -n) < 2 * STREAMS + 1000)); then
	echo "bench: ulimit -n is $(ulimit -n), too low for STREAMS=$STREAMS; lowering STREAMS" >&2
	STREAMS=$((($(ulimit -n) - 1000) / 2))
fi

# --- build
work=$(mktemp -d /tmp/gateway-bench-build.XXXXXX)
trap 'rm -rf "$work"' EXIT
src=$root
source_desc="the working tree at $(git rev-parse --short HEAD)"
[[ -z $(git status --porcelain --untracked-files=no 2>/dev/null) ]] || source_desc+=" (with uncommitted changes)"
if [[ -n ${REV:-} ]]; then
	source_desc="$REV ($(git rev-parse --short "$REV"))"
	echo "== gateway from $REV"
	mkdir -p "$work/src"
	git archive "$REV" | tar -x -C "$work/src"
	src=$work/src
fi
echo "== build gateway, upstream-sim (from $src), bare, benchrun"
(cd "$src" && CGO_ENABLED=0 $GO build -trimpath -o "$work/bin/gateway" ./cmd/gateway &&
	CGO_ENABLED=0 $GO build -trimpath -o "$work/bin/upstream-sim" ./cmd/upstream-sim)
base_desc=""
if [[ -n ${BASE:-} ]]; then
	base_desc="$BASE ($(git rev-parse --short "$BASE"))"
	echo "== base gateway from $BASE"
	mkdir -p "$work/base"
	git archive "$BASE" | tar -x -C "$work/base"
	(cd "$work/base" && CGO_ENABLED=0 $GO build -trimpath -o "$work/bin/gateway-base" ./cmd/gateway)
fi
(cd bench && CGO_ENABLED=0 $GO build -trimpath -o "$work/bin/bare" ./cmd/bare &&
	CGO_ENABLED=0 $GO build -trimpath -o "$work/bin/benchrun" ./cmd/benchrun)

gobench_out=""
if [[ $GOBENCH == 1 ]]; then
	echo "== go test -bench (handler chain, validators), count $GOBENCH_COUNT"
	gobench_out=$work/gobench.txt
	(cd "$src" && GOMAXPROCS=1 $GO test -run '^$' -bench '^Benchmark(Gateway|BareReverseProxy)' -benchmem -benchtime "$BENCHTIME" -count "$GOBENCH_COUNT" ./proxy &&
		GOMAXPROCS=1 $GO test -run '^$' -bench '^(BenchmarkAssistantMessage100KiB|BenchmarkAgentJob)$' -benchmem -benchtime "$BENCHTIME" -count "$GOBENCH_COUNT" ./validate &&
		# The limiter alone on a real redis-server (started by the test harness), with and
		# without coalescing, at 1, 8, 64 and 256 concurrent callers.
		GOMAXPROCS=1 $GO test -run '^$' -bench '^BenchmarkTakeConcurrent$' -benchtime 20000x -count 1 ./limits) |
		tee "$gobench_out" | grep -E '^(Benchmark|ok|FAIL)' || true
fi

alloc_args=()
if [[ $GOBENCH == 1 ]]; then
	# Every allocation of agent_job requests sampled, to split the gateway's own from
	# net/http's (benchrun reads the stacks).
	echo "== allocations per agent_job request (BenchmarkGatewayAgentJob, -memprofilerate 1)"
	alloc_n=20000
	(cd "$src" && GOMAXPROCS=1 $GO test -run '^$' -bench '^BenchmarkGatewayAgentJob$' -benchtime "${alloc_n}x" \
		-memprofile "$work/mem.out" -memprofilerate 1 -o "$work/proxy.test" ./proxy >/dev/null &&
		$GO tool pprof -sample_index=alloc_objects -traces "$work/proxy.test" "$work/mem.out" >"$work/alloc-traces.txt" 2>/dev/null)
	# b.N is 1 in the benchmark's first run, then alloc_n.
	alloc_args=(-alloc-traces "$work/alloc-traces.txt" -alloc-n $((alloc_n + 1)))
fi

pin=true
[[ $PIN == 1 ]] || pin=false
case $OUT in /*) ;; *) OUT=$root/$OUT ;; esac
run=("$work/bin/benchrun" -bin "$work/bin" -out "$OUT" -source "$source_desc" -base "$base_desc" -rounds "$ROUNDS" -duration "$DURATION" -warmup "$WARMUP"
	-pairs "$PAIRS" -pair-duration "$PAIR_DURATION" -notify-pairs "$NOTIFY_PAIRS" -open-sets "$OPEN_SETS" -open-set-duration "$OPEN_SET_DURATION"
	-conns "$CONNS" -rate "$RATE" -streams "$STREAMS" -profile "$PROFILE" -profile-workload "$PROFILE_WORKLOAD" -profile-variant "$PROFILE_VARIANT" -pin="$pin"
	-variants "$VARIANTS" -workloads "$WORKLOADS" -gobench "$gobench_out" "${alloc_args[@]}")
if [[ $pin == true ]]; then
	# The load generators (wrk, vegeta, stream clients) share CPU 1 with upstream-sim and
	# Redis; benchrun pins each server under test to CPU 0.
	run=(taskset -c 1 "${run[@]}")
fi
echo "== benchrun (rounds=$ROUNDS duration=$DURATION conns=$CONNS rate=$RATE streams=$STREAMS pin=$pin)"
start=$(date +%s)
"${run[@]}"
echo "bench: $(($(date +%s) - start))s in benchrun; report in $OUT"
if [[ $SCALE == 1 ]]; then
	# Both cores for the server under test (the load generators then share them): the
	# scaling from GOMAXPROCS=1 to 2 on this machine, for the capacity model.
	scale_out=${OUT%.md}-gomaxprocs2.md
	echo "== benchrun GOMAXPROCS=2 (bare, gateway-redis; agent_job; unpinned)"
	"$work/bin/benchrun" -bin "$work/bin" -out "$scale_out" -source "$source_desc" -rounds "$ROUNDS" -duration "$DURATION" -warmup "$WARMUP" \
		-conns "$CONNS" -rate "$RATE" -streams 0 -profile 0 -pin=false -gomaxprocs 2 -pairs 0 -notify-pairs 0 \
		-variants bare,gateway-redis -workloads agent_job >/dev/null
	echo "bench: GOMAXPROCS=2 report in $scale_out"
fi
