#!/usr/bin/env bash
# make demo: builds the binaries, writes bin/demo.yaml (config.example.yaml with a demo admin
# token, the public listener on loopback and a keys file in bin/), starts the upstream simulator
# and the gateway, and prints examples to try, with absolute paths so that they run as printed
# from any directory. No Redis needed. Ctrl-C stops both processes (by PID) and exits 0.
#
#   scripts/demo.sh                      # the demo
#   scripts/demo.sh --write-config FILE  # only write the demo's config to FILE (the docs test)
#   scripts/demo.sh --build DIR          # only build the demo's binaries into DIR (the docs test)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd -P)

# The demo's admin token: a fixed, public value, so that the printed examples work as printed.
# The admin listener stays on loopback (127.0.0.1:9090, config.example.yaml's default).
token=demo-admin-token-loopback-only

# write_config FILE KEYS_FILE: config.example.yaml with three lines changed; fails when one of
# them is no longer there to change (config.example.yaml moved on: adjust this function).
write_config() {
  local out=$1 keys=$2
  {
    echo "# Written by scripts/demo.sh from config.example.yaml, for the demo only: the public"
    echo "# listener on loopback, a demo admin token (public: never use it elsewhere) and a keys"
    echo "# file for 'gateway keys'. The admin listener stays on loopback."
    sed -e 's|^listen: ":8080"$|listen: "127.0.0.1:8080"|' \
        -e "s|^admin_token: \"\"\$|admin_token: \"$token\"|" \
        -e "s|^  keys_file: \"\"\$|  keys_file: \"$keys\"|" \
        config.example.yaml
  } >"$out"
  local want
  for want in '^listen: "127.0.0.1:8080"$' "^admin_token: \"$token\"\$" "^  keys_file: \"$keys\"\$" \
    '^admin_listen: "127\.0\.0\.1:[0-9]*"$'; do
    if ! grep -q "$want" "$out"; then
      echo "demo: $out lacks a line matching $want: config.example.yaml changed, adjust scripts/demo.sh" >&2
      return 1
    fi
  done
}

# build DIR: the gateway and the simulator, as a release is built (scripts/build.sh): the
# version from git describe and the commit recorded, so that `gateway version` and
# gateway_build_info say which checkout the demo runs, whatever GOFLAGS says of -buildvcs.
build() {
  scripts/build.sh "$1"
}

case "${1:-}" in
--write-config)
  [ $# -eq 2 ] || { echo "usage: scripts/demo.sh --write-config FILE" >&2; exit 2; }
  write_config "$2" "$(dirname "$2")/demo-keys.yaml"
  exit 0
  ;;
--build)
  [ $# -eq 2 ] || { echo "usage: scripts/demo.sh --build DIR" >&2; exit 2; }
  build "$2"
  exit 0
  ;;
"") ;;
*)
  echo "usage: scripts/demo.sh [--write-config FILE | --build DIR]" >&2
  exit 2
  ;;
esac

build bin
write_config bin/demo.yaml "$root/bin/demo-keys.yaml"

sim='' gw=''
# stop ends every process the demo started, by PID, and waits for them.
stop() {
  local pid
  for pid in $gw $sim; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  for pid in $gw $sim; do
    wait "$pid" 2>/dev/null || true
  done
  gw='' sim=''
}
trap 'stop' EXIT
# Ctrl-C while the script itself has the terminal (building, starting, or without job control):
# stop everything and end cleanly, so that make prints no error.
trap 'echo; echo "demo: stopping"; stop; exit 0' INT TERM

# With a terminal, the gateway runs as a job of its own brought to the foreground (set -m, fg):
# Ctrl-C then reaches the gateway alone, it drains and exits 0, and this script stops the
# simulator and exits 0, so neither it nor make is interrupted. Without a terminal, the traps
# above do it.
jobcontrol=0
if [ -t 0 ] && [ -t 1 ]; then
  jobcontrol=1
  set -m
fi

bin/upstream-sim -listen 127.0.0.1:9000 -job-complete-after 10s &
sim=$!
bin/gateway -config bin/demo.yaml -dev &
gw=$!

# ready URL PID NAME: wait until URL answers, or fail when PID is gone.
ready() {
  local i
  for i in $(seq 100); do
    if ! kill -0 "$2" 2>/dev/null; then
      echo "demo: $3 did not start (is its port in use?)" >&2
      return 1
    fi
    if curl -sf -o /dev/null "$1" 2>/dev/null; then
      return 0
    fi
    sleep 0.1
  done
  echo "demo: $3 did not answer $1 within 10 s" >&2
  return 1
}
ready http://127.0.0.1:9000/healthz "$sim" "the upstream simulator" || exit 1
ready http://127.0.0.1:9090/readyz "$gw" "the gateway" || exit 1

aisdk="node $root/aisdk-clients/v2-chat.mjs ai5 http://127.0.0.1:8080/discovery/v2/assistant/acme-docs/message svc_dsc_demo anonymous \"How do I start?\""
if [ ! -d aisdk-clients/node_modules ]; then
  aisdk="(cd $root/aisdk-clients && npm ci) && $aisdk"
fi

cat <<TXT

Demo: the gateway on http://localhost:8080 in front of the upstream simulator (127.0.0.1:9000),
admin listener on http://127.0.0.1:9090 (loopback only). No Redis: limits are counted in this
process. Config: $root/bin/demo.yaml, config.example.yaml with the demo admin token
$token (public: for this demo only), the public listener on
loopback and a keys file in bin/.

Try, in another terminal:

1. An assistant answer on v2, the current route (AI SDK 5 and later, UI message stream):

  curl -N -X POST localhost:8080/discovery/v2/assistant/acme-docs/message \\
       -H 'Authorization: Bearer svc_dsc_demo' -H 'Content-Type: application/json' \\
       -d '{"fp":"anonymous","messages":[{"id":"1","role":"user","parts":[{"type":"text","text":"How do I start?"}]}]}'

   The same through a real AI SDK 5 client (Node 22 or later):

  $aisdk

2. An agent job; its RateLimit headers count down from 100 per project and hour:

  curl -i -X POST localhost:8080/v2/agent/my-project/job \\
       -H 'Authorization: Bearer svc_demo' -H 'Content-Type: application/json' \\
       -d '{"prompt":"Document the rate limits"}'

3. Who is near quota: the usage page, http://127.0.0.1:9090/ui/ (sign in with any user name and
   the password $token), or

  curl -s -H 'Authorization: Bearer $token' '127.0.0.1:9090/usage/top?limit=agent_job_per_project'
  GATEWAY_ADMIN_TOKEN=$token $root/bin/gateway usage top

4. Five more jobs for my-project this hour (a run-time quota, kept in the audit trail):

  GATEWAY_ADMIN_TOKEN=$token $root/bin/gateway quota grant --limit agent_job_per_project --id my-project --amount 5 --reason "demo"

5. A key for org acme on domain acme-docs: generate it, register its digest (in
   $root/bin/demo-keys.yaml), list the registry:

  $root/bin/gateway keys generate --kind assistant --add -config $root/bin/demo.yaml --org acme --domain acme-docs
  $root/bin/gateway keys list -config $root/bin/demo.yaml

   The demo runs auth.mode: prefix, where any svc_dsc_ key passes and the upstream checks it;
   with auth.mode: registry only registered keys pass (docs/operations.md, "Keys").

6. What a tenant sees of its own budget, with its own key (no admin token), e.g. from a chat
   widget: every limit a v2 answer for acme-docs meets, with a forecast:

  curl -s 'localhost:8080/gateway/usage?route=assistant_message_v2&domain=acme-docs' \\
       -H 'Authorization: Bearer svc_dsc_demo'

Deprecated: v1 (AI SDK 4, data stream protocol) still answers, with Deprecation and Sunset headers:

  curl -i -N -X POST localhost:8080/discovery/v1/assistant/acme-docs/message \\
       -H 'Authorization: Bearer svc_dsc_demo' -H 'Content-Type: application/json' \\
       -d '{"fp":"anonymous","messages":[{"id":"1","role":"user","content":"How do I start?"}]}'

Metrics: curl -s -H 'Authorization: Bearer $token' 127.0.0.1:9090/metrics | grep ^gateway_

More in docs/getting-started.md. Ctrl-C stops the gateway and the simulator.

TXT

status=0
if [ "$jobcontrol" = 1 ]; then
  # The gateway is the most recent job: give it the terminal until it ends.
  fg %+ >/dev/null || status=$?
  gw=''
  set +m
else
  wait "$gw" || status=$?
  gw=''
fi
stop
if [ "$status" -ne 0 ]; then
  echo "demo: the gateway exited with status $status" >&2
  exit "$status"
fi
exit 0
