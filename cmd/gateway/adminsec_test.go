package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/internal/browsertest"
)

// The admin listener attacked as an attacker would, against the built binary: cross-site
// writes from a browser holding the operator's credentials, writes without a token, foreign
// Host names, guessing the token, and the audit trail.

type adminAnswer struct {
	status int
	code   string
	header http.Header
	body   string
}

// adminCall sends one request to the admin listener of p (over client, HTTP unless base says
// otherwise) with the given headers ("Host" sets the Host line).
func adminCall(t *testing.T, client *http.Client, base, method, path string, hdr map[string]string, body string) adminAnswer {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, base+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	res, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	var m struct {
		Code string `json:"code"`
	}
	_ = json.Unmarshal(data, &m)
	return adminAnswer{res.StatusCode, m.Code, res.Header, string(data)}
}

// waitAudit waits until the gateway has logged n audit lines (a line follows its answer).
func waitAudit(t *testing.T, p *proc, n int) []map[string]any {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		lines := auditLines(p)
		if len(lines) >= n {
			return lines
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d audit lines, want %d:\n%s", len(lines), n, p.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// auditLines are the gateway's "admin write" log lines.
func auditLines(p *proc) []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(p.out.String(), "\n") {
		var m map[string]any
		if json.Unmarshal([]byte(line), &m) == nil && m["msg"] == "admin write" {
			out = append(out, m)
		}
	}
	return out
}

func listKeys(t *testing.T, p *proc, token string) map[string]auth.Entry {
	t.Helper()
	a := adminCall(t, http.DefaultClient, "http://"+p.admin, "GET", "/keys", map[string]string{"Authorization": "Bearer " + token}, "")
	if a.status != 200 {
		t.Fatalf("GET /keys: %d %s", a.status, a.body)
	}
	var out struct {
		Keys []auth.Entry `json:"keys"`
	}
	if err := json.Unmarshal([]byte(a.body), &out); err != nil {
		t.Fatal(err)
	}
	m := map[string]auth.Entry{}
	for _, e := range out.Keys {
		m[e.Digest] = e
	}
	return m
}

// The attack of the issue, in real Chromium: the operator signs in to the usage page with
// Basic auth; then, in the same browser, a page of another origin (another loopback address)
// submits text/plain forms to POST /keys and POST /reload and runs no-cors fetches to both.
// The gateway receives every one of them (the audit lines prove it) and refuses each: nothing
// is registered, nothing reloaded, and the attacker's key is refused on the public listener.
func TestAdminCSRFInChromium(t *testing.T) {
	t.Parallel()
	browser := browsertest.Start(t)
	upURL, upstreamCalls := recordingUpstream(t)
	keysFile := filepath.Join(t.TempDir(), "keys.yaml")
	const token = "csrf-admin-token-0123456789"
	p := startGateway(t, upURL, fmt.Sprintf("admin_token: %q\nauth: {mode: registry, keys_file: %q}\n", token, keysFile))
	adminURL := "http://" + p.admin

	creds := &browsertest.Credentials{User: "operator", Password: token}
	ui := browser.Open(t, adminURL+"/ui/", creds)
	if ui.AuthPrompts() == 0 {
		t.Fatal("the operator was never asked to sign in")
	}
	if title := ui.Text(t, "h1"); title == "" {
		t.Fatal("the usage page did not render")
	}

	const attackerKey = "svc_attackerKey0123456789abcdefghij"
	payload := `{"key":"` + attackerKey + `","kind":"admin","org":"victim","projects":["victim"],"label":"`
	form := func(target string) string {
		// A text/plain form: name + "=" + value, so the body is the JSON above ending in "=" + `"}`.
		return `<!doctype html><html><body><form id="f" method="POST" enctype="text/plain" action="` + adminURL + target + `">` +
			`<input type="hidden" name='` + payload + `' value='"}'></form>` +
			`<script>document.getElementById("f").submit()</script></body></html>`
	}
	fetchPage := `<!doctype html><html><body><script>
Promise.allSettled([
  fetch("` + adminURL + `/keys", {method: "POST", mode: "no-cors", credentials: "include", body: '` + payload + `x"}'}),
  fetch("` + adminURL + `/reload", {method: "POST", mode: "no-cors", credentials: "include"}),
]).then(() => { document.title = "sent" });
</script></body></html>`
	pages := map[string]string{"/form-keys": form("/keys"), "/form-reload": form("/reload"), "/fetch": fetchPage}
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Fatal(err)
	}
	attacker := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprint(w, pages[r.URL.Path])
	})}
	go attacker.Serve(ln)
	t.Cleanup(func() { attacker.Close() })
	attackerURL := "http://" + ln.Addr().String()

	// Each attack page is opened in the same browser, which holds the operator's credentials
	// and would hand them over if asked (creds answers every challenge).
	shot := browser.Open(t, attackerURL+"/form-keys", creds)
	waitAudit(t, p, 1)
	// What the operator's browser shows after the forged form: the gateway's refusal.
	shotFile := filepath.Join(t.TempDir(), "csrf-refused.png")
	if dir := os.Getenv("SCREENSHOT_DIR"); dir != "" {
		shotFile = filepath.Join(dir, "csrf-refused.png")
	}
	shot.Screenshot(t, shotFile)
	browser.Open(t, attackerURL+"/form-reload", creds)
	waitAudit(t, p, 2)
	fetched := browser.Open(t, attackerURL+"/fetch", creds)
	fetched.WaitFor(t, `document.title === "sent"`, 15*time.Second)
	waitAudit(t, p, 4)

	actions := map[string]int{}
	for _, l := range auditLines(p) {
		if l["result"] != "cross_origin_refused" || l["status"] != float64(403) {
			t.Errorf("an attack request was not refused as cross-origin: %v", l)
		}
		actions[l["action"].(string)]++
	}
	if actions["keys.add"] != 2 || actions["reload"] != 2 {
		t.Fatalf("audited actions %v, want 2 keys.add and 2 reload", actions)
	}
	if keys := listKeys(t, p, token); len(keys) != 0 {
		t.Fatalf("the attack registered keys: %v", keys)
	}
	if data, err := os.ReadFile(keysFile); err == nil && strings.Contains(string(data), "victim") {
		t.Fatalf("the attack reached the keys file:\n%s", data)
	}
	if strings.Contains(p.out.String(), "config reloaded") {
		t.Fatal("the attack reloaded the config")
	}
	if r := send(t, p, "POST", "/v2/agent/victim/job", attackerKey, `{"prompt":"x"}`); r.StatusCode != 401 {
		t.Fatalf("the attacker's key on the public listener: %d, want 401", r.StatusCode)
	}
	if upstreamCalls() != 0 {
		t.Fatal("the attacker's request reached the upstream")
	}
	// The operator's page still works after all this, without a console error.
	ui.Run(t)
	if errs := ui.Errors(); len(errs) > 0 {
		t.Fatalf("console errors on the usage page: %v", errs)
	}
}

// Every write endpoint × {cross-site browser, same-origin browser, no browser headers} ×
// {JSON, text/plain, form, none} against the binary; then the gateway keys CLI, which works
// on the same keys file beside the running gateway, and the page's headers.
func TestAdminWriteRulesAgainstBinary(t *testing.T) {
	t.Parallel()
	upURL, _ := recordingUpstream(t)
	keysFile := filepath.Join(t.TempDir(), "keys.yaml")
	const token = "rules-admin-token-0123456789"
	p := startGateway(t, upURL, fmt.Sprintf("admin_token: %q\nauth: {mode: registry, keys_file: %q}\n", token, keysFile))
	base := "http://" + p.admin
	bearer := "Bearer " + token
	n := 0
	newDigest := func() string {
		n++
		return auth.Digest(fmt.Sprintf("svc_matrix%04d0123456789abcdefghijk", n))
	}
	register := func(d string) {
		a := adminCall(t, http.DefaultClient, base, "POST", "/keys", map[string]string{"Authorization": bearer, "Content-Type": "application/json"},
			`{"digest":"`+d+`","kind":"admin","org":"acme","projects":["p1"]}`)
		if a.status != 201 {
			t.Fatalf("register %s: %d %s", d, a.status, a.body)
		}
	}
	contexts := []struct {
		name  string
		hdr   map[string]string
		cross bool
	}{
		{"cross-site browser", map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "http://127.0.0.2:8000"}, true},
		{"same-origin browser", map[string]string{"Sec-Fetch-Site": "same-origin", "Origin": base}, false},
		{"no browser headers", map[string]string{}, false},
	}
	bodies := []struct{ name, ctype string }{
		{"JSON", "application/json"}, {"text/plain", "text/plain;charset=UTF-8"}, {"form", "application/x-www-form-urlencoded"}, {"none", ""},
	}
	reloads := 0
	for _, c := range contexts {
		for _, b := range bodies {
			// POST /keys: takes a JSON body.
			d := newDigest()
			h := map[string]string{"Authorization": bearer}
			for k, v := range c.hdr {
				h[k] = v
			}
			if b.ctype != "" {
				h["Content-Type"] = b.ctype
			}
			a := adminCall(t, http.DefaultClient, base, "POST", "/keys", h, `{"digest":"`+d+`","kind":"admin","org":"acme","projects":["p1"]}`)
			_, registered := listKeys(t, p, token)[d]
			switch {
			case c.cross:
				if a.status != 403 || a.code != "cross_origin_refused" || registered {
					t.Errorf("POST /keys, %s, %s: %d %s, registered %t", c.name, b.name, a.status, a.body, registered)
				}
			case b.name != "JSON":
				if a.status != 415 || a.code != "unsupported_media_type" || registered {
					t.Errorf("POST /keys, %s, %s: %d %s, registered %t", c.name, b.name, a.status, a.body, registered)
				}
			default:
				if a.status != 201 || !registered {
					t.Errorf("POST /keys, %s, %s: %d %s", c.name, b.name, a.status, a.body)
				}
			}

			// DELETE /keys/{digest}: no body.
			d = newDigest()
			register(d)
			a = adminCall(t, http.DefaultClient, base, "DELETE", "/keys/"+d, h, "")
			entry := listKeys(t, p, token)[d]
			revoked := !entry.Active()
			if c.cross && (a.status != 403 || a.code != "cross_origin_refused" || revoked) || !c.cross && (a.status != 200 || !revoked) {
				t.Errorf("DELETE /keys, %s, %s: %d %s, revoked %t", c.name, b.name, a.status, a.body, revoked)
			}

			// POST /reload: no body; a body sent anyway must be JSON.
			for _, body := range []string{"", `{"x":"=y"}`} {
				a = adminCall(t, http.DefaultClient, base, "POST", "/reload", h, body)
				want, code := 200, ""
				switch {
				case c.cross:
					want, code = 403, "cross_origin_refused"
				case body != "" && b.name != "JSON":
					want, code = 415, "unsupported_media_type"
				}
				if want == 200 {
					reloads++
				}
				if a.status != want || a.code != code {
					t.Errorf("POST /reload, %s, %s, body %q: %d %s, want %d %s", c.name, b.name, body, a.status, a.body, want, code)
				}
			}
		}
	}
	if got := strings.Count(p.out.String(), "config reloaded"); got != reloads {
		t.Errorf("%d reloads happened, want %d", got, reloads)
	}

	// The CLI still works beside the running gateway, on the same file.
	cfg := p.cmd.Args[2]
	const cliKey = "svc_cliBesideGateway0123456789abcdef"
	code, out, errOut := keysRun(t, cliKey+"\n", "add", "-config", cfg, "--kind", "admin", "--org", "acme", "--project", "p1")
	if code != 0 || strings.TrimSpace(out) != auth.Digest(cliKey) {
		t.Fatalf("gateway keys add: %d %q %q", code, out, errOut)
	}
	if a := adminCall(t, http.DefaultClient, base, "POST", "/reload", map[string]string{"Authorization": bearer}, ""); a.status != 200 {
		t.Fatalf("reload: %d %s", a.status, a.body)
	}
	if r := send(t, p, "POST", "/v2/agent/p1/job", cliKey, `{"prompt":"x"}`); r.StatusCode != 201 {
		t.Fatalf("key added by the CLI: %d", r.StatusCode)
	}

	// The page keeps its strict headers; tenant data is never cached; no CORS anywhere.
	ui := adminCall(t, http.DefaultClient, base, "GET", "/ui/", map[string]string{"Authorization": bearer}, "")
	csp := ui.header.Get("Content-Security-Policy")
	if ui.status != 200 || !strings.Contains(csp, "frame-ancestors 'none'") || !strings.Contains(csp, "default-src 'none'") ||
		ui.header.Get("X-Content-Type-Options") != "nosniff" || ui.header.Get("Referrer-Policy") != "no-referrer" || ui.header.Get("Cache-Control") != "no-store" {
		t.Fatalf("usage page headers: %d %v", ui.status, ui.header)
	}
	for _, path := range []string{"/usage/top", "/keys", "/usage/projects/p1"} {
		a := adminCall(t, http.DefaultClient, base, "GET", path, map[string]string{"Authorization": bearer, "Origin": "http://127.0.0.2:8000"}, "")
		if a.status != 200 || a.header.Get("Cache-Control") != "no-store" || a.header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("GET %s: %d %v", path, a.status, a.header)
		}
		for k := range a.header {
			if strings.HasPrefix(strings.ToLower(k), "access-control-") {
				t.Errorf("GET %s answered with %s", path, k)
			}
		}
	}
}

// Without admin_token, every write endpoint answers 403 admin_token_required and changes
// nothing, while metrics, probes and the read-only usage endpoints keep working; an admin
// listener that other hosts can reach logs one warning at start saying so.
func TestAdminWritesNeedToken(t *testing.T) {
	t.Parallel()
	upURL, _ := recordingUpstream(t)
	keysFile := filepath.Join(t.TempDir(), "keys.yaml")
	p := startGatewayWith(t, startOpts{adminHost: "0.0.0.0"}, fmt.Sprintf("upstream: {url: %q}\nauth: {mode: registry, keys_file: %q}\n", upURL, keysFile))
	base := "http://" + p.admin
	d := auth.Digest("svc_notoken0123456789abcdefghijklm")
	js := map[string]string{"Content-Type": "application/json"}
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/keys", `{"digest":"` + d + `","kind":"admin","org":"acme","projects":["*"]}`},
		{"DELETE", "/keys/" + d, ""},
		{"POST", "/reload", ""},
	} {
		if a := adminCall(t, http.DefaultClient, base, c.method, c.path, js, c.body); a.status != 403 || a.code != "admin_token_required" {
			t.Errorf("%s %s without admin_token: %d %s", c.method, c.path, a.status, a.body)
		}
	}
	if _, err := os.Stat(keysFile); err == nil {
		t.Fatal("a write without a token reached the keys file")
	}
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/metrics", ""}, {"GET", "/healthz", ""}, {"GET", "/readyz", ""}, {"GET", "/usage/top", ""},
		{"GET", "/usage/orgs/acme", ""}, {"POST", "/usage/key", `{"key":"svc_dsc_anykey"}`}, {"GET", "/keys", ""}, {"GET", "/ui/", ""},
	} {
		if a := adminCall(t, http.DefaultClient, base, c.method, c.path, js, c.body); a.status != 200 {
			t.Errorf("%s %s without admin_token: %d %s", c.method, c.path, a.status, a.body)
		}
	}
	var warnings []string
	for _, line := range strings.Split(p.out.String(), "\n") {
		if strings.Contains(line, `"level":"warn"`) && strings.Contains(line, "admin_token is empty") {
			warnings = append(warnings, line)
		}
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], "0.0.0.0:") || !strings.Contains(warnings[0], "/metrics") || !strings.Contains(warnings[0], "admin_token_required") {
		t.Fatalf("want one warning saying who can reach what, got %q", warnings)
	}
	// On loopback (the default) nobody else can reach it: no warning.
	q := startGateway(t, upURL, "")
	if strings.Contains(q.out.String(), "admin_token is empty") {
		t.Fatalf("warned about a loopback admin listener:\n%s", q.out.String())
	}
}

// A DNS-rebinding page makes the browser send a Host of the attacker's: only IP literals,
// localhost and the names of admin_hosts are served; any other gets 421.
func TestAdminHostHeaderBinary(t *testing.T) {
	t.Parallel()
	upURL, _ := recordingUpstream(t)
	const token = "host-admin-token-0123456789"
	p := startGateway(t, upURL, fmt.Sprintf("admin_token: %q\nadmin_hosts: [gateway-admin.internal]\n", token))
	base := "http://" + p.admin
	_, port, _ := net.SplitHostPort(p.admin)
	bearer := map[string]string{"Authorization": "Bearer " + token, "Content-Type": "application/json"}
	for host, want := range map[string]int{
		"127.0.0.1:" + port:               200,
		"localhost:" + port:               200,
		"[::1]:" + port:                   200,
		"gateway-admin.internal:" + port:  200,
		"rebind.attacker.example:" + port: 421,
		"gateway-admin.internal.attacker": 421,
	} {
		for _, c := range []struct{ method, path string }{{"GET", "/metrics"}, {"GET", "/healthz"}, {"GET", "/readyz"}, {"POST", "/reload"}} {
			h := map[string]string{"Host": host}
			for k, v := range bearer {
				h[k] = v
			}
			a := adminCall(t, http.DefaultClient, base, c.method, c.path, h, "")
			if a.status != want || want == 421 && a.code != "misdirected_request" {
				t.Errorf("%s %s, Host %q: %d %s, want %d", c.method, c.path, host, a.status, a.body, want)
			}
		}
	}
}

// admin_tls serves the admin listener over HTTPS; the public tls applies to it when
// admin_tls is unset. Over HTTPS, thirty wrong tokens from the operator's own address (the
// default auth.failure_limit) spend that address's budget: the right token is still served,
// a write with it goes through, and only wrong tokens get 429 with Retry-After. Every write
// leaves an audit line naming its actor, never a key.
func TestAdminTLSAndGuessing(t *testing.T) {
	t.Parallel()
	upURL, _ := recordingUpstream(t)
	certFile, keyFile, pool := selfSigned(t)
	const token = "tls-admin-token-0123456789"
	o := startOpts{adminCAs: pool}
	for _, c := range []struct{ name, cfg string }{
		{"admin_tls", fmt.Sprintf("admin_tls: {cert_file: %q, key_file: %q}\n", certFile, keyFile)},
		{"tls follows", fmt.Sprintf("tls: {cert_file: %q, key_file: %q}\n", certFile, keyFile)},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := startGatewayWith(t, o, fmt.Sprintf("upstream: {url: %q}\nadmin_token: %q\n%s", upURL, token, c.cfg))
			client := o.adminClient()
			base := "https://" + p.admin
			// Plain HTTP gets no admin answer.
			if res, err := http.Get("http://" + p.admin + "/healthz"); err == nil {
				res.Body.Close()
				if res.StatusCode == 200 {
					t.Fatal("the admin listener answered plain HTTP")
				}
			}
			if a := adminCall(t, client, base, "GET", "/metrics", map[string]string{"Authorization": "Bearer " + token}, ""); a.status != 200 {
				t.Fatalf("GET /metrics over HTTPS: %d", a.status)
			}
			if c.name != "admin_tls" {
				return
			}
			// Requests without credentials do not count; 30 wrong tokens do.
			for range 40 {
				if a := adminCall(t, client, base, "GET", "/metrics", nil, ""); a.status != 401 {
					t.Fatalf("no credentials: %d", a.status)
				}
			}
			for i := range 30 {
				guess := fmt.Sprintf("guess-%d-%s", i, strings.Repeat("x", i))
				if a := adminCall(t, client, base, "GET", "/metrics", map[string]string{"Authorization": "Bearer " + guess}, ""); a.status != 401 {
					t.Fatalf("wrong token %d: %d", i, a.status)
				}
			}
			// The operator, from the same address, is served: a read and a write.
			if a := adminCall(t, client, base, "GET", "/metrics", map[string]string{"Authorization": "Bearer " + token}, ""); a.status != 200 {
				t.Fatalf("the right token after 30 wrong ones: %d %s, want 200", a.status, a.body)
			}
			if a := adminCall(t, client, base, "POST", "/reload", map[string]string{"Authorization": "Basic " + basicAuth("ops", token)}, ""); a.status != 200 {
				t.Fatalf("a reload with the right token after 30 wrong ones: %d %s, want 200", a.status, a.body)
			}
			// A wrong token from the spent address is throttled, Bearer and Basic alike.
			for _, h := range []string{"Bearer guess-31", "Basic " + basicAuth("ops", "guess-32")} {
				a := adminCall(t, client, base, "POST", "/reload", map[string]string{"Authorization": h}, "")
				if a.status != 429 || a.code != "too_many_auth_failures" || a.header.Get("Retry-After") == "" {
					t.Fatalf("a wrong token after the budget was spent: %d %s %v, want 429 too_many_auth_failures with Retry-After", a.status, a.body, a.header)
				}
			}
			if a := adminCall(t, client, base, "GET", "/metrics", map[string]string{"Authorization": "Bearer " + token}, ""); a.status != 200 {
				t.Fatalf("the right token after the 429s: %d", a.status)
			}
			if got := strings.Count(p.out.String(), "config reloaded"); got != 1 {
				t.Fatalf("%d reloads, want the operator's one", got)
			}
			waitAudit(t, p, 3)
			time.Sleep(100 * time.Millisecond) // and no more
			lines := auditLines(p)
			want := [][3]string{{"ops", "reload", "ok"}, {"token", "reload", "too_many_auth_failures"}, {"ops", "reload", "too_many_auth_failures"}}
			if len(lines) != len(want) {
				t.Fatalf("audit lines %v, want %v", lines, want)
			}
			for i, l := range lines {
				if l["actor"] != want[i][0] || l["action"] != want[i][1] || l["result"] != want[i][2] {
					t.Errorf("audit line %d: %v, want %v", i, l, want[i])
				}
			}
		})
	}
}

// The audit lines of real writes: the Basic-auth user or "token", the action, the digest (or
// the path), the result; never the key.
func TestAdminAuditLines(t *testing.T) {
	t.Parallel()
	upURL, _ := recordingUpstream(t)
	keysFile := filepath.Join(t.TempDir(), "keys.yaml")
	const token = "audit-admin-token-0123456789"
	p := startGateway(t, upURL, fmt.Sprintf("admin_token: %q\nauth: {mode: registry, keys_file: %q}\n", token, keysFile))
	base := "http://" + p.admin
	const key = "svc_auditedKey0123456789abcdefghijk"
	req, _ := http.NewRequest("GET", "/", nil)
	req.SetBasicAuth("alice", token)
	basic := map[string]string{"Authorization": req.Header.Get("Authorization"), "Content-Type": "application/json"}
	bearer := map[string]string{"Authorization": "Bearer " + token, "Content-Type": "application/json"}
	adminCall(t, http.DefaultClient, base, "POST", "/keys", basic, `{"key":"`+key+`","kind":"admin","org":"acme","projects":["p1"]}`)
	adminCall(t, http.DefaultClient, base, "DELETE", "/keys/"+auth.Digest(key), bearer, "")
	adminCall(t, http.DefaultClient, base, "POST", "/reload", bearer, "")
	adminCall(t, http.DefaultClient, base, "POST", "/keys", basic, `{"key":"svc_weak","kind":"admin","org":"acme","projects":["p1"]}`)
	want := []struct{ actor, action, target, result string }{
		{"alice", "keys.add", auth.Digest(key), "ok"},
		{"token", "keys.revoke", auth.Digest(key), "ok"},
		{"token", "reload", "/reload", "ok"},
		{"alice", "keys.add", "/keys", "invalid_request"},
	}
	waitAudit(t, p, len(want))
	time.Sleep(100 * time.Millisecond) // and no more
	lines := auditLines(p)
	if len(lines) != len(want) {
		t.Fatalf("%d audit lines, want %d:\n%s", len(lines), len(want), p.out.String())
	}
	for i, l := range lines {
		if l["level"] != "info" || l["actor"] != want[i].actor || l["action"] != want[i].action || l["target"] != want[i].target || l["result"] != want[i].result {
			t.Errorf("audit line %d: %v, want %+v", i, l, want[i])
		}
	}
	if strings.Contains(p.out.String(), "auditedKey") || strings.Contains(p.out.String(), "svc_weak") {
		t.Fatal("a key reached the log")
	}
}
