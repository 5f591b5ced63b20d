#!/usr/bin/env bash
# Installs what the test suite needs and is not a Go module: redis-server (the limiter tests
# run a real Redis and a real Redis Cluster on loopback ports), prometheus (promtool tests
# the alert rules, and deploy/ runs every dashboard query through a real Prometheus),
# chromium (the usage page and a cross-origin stream are opened in a real headless browser),
# the real AI SDK clients of aisdk-clients/ and Redocly's OpenAPI linter of openapi-lint/ (npm
# ci, from their package-lock.json). Installs packages through apt-get when run as root;
# otherwise says exactly what to install.
set -euo pipefail
cd "$(dirname "$0")/.."

# The npm projects (the AI SDK clients, the OpenAPI linter): npm ci in DIR when node_modules is
# missing or older than the lock file (the lock file's hash is kept beside the installed
# modules). Node and npm must be there.
install_npm_dir() {
  local dir=$1 stamp=$1/node_modules/.lock-sha256 want
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    echo "test-deps: node and npm are needed for $dir (Node 22 or later)" >&2
    return 1
  fi
  want=$(sha256sum "$dir/package-lock.json" | cut -d' ' -f1)
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    return 0
  fi
  echo "test-deps: npm ci in $dir" >&2
  (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
  echo "$want" >"$stamp"
}
install_npm_dir aisdk-clients
install_npm_dir openapi-lint

missing=()
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
  missing+=(prometheus)
fi
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
# The forward-auth tests put the real nginx (auth_request) and Caddy (forward_auth) in front.
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || missing+=(nginx)
command -v caddy >/dev/null 2>&1 || missing+=(caddy)

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "test-deps: installing ${missing[*]} with apt-get" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # Debian's packages may start a system Redis on 6379, a system Prometheus on 9090 and nginx
  # on 80; the tests start their own on free loopback ports and never depend on those.
  exit 0
fi
echo "test-deps: missing ${missing[*]}. Install with: sudo apt-get install -y ${missing[*]}" >&2
exit 1
