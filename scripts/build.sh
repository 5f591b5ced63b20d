#!/usr/bin/env bash
# The one build line for release binaries: used by `make build`, by deploy/docker/Dockerfile and
# by CI (TestBuildScript in deploy/live_test.go and scripts/test.sh run it and check the result). Builds static (CGO_ENABLED=0),
# reproducible (-trimpath, -buildvcs=false) binaries of the gateway and the upstream simulator.
#
#   scripts/build.sh [OUTDIR]        # default OUTDIR: bin
#
# Version: $VERSION when set (the Dockerfile passes its VERSION build arg), else
# `git describe --tags --always --dirty`, else "dev". Revision (gateway_build_info's revision
# label): $REVISION when set (the Dockerfile's REVISION build arg), else `git rev-parse HEAD`,
# else "unknown" (-buildvcs=false keeps the VCS out of the build info, for reproducibility).
set -euo pipefail
cd "$(dirname "$0")/.."

out=${1:-bin}
version=${VERSION:-}
if [ -z "$version" ]; then
  version=$(git describe --tags --always --dirty 2>/dev/null || echo dev)
fi
revision=${REVISION:-}
if [ -z "$revision" ]; then
  revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
fi
mkdir -p "$out"

for cmd in gateway upstream-sim; do
  CGO_ENABLED=0 ${GO:-go} build -trimpath -buildvcs=false \
    -ldflags "-s -w -X main.version=${version} -X main.revision=${revision}" \
    -o "$out/$cmd" "./cmd/$cmd"
done
echo "build: $out/gateway $out/upstream-sim (version $version, revision $revision)" >&2
