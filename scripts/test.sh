#!/usr/bin/env bash
# The whole test suite, as the README's test command and CI run it.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/test-deps.sh
echo "== go vet"
go vet ./...
echo "== go test -race"
go test -race -count=1 -timeout 15m ./...
