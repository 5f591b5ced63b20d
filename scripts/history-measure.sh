#!/usr/bin/env bash
# What usage history costs the operators' reads at TENANTS tenants (default 100,000): fills a
# fresh redis-server with TENANTS counters of each of the four built-in limits (the keyspace
# /usage/top walks), first without history, then each tenant with its limit's default history
# (agent_job_per_project and assistant_per_org: 48 hours, assistant_per_ip: 35 days,
# assistant_per_key: 13 months), and against a gateway built from the working tree reports:
#   - /usage/top?limit=agent_job_per_project read time, without and with history (median of RUNS);
#   - /usage/export of the previous hour (CSV, sorted by id): read time, rows, bytes;
#   - the longest Redis command during the reads (SLOWLOG, every command logged);
#   - Redis memory per tenant and kept window (INFO used_memory, before and after the history);
#   - the gateway's peak RSS (VmHWM) before and after the exports: what an export holds;
#   - at the largest history the config accepts (MaxHistory in limits/history.go), Redis memory
#     per tenant and kept window of MAX_TENANTS tenants (default 10,000) of one hourly limit,
#     with request-sized counts (1 to 100) and token-sized ones (10^5 to 10^7), and how a
#     tenant's hash is encoded (listpack: compact; hashtable: about 70 bytes per window).
# Not a test: nothing is asserted but the row count. Usage: scripts/history-measure.sh
set -euo pipefail
cd "$(dirname "$0")/.."
TENANTS=${TENANTS:-100000}
MAX_TENANTS=${MAX_TENANTS:-10000}
RUNS=${RUNS:-3}
max_history=$(sed -n 's/^const MaxHistory = \([0-9]*\).*/\1/p' limits/history.go)
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
rport=$(free_port)
redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no --dir "$work" >/dev/null &
pids+=($!)
rc() { redis-cli -p "$rport" "$@"; }
until rc ping >/dev/null 2>&1; do sleep 0.1; done

go build -o "$work/gateway" ./cmd/gateway

now=$(date +%s)
hour=$((now - now % 3600))
day=$((now - now % 86400))
month=$(date -u -d "$(date -u +%Y-%m-01)" +%s)

# fill NAME WINDOW START KEEP STEP [COUNTS] [N]: one HSET per tenant (RESP through redis-cli
# --pipe) for N tenants (default TENANTS); STEP is the window's length in seconds (0: calendar
# months, via date). COUNTS: "mixed" (default: 1 to 100 in the current window, 1 to 1000 in the
# kept ones), "requests" (1 to 100) or "tokens" (10^5 to 10^7).
fill() {
  local name=$1 window=$2 start=$3 keep=$4 step=$5 counts=${6:-mixed} n=${7:-$TENANTS} fields=""
  for ((k = 1; k <= keep; k++)); do
    if ((step > 0)); then ws=$((start - k * step)); else ws=$(date -u -d "$(date -u -d "@$start" +%Y-%m-01) -$k month" +%s); fi
    fields+=" $ws"
  done
  awk -v n="$n" -v name="$name" -v window="$window" -v s="$start" -v fields="$fields" -v counts="$counts" '
  function count(i, k) {
    if (counts == "requests") return (i + k) % 100 + 1
    if (counts == "tokens") return 100000 + (i * 7919 + k * 104729) % 9900001
    return k == 0 ? i % 100 + 1 : (i + k) % 1000 + 1
  }
  BEGIN {
    nf = split(fields, f, " ")
    for (i = 0; i < n; i++) {
      key = sprintf("gw:%s:{tenant%06d}", name, i) # a counter names no window; its w does
      w = substr(window, 1, 1) # hour, day, month: h, d, m (the window the hash counts in)
      argc = 8 + 2 * nf
      printf "*%d\r\n$4\r\nHSET\r\n$%d\r\n%s\r\n$1\r\nw\r\n$1\r\n%s\r\n$1\r\ns\r\n$%d\r\n%s\r\n$1\r\nn\r\n", argc, length(key), key, w, length(s), s
      v = count(i, 0); printf "$%d\r\n%d\r\n", length(v ""), v
      for (k = 1; k <= nf; k++) {
        v = count(i, k)
        printf "$%d\r\n%s\r\n$%d\r\n%d\r\n", length(f[k]), f[k], length(v ""), v
      }
    }
  }' | rc --pipe >/dev/null
}
fill_all() {
  fill agent_job_per_project hour "$hour" "$1" 3600
  fill assistant_per_org hour "$hour" "$1" 3600
  fill assistant_per_ip day "$day" "$2" 86400
  fill assistant_per_key month "$month" "$3" 0
}
mem() { rc info memory | awk -F: '/^used_memory:/ {print $2+0}'; }

gport=$(free_port)
aport=$(free_port)
cat >"$work/gateway.yaml" <<EOF
listen: 127.0.0.1:$gport
admin_listen: 127.0.0.1:$aport
upstream: {url: "http://127.0.0.1:9"}
redis: {addrs: ["127.0.0.1:$rport"]}
EOF
"$work/gateway" -config "$work/gateway.yaml" >"$work/gateway.log" 2>&1 &
gw=$!
pids+=("$gw")
until curl -sf "http://127.0.0.1:$aport/healthz" >/dev/null; do sleep 0.1; done

hwm() { awk '/VmHWM/ {print $2 / 1024 " MiB"}' "/proc/$gw/status"; }
timed() { # URL -> seconds (median of RUNS), with the longest Redis command meanwhile
  rc config set slowlog-log-slower-than 0 >/dev/null
  rc config set slowlog-max-len 1000000 >/dev/null
  rc slowlog reset >/dev/null
  local ts=()
  for ((r = 0; r < RUNS; r++)); do
    ts+=("$(curl -s -o "$work/out" -w '%{time_total}' "$1")")
  done
  local worst
  worst=$(python3 - "$rport" <<'EOF'
import socket, sys
f = socket.create_connection(("127.0.0.1", int(sys.argv[1]))).makefile("rwb")
f.write(b"SLOWLOG GET 1000000\r\n"); f.flush()
def read():
    line = f.readline(); t, rest = line[:1], line[1:-2]
    if t == b"*":
        return [read() for _ in range(int(rest))]
    if t == b"$":
        return f.read(int(rest) + 2)[:-2]
    return int(rest) if t == b":" else rest
entries = [e for e in read() if e[3][0].lower() != b"slowlog"]
us, cmd = max(((e[2], e[3][0].decode()) for e in entries), default=(0, "-"))
print(us, "µs (" + cmd + ")")
EOF
)
  rc config set slowlog-log-slower-than 10000 >/dev/null # the default again: the log holds memory
  rc slowlog reset >/dev/null
  printf '%s s (runs: %s), longest Redis command %s' "$(printf '%s\n' "${ts[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}')" "${ts[*]}" "$worst"
}

echo "tenants per limit: $TENANTS (4 limits: $((4 * TENANTS)) keys)"
fill_all 0 0 0
m0=$(mem)
echo "no history:      /usage/top $(timed "http://127.0.0.1:$aport/usage/top?limit=agent_job_per_project")"
fill_all 48 35 13
m1=$(mem)
echo "Redis memory: $(( (m1 - m0) / (4 * TENANTS) )) bytes more per tenant for $(( (48 + 48 + 35 + 13) / 4 )) kept windows on average: $(awk -v a="$m0" -v b="$m1" -v n="$TENANTS" 'BEGIN {printf "%.1f", (b - a) / (n * (48 + 48 + 35 + 13))}') bytes per tenant and kept window"
echo "default history: /usage/top $(timed "http://127.0.0.1:$aport/usage/top?limit=agent_job_per_project")"
echo "gateway peak RSS before the exports: $(hwm)"
echo "export (CSV):    $(timed "http://127.0.0.1:$aport/usage/export?limit=agent_job_per_project&window=previous")"
echo "  rows: $(($(wc -l <"$work/out") - 1)), bytes: $(wc -c <"$work/out")"
echo "export (JSON):   $(timed "http://127.0.0.1:$aport/usage/export?limit=agent_job_per_project&window=previous&format=json")"
echo "gateway peak RSS after the exports: $(hwm)"

# At the largest history accepted: the same tenants without and with it, each count size on a
# limit of its own (the keys of the limits above left as they are).
for counts in requests tokens; do
  name="history_max_$counts"
  m0=$(mem)
  fill "$name" hour "$hour" 0 3600 "$counts" "$MAX_TENANTS"
  m1=$(mem)
  fill "$name" hour "$hour" "$max_history" 3600 "$counts" "$MAX_TENANTS"
  m2=$(mem)
  key="gw:$name:{tenant000000}"
  echo "history $max_history (the most accepted), ${counts%s}-sized counts, $MAX_TENANTS tenants: $(awk -v a="$m1" -v b="$m2" -v n="$MAX_TENANTS" -v k="$max_history" 'BEGIN {printf "%.1f", (b - a) / (n * k)}') bytes per tenant and kept window ($(( (m1 - m0) / MAX_TENANTS )) bytes per tenant without history; one tenant's hash: $(rc object encoding "$key"), MEMORY USAGE $(rc memory usage "$key" samples 0) bytes)"
done
