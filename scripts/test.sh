#!/usr/bin/env bash
# The whole test suite, as the README's test command and CI run it.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/test-deps.sh
echo "== go mod verify"
go mod verify

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The checks that only compile and read code, the two other modules, the release build, the
# proxy's tests on the standard transport and the fuzz targets run beside the race tests (which mostly wait on sockets, windows and timeouts)
# in one background job; its output is kept in a file and printed, with its result, once the
# tests are done.
checks() {
  set -euo pipefail
  # The compile-heavy checks run at a lower priority while the race tests run: those are the
  # suite's critical path, and their build competed with these for the two cores; these still
  # take every cycle the tests leave while they wait on sockets and timers. Once the tests are
  # done (the marker file is gone, and what still runs is reniced) they run at normal priority:
  # on a machine busy with other work they would otherwise get a tenth of a core. The proxy
  # re-run and the fuzz targets keep normal priority, since they have deadlines of their own.
  low() {
    if [ -e "$work/racing" ]; then nice -n 10 "$@"; else "$@"; fi
  }
  # step names a check and when it started (seconds since the suite's start), so that a slow
  # run shows where its time went.
  step() {
    echo "== $* (${SECONDS}s in)"
  }
  step "go vet"
  low go vet ./...
  step "staticcheck"
  # Pinned; installs from the Go module proxy into GOPATH/bin the first time.
  staticcheck_version=v0.8.2
  staticcheck="$(go env GOPATH)/bin/staticcheck"
  if ! "$staticcheck" -version 2>/dev/null | grep -q "${staticcheck_version#v}"; then
    low go install "honnef.co/go/tools/cmd/staticcheck@$staticcheck_version"
  fi
  low "$staticcheck" ./...
  # deploy/kubernetes/check is its own module (Kubernetes API types and Helm stay out of the
  # gateway's go.mod): it decodes the kustomize base and the Helm chart (rendered and linted
  # with Helm's Go module) strictly and runs the same checks on both.
  step "deploy/kubernetes/check"
  (cd deploy/kubernetes/check && low go vet ./... && low go test -count=1 -timeout 5m ./...)
  # bench/ is its own module too (vegeta stays out of the gateway's go.mod): it must build, and
  # its report's statistics have unit tests. The benchmarks themselves run by make bench only.
  step "bench module"
  (cd bench && low go vet ./... && low go test -count=1 -timeout 2m ./...)
  # The release build line (also the Dockerfile's) gives static binaries that print -version.
  step "scripts/build.sh"
  out="$work/build"
  mkdir -p "$out"
  low env VERSION=v0.0.0-ci scripts/build.sh "$out"
  for bin in gateway upstream-sim; do
    if ldd "$out/$bin" >/dev/null 2>&1; then
      echo "scripts/build.sh: $bin is dynamically linked" >&2; exit 1
    fi
  done
  "$out/gateway" -version | grep -q '^gateway v0.0.0-ci ' || { echo "scripts/build.sh: gateway -version lacks the version" >&2; exit 1; }
  echo "build.sh: static binaries, gateway -version ok"
  # The proxy's tests again with net/http's Transport to the upstream (upstream.transport:
  # standard) instead of the gateway's own pool, so both stay tested.
  step "go test -race ./proxy (upstream.transport: standard)"
  GATEWAY_TEST_UPSTREAM_TRANSPORT=standard go test -race -count=1 -timeout 5m ./proxy
  # Every fuzz target briefly (FUZZTIME each, default 8s here so the suite stays under eight
  # minutes; make fuzz runs 15s each; FUZZTIME=0 skips them for a quick local run), with one
  # worker each: beside the race tests, a second would only take their CPU. Once the race
  # tests are done (on a cold machine they end first), two targets run at a time, one a core.
  if [ "${FUZZTIME:-8s}" != "0" ]; then
    jobs=1
    [ -e "$work/racing" ] || jobs=2
    step "fuzz ($jobs at a time)"
    FUZZTIME="${FUZZTIME:-8s}" FUZZPARALLEL="${FUZZPARALLEL:-1}" FUZZJOBS="$jobs" scripts/fuzz.sh
  fi
  echo "$SECONDS" >"$work/checks.end"
}
# In a process group of its own (set -m), so that a failing test run stops it and everything it
# started, by its process group id.
touch "$work/racing"
set -m
(checks) >"$work/checks.log" 2>&1 &
checks_pid=$!
set +m
trap 'kill -- "-$checks_pid" 2>/dev/null || true; wait "$checks_pid" 2>/dev/null || true; rm -rf "$work"' EXIT

echo "== go test -race"
# -parallel 8: the binary tests marked parallel mostly wait (windows, ttls, write deadlines),
# so eight at a time on two cores; the tests that bound a latency run before them, none of
# them beside.
go test -race -count=1 -parallel 8 -timeout 15m ./...
echo "test.sh: race tests done ${SECONDS}s after the start"
# The checks take the cores at normal priority from here (renice needs the right to raise a
# priority, which root has; elsewhere only the checks not yet started do).
rm -f "$work/racing"
renice -n 0 -g "$checks_pid" >/dev/null 2>&1 || true

echo "== go vet, staticcheck, deploy/kubernetes/check, bench module, scripts/build.sh, ./proxy on the standard transport, fuzz (run beside the tests)"
checks_status=0
wait "$checks_pid" || checks_status=$?
cat "$work/checks.log"
echo "test.sh: checks done by ${SECONDS}s after the start (they ended $(cat "$work/checks.end" 2>/dev/null || echo ?)s in)"
if [ "$checks_status" -ne 0 ]; then
  echo "test.sh: the checks above failed (exit $checks_status)" >&2
  exit "$checks_status"
fi
