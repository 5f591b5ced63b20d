#!/usr/bin/env bash
# The whole test suite, as the README's test command and CI run it.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/test-deps.sh
echo "== go mod verify"
go mod verify
echo "== go vet"
go vet ./...
echo "== staticcheck"
# Pinned; installs from the Go module proxy into GOPATH/bin the first time.
staticcheck_version=v0.8.2
staticcheck="$(go env GOPATH)/bin/staticcheck"
if ! "$staticcheck" -version 2>/dev/null | grep -q "${staticcheck_version#v}"; then
  go install "honnef.co/go/tools/cmd/staticcheck@$staticcheck_version"
fi
"$staticcheck" ./...
echo "== go test -race"
go test -race -count=1 -timeout 15m ./...
# The proxy's tests again with net/http's Transport to the upstream (upstream.transport:
# standard) instead of the gateway's own pool, so both stay tested.
echo "== go test -race ./proxy (upstream.transport: standard)"
GATEWAY_TEST_UPSTREAM_TRANSPORT=standard go test -race -count=1 -timeout 5m ./proxy
# deploy/kubernetes/check is its own module (Kubernetes API types and Helm stay out of the
# gateway's go.mod): it decodes the kustomize base and the Helm chart (rendered and linted
# with Helm's Go module) strictly and runs the same checks on both.
echo "== deploy/kubernetes/check"
(cd deploy/kubernetes/check && go vet ./... && go test -count=1 -timeout 5m ./...)
# bench/ is its own module too (vegeta stays out of the gateway's go.mod): it must build, and
# its report's statistics have unit tests. The benchmarks themselves run by make bench only.
echo "== bench module"
(cd bench && go vet ./... && go test -count=1 -timeout 2m ./...)
# The release build line (also the Dockerfile's) gives static binaries that print -version.
echo "== scripts/build.sh"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
VERSION=v0.0.0-ci scripts/build.sh "$out"
for bin in gateway upstream-sim; do
  if ldd "$out/$bin" >/dev/null 2>&1; then
    echo "scripts/build.sh: $bin is dynamically linked" >&2; exit 1
  fi
done
"$out/gateway" -version | grep -q '^gateway v0.0.0-ci ' || { echo "scripts/build.sh: gateway -version lacks the version" >&2; exit 1; }
echo "build.sh: static binaries, gateway -version ok"
# Every fuzz target briefly (FUZZTIME each, default 8s here so the suite stays near ten
# minutes; make fuzz runs 15s each; FUZZTIME=0 skips them for a quick local run).
if [ "${FUZZTIME:-8s}" != "0" ]; then
  echo "== fuzz"
  FUZZTIME="${FUZZTIME:-8s}" scripts/fuzz.sh
fi
