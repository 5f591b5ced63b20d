#!/usr/bin/env bash
# The one build line for release binaries: used by `make build`, by deploy/docker/Dockerfile and
# by CI (TestBuildScript in deploy/live_test.go and scripts/test.sh run it and check the result). Builds static (CGO_ENABLED=0),
# reproducible (-trimpath, -buildvcs=false) binaries of the gateway and the upstream simulator.
#
#   scripts/build.sh [OUTDIR]        # default OUTDIR: bin
#
# Version: $VERSION when set (the Dockerfile passes its VERSION build arg), else
# `git describe --tags --always --dirty`, else "dev".
set -euo pipefail
cd "$(dirname "$0")/.."

out=${1:-bin}
version=${VERSION:-}
if [ -z "$version" ]; then
  version=$(git describe --tags --always --dirty 2>/dev/null || echo dev)
fi
mkdir -p "$out"

for cmd in gateway upstream-sim; do
  CGO_ENABLED=0 ${GO:-go} build -trimpath -buildvcs=false \
    -ldflags "-s -w -X main.version=${version}" \
    -o "$out/$cmd" "./cmd/$cmd"
done
echo "build: $out/gateway $out/upstream-sim (version $version)" >&2
