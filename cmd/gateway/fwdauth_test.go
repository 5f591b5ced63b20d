package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/docsgate/gateway/internal/redistest"
)

// The forward-auth door against the built binary, with the real nginx (auth_request) and the
// real Caddy (its forward_auth, written out) of Debian's packages in front of upstream-sim:
// two gateway replicas share one Redis (registry mode, keys with scopes); nginx asks replica A,
// Caddy replica B. Every answer through nginx and Caddy must be the public listener's own:
// status, error body, rate-limit headers and Retry-After; and one project's requests are one
// count whichever door they came through.

const (
	fwdToken     = "forward-auth-admin-token-0123456"
	fwdKey       = "svc_forwardAuthStatusKey0123456789abcd"
	fwdOtherKey  = "svc_forwardAuthJobOnlyKey0123456789abc"
	fwdAssistant = "svc_dsc_forwardAuthAssistantKey012345"
	fwdLimit     = 20
)

// fwdConfig is the replicas' config: job_status, a pass-through route on the simulator's job
// status, applies job_status_per_project (20 an hour); the door listens on fwdListen.
func fwdConfig(upURL, redisAddr, fwdListen string) string {
	return fmt.Sprintf(`upstream: {url: %q}
admin_token: %q
auth: {mode: registry}
# Exact counts under -race on a busy machine: see docs/contributing.md.
redis: {addrs: [%q], timeout: 2s}
forward_auth: {listen: %q}
`, upURL, fwdToken, redisAddr, fwdListen) + jobStatusRoute(fwdLimit)
}

// jobStatusRoute is job_status, a pass-through route on the simulator's job status (which
// forward auth can serve: no body checks), applying job_status_per_project, limit an hour.
func jobStatusRoute(limit int) string {
	return fmt.Sprintf(`routes:
  - name: job_status
    method: GET
    path: /v2/agent/{projectId}/job/{jobId}
    key: admin
    limits: [job_status_per_project]
limits:
  job_status_per_project: {limit: %d, window: hour, by: project}
`, limit)
}

// need finds a program the test runs; without it the test is skipped, except in CI, where
// scripts/test-deps.sh installs it.
func need(t *testing.T, name, pkg string) string {
	t.Helper()
	for _, dir := range []string{"", "/usr/sbin/", "/usr/bin/"} {
		if p, err := exec.LookPath(dir + name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s not found: scripts/test-deps.sh installs it (apt-get install %s)", name, pkg)
	}
	t.Skipf("%s not found: install it with `apt-get install %s` (or run `make test`, which does)", name, pkg)
	return ""
}

// startDaemon starts a proxy in front of the test, stopped by PID at cleanup, and waits until
// addr answers.
func startDaemon(t *testing.T, name, addr string, cmd *exec.Cmd) {
	t.Helper()
	out := newSyncBuffer()
	cmd.Stdout, cmd.Stderr = out, out
	cmd.WaitDelay = 5 * time.Second // a child left holding the output cannot hold the test
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		// SIGTERM first: nginx's master then stops its worker, which SIGKILL would orphan.
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("%s output:\n%s", name, out.String())
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		res, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			res.Body.Close()
			return
		}
		select {
		case <-done:
			t.Fatalf("%s exited:\n%s", name, out.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not up: %v\n%s", name, err, out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// nginxConfig is docs/forward-auth.md's nginx config on the test's ports.
func nginxConfig(dir, listen, authAddr, upstream string) string {
	return fmt.Sprintf(`pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
worker_processes 1;
events { worker_connections 256; }
http {
  access_log off;
  client_body_temp_path %[1]s/body;
  proxy_temp_path %[1]s/proxy;
  fastcgi_temp_path %[1]s/fastcgi;
  uwsgi_temp_path %[1]s/uwsgi;
  scgi_temp_path %[1]s/scgi;
%[5]s
  server {
    listen %[2]s;
    location = /healthz { return 200; }
    location / {
      auth_request /_gw_auth;
      include %[1]s/gateway-auth-answer.conf;
      proxy_set_header X-Gateway-Org $gw_org;
      proxy_set_header X-Gateway-Plan $gw_plan;
      proxy_pass %[4]s;
    }
%[6]s
  }
}
`, dir, listen, authAddr, upstream, nginxUpstreamBlock(authAddr), nginxAuthLocations)
}

func nginxUpstreamBlock(authAddr string) string {
	return fmt.Sprintf(`  upstream gw_auth {
    server %s;
    keepalive 16;
  }`, authAddr)
}

// nginxAuthAnswer is what every location that asks the gateway includes: the answer's headers
// kept (auth_request_set), given to the client, and each refusal answered as the gateway did.
const nginxAuthAnswer = `auth_request_set $gw_status $upstream_status;
auth_request_set $gw_error $upstream_http_x_gateway_error;
auth_request_set $gw_org $upstream_http_x_gateway_org;
auth_request_set $gw_plan $upstream_http_x_gateway_plan;
auth_request_set $gw_ratelimit $upstream_http_ratelimit;
auth_request_set $gw_ratelimit_policy $upstream_http_ratelimit_policy;
auth_request_set $gw_ratelimit_limit $upstream_http_ratelimit_limit;
auth_request_set $gw_ratelimit_remaining $upstream_http_ratelimit_remaining;
auth_request_set $gw_ratelimit_reset $upstream_http_ratelimit_reset;
auth_request_set $gw_retry_after $upstream_http_retry_after;
auth_request_set $gw_allow $upstream_http_allow;
add_header RateLimit $gw_ratelimit always;
add_header RateLimit-Policy $gw_ratelimit_policy always;
add_header RateLimit-Limit $gw_ratelimit_limit always;
add_header RateLimit-Remaining $gw_ratelimit_remaining always;
add_header RateLimit-Reset $gw_ratelimit_reset always;
# auth_request passes 401 and 403 on and turns any other refusal into 500.
error_page 401 403 500 = @gw_refused;
`

// nginxAuthLocations are the subrequest to the gateway and the refusals' answer.
const nginxAuthLocations = `    location = /_gw_auth {
      internal;
      proxy_pass http://gw_auth/auth;
      proxy_pass_request_body off;
      proxy_set_header Content-Length "";
      proxy_set_header X-Original-URI $request_uri;
      proxy_set_header X-Original-Method $request_method;
      proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
    location @gw_refused {
      default_type "application/json; charset=utf-8";
      add_header RateLimit $gw_ratelimit always;
      add_header RateLimit-Policy $gw_ratelimit_policy always;
      add_header RateLimit-Limit $gw_ratelimit_limit always;
      add_header RateLimit-Remaining $gw_ratelimit_remaining always;
      add_header RateLimit-Reset $gw_ratelimit_reset always;
      add_header Retry-After $gw_retry_after always;
      add_header Allow $gw_allow always;
      add_header Cache-Control no-store always;
      if ($gw_status = 400) { return 400 "$gw_error\n"; }
      if ($gw_status = 401) { return 401 "$gw_error\n"; }
      if ($gw_status = 403) { return 403 "$gw_error\n"; }
      if ($gw_status = 404) { return 404 "$gw_error\n"; }
      if ($gw_status = 405) { return 405 "$gw_error\n"; }
      if ($gw_status = 429) { return 429 "$gw_error\n"; }
      if ($gw_status = 503) { return 503 "$gw_error\n"; }
      return 503 "{\"error\":\"Key checks are temporarily unavailable. Please retry in a moment.\",\"code\":\"auth_unavailable\"}\n";
    }
`

// caddyConfig is docs/forward-auth.md's Caddyfile on the test's ports: forward_auth as Caddy
// expands it, with the rate-limit headers also given to the client.
func caddyConfig(listen, authAddr, upstream string) string {
	return fmt.Sprintf(`{
	admin off
	auto_https off
}
http://%s {
	handle /healthz {
		respond 200
	}
	handle {
		reverse_proxy %s {
			method GET
			rewrite /auth
			header_up X-Forwarded-Method {method}
			header_up X-Forwarded-Uri {uri}
			@allowed status 2xx
			handle_response @allowed {
				request_header X-Gateway-Org {rp.header.X-Gateway-Org}
				request_header X-Gateway-Plan {rp.header.X-Gateway-Plan}
				header RateLimit {rp.header.Ratelimit}
				header RateLimit-Policy {rp.header.Ratelimit-Policy}
				header RateLimit-Limit {rp.header.Ratelimit-Limit}
				header RateLimit-Remaining {rp.header.Ratelimit-Remaining}
				header RateLimit-Reset {rp.header.Ratelimit-Reset}
				reverse_proxy %s
			}
		}
	}
}
`, listen, authAddr, strings.TrimPrefix(upstream, "http://"))
}

// fwdAnswer is what a door answered, as the comparison reads it.
type fwdAnswer struct {
	status int
	body   string
	hdr    http.Header
}

func fwdGet(t *testing.T, base, path, key string) fwdAnswer {
	t.Helper()
	req, err := http.NewRequest("GET", base+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	return fwdDo(t, http.DefaultClient, req)
}

// fwdDo sends req over client and reads the answer.
func fwdDo(t *testing.T, client *http.Client, req *http.Request) fwdAnswer {
	t.Helper()
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fwdAnswer{status: res.StatusCode, body: string(b), hdr: res.Header}
}

func TestForwardAuthDoors(t *testing.T) {
	nginxBin := need(t, "nginx", "nginx")
	caddyBin := need(t, "caddy", "caddy")
	rdb := redistest.Start(t)
	up := startSimulator(t)
	addrs := freeAddrs(t, 4) // the two replicas' doors, nginx, Caddy
	gwA := startGatewayRaw(t, fwdConfig(up, rdb.Addr, addrs[0]))
	gwB := startGatewayRaw(t, fwdConfig(up, rdb.Addr, addrs[1]))
	for _, k := range []string{ // registered on A, found by B in Redis
		`{"key":"` + fwdKey + `","kind":"admin","org":"acme","projects":["alpha","beta"]}`,
		`{"key":"` + fwdOtherKey + `","kind":"admin","org":"acme","projects":["alpha","beta"],"scopes":["agent_job"]}`,
		`{"key":"` + fwdAssistant + `","kind":"assistant","org":"acme","domains":["acme-docs"]}`,
	} {
		a := adminCall(t, http.DefaultClient, "http://"+gwA.admin, "POST", "/keys",
			map[string]string{"Authorization": "Bearer " + fwdToken, "Content-Type": "application/json"}, k)
		if a.status != 201 {
			t.Fatalf("POST /keys: %d %s", a.status, a.body)
		}
	}

	dir := t.TempDir()
	for _, f := range []struct{ name, body string }{
		{"gateway-auth-answer.conf", nginxAuthAnswer},
		{"nginx.conf", nginxConfig(dir, addrs[2], addrs[0], up)},
		{"Caddyfile", caddyConfig(addrs[3], addrs[1], up)},
	} {
		if err := os.WriteFile(filepath.Join(dir, f.name), []byte(f.body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	startDaemon(t, "nginx", addrs[2], exec.Command(nginxBin, "-p", dir, "-c", filepath.Join(dir, "nginx.conf"), "-g", "daemon off;"))
	caddy := exec.Command(caddyBin, "run", "--config", filepath.Join(dir, "Caddyfile"), "--adapter", "caddyfile")
	caddy.Env = append(os.Environ(), "HOME="+dir, "XDG_DATA_HOME="+dir, "XDG_CONFIG_HOME="+dir)
	startDaemon(t, "caddy", addrs[3], caddy)

	doors := []struct{ name, base string }{
		{"proxy A", "http://" + gwA.public}, {"proxy B", "http://" + gwB.public},
		{"nginx (A)", "http://" + addrs[2]}, {"caddy (B)", "http://" + addrs[3]},
	}
	// Refusals: the same answer through every door, and none counts.
	for _, c := range []struct{ name, path, key string }{
		{"missing key", "/v2/agent/alpha/job/j1", ""},
		{"unknown key", "/v2/agent/alpha/job/j1", "svc_forwardAuthUnknownKey0123456789abc"},
		{"wrong key family", "/v2/agent/alpha/job/j1", fwdAssistant},
		{"out of scope", "/v2/agent/alpha/job/j1", fwdOtherKey},
		{"project not granted", "/v2/agent/gamma/job/j1", fwdKey},
		{"no route", "/v2/nothing/here", fwdKey},
	} {
		ref := fwdGet(t, doors[0].base, c.path, c.key)
		if ref.status < 400 || !strings.Contains(ref.body, `"code"`) {
			t.Fatalf("%s: the public listener answered %d %s", c.name, ref.status, ref.body)
		}
		for _, d := range doors[1:] {
			sameAnswer(t, c.name+" through "+d.name, ref, fwdGet(t, d.base, c.path, c.key))
		}
	}
	// An admitted request: the upstream's answer, and the rate-limit headers one count apart.
	ref := fwdGet(t, doors[0].base, "/v2/agent/alpha/job/j1", fwdKey)
	for i, d := range doors {
		got := ref
		if i > 0 {
			got = fwdGet(t, d.base, "/v2/agent/alpha/job/j1", fwdKey)
		}
		want := strconv.Itoa(fwdLimit - 1 - i)
		if got.status != ref.status || got.body != ref.body || got.hdr.Get("RateLimit-Remaining") != want ||
			got.hdr.Get("RateLimit-Limit") != strconv.Itoa(fwdLimit) || got.hdr.Get("RateLimit-Policy") != ref.hdr.Get("RateLimit-Policy") ||
			!strings.HasPrefix(got.hdr.Get("RateLimit"), `"job_status_per_project";r=`+want+";t=") {
			t.Fatalf("admitted through %s: %d %q, headers %v; want %d %q, remaining %s, as the public listener's %v",
				d.name, got.status, got.body, got.hdr, ref.status, ref.body, want, ref.hdr)
		}
	}
	// One project's count, exact whichever door: 60 requests, 12 at a time, the doors taking
	// turns; exactly 20 admitted, each remaining from 19 to 0 seen once.
	type result struct {
		door int
		a    fwdAnswer
	}
	results := make(chan result, 3*fwdLimit)
	sem := make(chan struct{}, 12)
	for i := range 3 * fwdLimit {
		sem <- struct{}{}
		go func() {
			defer func() { <-sem }()
			d := i % len(doors)
			results <- result{d, fwdGet(t, doors[d].base, "/v2/agent/beta/job/j1", fwdKey)}
		}()
	}
	seen := map[string]int{}
	refused := map[int]fwdAnswer{}
	for range 3 * fwdLimit {
		r := <-results
		if r.a.status == http.StatusTooManyRequests {
			refused[r.door] = r.a
			continue
		}
		seen[r.a.hdr.Get("RateLimit-Remaining")]++
	}
	for n := range fwdLimit {
		if seen[strconv.Itoa(n)] != 1 {
			t.Fatalf("admitted answers by remaining: %v; want each of 0..%d once", seen, fwdLimit-1)
		}
	}
	if len(seen) != fwdLimit {
		t.Fatalf("admitted answers by remaining: %v; want exactly %d", seen, fwdLimit)
	}
	if len(refused) != len(doors) {
		t.Fatalf("429s came through %d doors; want all %d", len(refused), len(doors))
	}
	for d := 1; d < len(doors); d++ {
		sameAnswer(t, "429 through "+doors[d].name, refused[0], refused[d])
	}
	if ra := refused[0].hdr.Get("Retry-After"); ra == "" || !strings.Contains(refused[0].body, `"rate_limited"`) {
		t.Fatalf("the public listener's 429: Retry-After %q, %s", ra, refused[0].body)
	}
}

// sameAnswer fails the test unless got is ref's answer: status, content type, error body,
// rate-limit headers and Retry-After (a second apart at most, and the body's retry_after with
// it: the two were answered at different times).
func sameAnswer(t *testing.T, what string, ref, got fwdAnswer) {
	t.Helper()
	bad := got.status != ref.status || got.hdr.Get("Content-Type") != ref.hdr.Get("Content-Type")
	if got.body != ref.body {
		var rb, gb apierrorBody
		if json.Unmarshal([]byte(ref.body), &rb) != nil || json.Unmarshal([]byte(got.body), &gb) != nil ||
			rb.Code != gb.Code || rb.Limit != gb.Limit || rb.RetryAfter == nil || gb.RetryAfter == nil || absDiff(*rb.RetryAfter, *gb.RetryAfter) > 1 {
			bad = true
		}
	}
	for _, h := range []string{"RateLimit", "RateLimit-Policy", "RateLimit-Limit", "RateLimit-Remaining"} {
		bad = bad || got.hdr.Get(h) != ref.hdr.Get(h)
	}
	for _, h := range []string{"Retry-After", "RateLimit-Reset"} {
		r, g := ref.hdr.Get(h), got.hdr.Get(h)
		ri, rerr := strconv.ParseInt(r, 10, 64)
		gi, gerr := strconv.ParseInt(g, 10, 64)
		bad = bad || (r == "") != (g == "") || r != "" && (rerr != nil || gerr != nil || absDiff(ri, gi) > 1)
	}
	if bad {
		t.Errorf("%s: %d %q %v; want the public listener's %d %q %v", what, got.status, got.body, got.hdr, ref.status, ref.body, ref.hdr)
	}
}

// apierrorBody is the error body's shape as a client reads it.
type apierrorBody struct {
	Error      string `json:"error"`
	Code       string `json:"code"`
	Limit      string `json:"limit"`
	RetryAfter *int64 `json:"retry_after"`
}

func absDiff(a, b int64) int64 {
	if a > b {
		return a - b
	}
	return b - a
}
