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
  "./proxy FuzzClientIP"
  "./proxy FuzzUIStreamTap"
  "./proxy FuzzDataStreamTap"
  "./h1 FuzzPoolAnswer"
  "./limits FuzzHoldsInvariant"
  "./limits FuzzStoresAgree"
)
for t in "${targets[@]}"; do
  read -r pkg name <<<"$t"
  echo "fuzz: $name in $pkg for $fuzztime" >&2
  ${GO:-go} test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" -fuzzminimizetime 10s ${parallel[@]+"${parallel[@]}"} "$pkg"
done
echo "fuzz: all ${#targets[@]} targets passed" >&2
