#!/usr/bin/env bash
# Runs every fuzz target for FUZZTIME each (default 15s), one after the other; CI calls it
# besides the normal tests:
#
#   FUZZTIME=15s scripts/fuzz.sh
#
# A new input's minimization is bounded (-fuzzminimizetime 10s): FuzzStoresAgree's inputs run
# for seconds each against a real redis-server, and the default minute would outlast FUZZTIME.
#
# Stops at the first target that fails; `go test` then prints the failing input, which it
# also writes under the package's testdata/fuzz/<Target>/ so it becomes a seed.
#
# FUZZJOBS (default 1) targets run at a time, each one's output printed whole once it ends:
# scripts/test.sh runs two at once when nothing else is left to run beside them.
set -euo pipefail
cd "$(dirname "$0")/.."

fuzztime=${FUZZTIME:-15s}
# FUZZPARALLEL, when set, is the number of fuzzing workers per target (go test -parallel;
# default GOMAXPROCS): scripts/test.sh runs the targets beside the race tests with one.
parallel=()
if [ -n "${FUZZPARALLEL:-}" ]; then
  parallel=(-parallel "$FUZZPARALLEL")
fi
targets=(
  "./auth FuzzBearer"
  "./config FuzzParse"
  "./validate FuzzAgentJob"
  "./validate FuzzAssistantMessage"
  "./validate FuzzAssistantMessageV2"
  "./validate FuzzFoldedKeys"
  "./clientip FuzzClientIP"
  "./stream FuzzUIStreamTap"
  "./stream FuzzDataStreamTap"
  "./h1 FuzzPoolAnswer"
  "./limits FuzzHoldsInvariant"
  "./limits FuzzStoresAgree"
)
# go test reports "context deadline exceeded", with no failing input, when FUZZTIME runs out
# while the engine is still minimizing a new interesting input (more likely on a busy
# machine). That is no finding: such a target is run once more, and fails only if it does
# again. A real finding always names its input ("Failing input written to").
fuzz() {
  local pkg=$1 name=$2 out status=0
  out=$(mktemp)
  ${GO:-go} test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" -fuzzminimizetime 10s ${parallel[@]+"${parallel[@]}"} "$pkg" 2>&1 | tee "$out" || status=$?
  if [ "$status" -ne 0 ] && grep -q 'context deadline exceeded' "$out" && ! grep -q 'Failing input written to' "$out"; then
    status=2
  fi
  rm -f "$out"
  return "$status"
}
# target runs one target (once more if it ran out of time while minimizing).
target() {
  local pkg=$1 name=$2 status=0
  echo "fuzz: $name in $pkg for $fuzztime" >&2
  fuzz "$pkg" "$name" || status=$?
  if [ "$status" -eq 2 ]; then
    echo "fuzz: $name ran out of time while minimizing an input (no finding); once more" >&2
    status=0
    fuzz "$pkg" "$name" || status=$?
  fi
  return "$status"
}
jobs=${FUZZJOBS:-1}
if [ "$jobs" -le 1 ]; then
  for t in "${targets[@]}"; do
    read -r pkg name <<<"$t"
    target "$pkg" "$name"
  done
else
  # Each target's output goes to a file of its own and is printed when it ends, so that two
  # targets' lines do not interleave; the first failure stops the others (after the running
  # ones end: a target always ends within FUZZTIME plus its minimization).
  logs=$(mktemp -d)
  trap 'rm -rf "$logs"' EXIT
  declare -A running=()
  failed=0
  reap() {
    local pid status
    status=0
    wait -n -p pid "${!running[@]}" || status=$?
    cat "$logs/${running[$pid]}"
    unset "running[$pid]"
    if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ]; then failed=$status; fi
  }
  for t in "${targets[@]}"; do
    read -r pkg name <<<"$t"
    (target "$pkg" "$name") >"$logs/$name" 2>&1 &
    running[$!]=$name
    while [ "${#running[@]}" -ge "$jobs" ]; do reap; done
    [ "$failed" -eq 0 ] || break
  done
  while [ "${#running[@]}" -gt 0 ]; do reap; done
  [ "$failed" -eq 0 ] || exit "$failed"
fi
echo "fuzz: all ${#targets[@]} targets passed" >&2
