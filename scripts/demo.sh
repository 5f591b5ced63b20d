#!/usr/bin/env bash
# Starts the upstream simulator and the gateway (config.example.yaml) in front of it. No Redis
# needed. Ctrl-C stops both.
set -euo pipefail
cd "$(dirname "$0")/.."

mkdir -p bin
go build -o bin/gateway ./cmd/gateway
go build -o bin/upstream-sim ./cmd/upstream-sim

bin/upstream-sim -listen 127.0.0.1:9000 -job-complete-after 10s &
sim=$!
trap 'kill "$sim" 2>/dev/null; wait "$sim" 2>/dev/null || true' EXIT

cat <<'TXT'

Gateway on http://localhost:8080 (admin on http://127.0.0.1:9090), upstream simulator on :9000.
Try, in another terminal:

  curl -i -X POST localhost:8080/v2/agent/my-project/job \
       -H 'Authorization: Bearer svc_demo' -H 'Content-Type: application/json' \
       -d '{"prompt":"Document the rate limits"}'

  curl -N -X POST localhost:8080/discovery/v1/assistant/acme-docs/message \
       -H 'Authorization: Bearer svc_dsc_demo' -H 'Content-Type: application/json' \
       -d '{"fp":"anonymous","messages":[{"id":"1","role":"user","content":"How do I start?"}]}'

  curl -s 127.0.0.1:9090/metrics | grep ^gateway_

TXT
bin/gateway -config config.example.yaml -dev
