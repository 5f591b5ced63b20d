package admin

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/docsgate/gateway/auth"
)

const protectToken = "protect-test-token-0123456789"

// protected is an admin handler with keys and reload, a token, the admin_hosts given, and
// its audit lines observed.
func protected(t *testing.T, token string, failureLimit int, hosts ...string) (*httptest.Server, *auth.MemoryRegistry, *int, *observer.ObservedLogs) {
	t.Helper()
	reg, err := auth.NewMemoryRegistry(nil)
	if err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.InfoLevel)
	reloads := new(int)
	srv := httptest.NewServer(Handler(Options{
		Ready:        func() (bool, string) { return true, "ready" },
		Metrics:      http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("metrics")) }),
		Keys:         reg,
		Reload:       func() error { *reloads++; return nil },
		Token:        token,
		Hosts:        hosts,
		FailureLimit: failureLimit,
		Logger:       zap.New(core),
	}))
	t.Cleanup(srv.Close)
	return srv, reg, reloads, logs
}

type answer struct {
	status int
	code   string
	header http.Header
	body   string
}

func do(t *testing.T, srv *httptest.Server, method, path string, header map[string]string, body string) answer {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, srv.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	var m struct {
		Code string `json:"code"`
	}
	_ = json.Unmarshal(data, &m)
	return answer{res.StatusCode, m.Code, res.Header, string(data)}
}

// Only IP literals, localhost and the names of admin_hosts reach the listener: a DNS
// rebinding page names a host of its own.
func TestHostCheck(t *testing.T) {
	srv, _, _, _ := protected(t, protectToken, 0, "gateway-admin.example.com")
	bearer := "Bearer " + protectToken
	for host, want := range map[string]int{
		"127.0.0.1":                      200,
		"127.0.0.1:9090":                 200,
		"[::1]:9090":                     200,
		"10.1.2.3:9090":                  200,
		"localhost:9090":                 200,
		"LocalHost.":                     200,
		"gateway-admin.example.com":      200,
		"GATEWAY-ADMIN.example.com:443":  200,
		"attacker.example":               421,
		"attacker.example:9090":          421,
		"localhost.attacker.example":     421,
		"127.0.0.1.attacker.example":     421,
		"example.com":                    421,
		"gateway-admin.example.com.evil": 421,
	} {
		for _, path := range []string{"/metrics", "/healthz"} {
			a := do(t, srv, "GET", path, map[string]string{"Host": host, "Authorization": bearer}, "")
			if a.status != want || (want == 421 && a.code != "misdirected_request") {
				t.Errorf("GET %s Host %q: %d %s, want %d", path, host, a.status, a.body, want)
			}
		}
	}
}

// The write rules of every write endpoint: each combination of browser context and body type
// gets the answer a person would expect, and a refused request changes nothing.
func TestWriteMatrix(t *testing.T) {
	digest := auth.Digest("svc_matrixkey0123456789abcdefgh")
	jsonBody := `{"digest":"` + digest + `","kind":"admin","org":"acme","projects":["p1"]}`
	endpoints := []struct {
		method, path string
		body         string // the JSON body it takes ("" for none)
		ok           int
	}{
		{"POST", "/keys", jsonBody, 201},
		{"POST", "/reload", "", 200},
		{"DELETE", "/keys/" + digest, "", 200},
	}
	contexts := []struct {
		name  string
		hdr   map[string]string
		cross bool
	}{
		{"cross-site", map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "http://127.0.0.2:8000"}, true},
		{"same-site", map[string]string{"Sec-Fetch-Site": "same-site", "Origin": "http://127.0.0.1:8000"}, true},
		{"other origin, no Sec-Fetch-Site", map[string]string{"Origin": "http://attacker.example"}, true},
		{"null origin", map[string]string{"Origin": "null"}, true},
		{"same-origin", map[string]string{"Sec-Fetch-Site": "same-origin"}, false},
		{"typed by the user", map[string]string{"Sec-Fetch-Site": "none"}, false},
		{"same origin, no Sec-Fetch-Site", nil, false}, // Origin equal to the server's, set below
		{"no browser headers", map[string]string{}, false},
	}
	bodies := []struct{ name, ctype string }{
		{"json", "application/json; charset=utf-8"},
		{"text/plain", "text/plain"},
		{"form", "application/x-www-form-urlencoded"},
		{"none", ""},
	}
	for _, c := range contexts {
		for _, b := range bodies {
			for _, e := range endpoints {
				srv, reg, reloads, _ := protected(t, protectToken, 0)
				if e.method == "DELETE" {
					if err := reg.Add(t.Context(), auth.Entry{Digest: digest, Kind: "admin", Org: "acme", Projects: []string{"p1"}}); err != nil {
						t.Fatal(err)
					}
				}
				h := map[string]string{"Authorization": "Bearer " + protectToken}
				for k, v := range c.hdr {
					h[k] = v
				}
				if c.hdr == nil {
					h["Origin"] = srv.URL
				}
				if b.ctype != "" {
					h["Content-Type"] = b.ctype
				}
				before, _ := reg.List(t.Context())
				a := do(t, srv, e.method, e.path, h, e.body)

				want, code := e.ok, ""
				switch {
				case c.cross:
					want, code = 403, "cross_origin_refused"
				case b.name != "json" && e.body != "":
					want, code = 415, "unsupported_media_type"
				}
				if a.status != want || a.code != code {
					t.Errorf("%s %s, %s, %s body: %d %s, want %d %s", e.method, e.path, c.name, b.name, a.status, a.body, want, code)
				}
				for k := range a.header {
					if strings.HasPrefix(strings.ToLower(k), "access-control-") {
						t.Errorf("%s %s answered with a CORS header %s", e.method, e.path, k)
					}
				}
				if want >= 400 {
					after, _ := reg.List(t.Context())
					if len(after) != len(before) || *reloads != 0 || (len(after) == 1 && !after[0].Active()) {
						t.Errorf("%s %s, %s, %s body: refused, yet it changed something", e.method, e.path, c.name, b.name)
					}
				}
			}
		}
	}
}

// A body the endpoint does not take must still be JSON: text/plain or a form is what a page of
// another site can send without a preflight.
func TestBodilessWriteRefusesOtherBodies(t *testing.T) {
	srv, _, reloads, _ := protected(t, protectToken, 0)
	auth := "Bearer " + protectToken
	for ctype, want := range map[string]int{"text/plain": 415, "application/x-www-form-urlencoded": 415, "": 415, "application/json": 200} {
		a := do(t, srv, "POST", "/reload", map[string]string{"Authorization": auth, "Content-Type": ctype}, `{"x":"=y"}`)
		if a.status != want {
			t.Errorf("POST /reload with a %q body: %d %s, want %d", ctype, a.status, a.body, want)
		}
	}
	if *reloads != 1 {
		t.Fatalf("%d reloads, want 1", *reloads)
	}
}

// No answer of the admin listener carries a CORS header, preflights included.
func TestNoCORS(t *testing.T) {
	srv, _, _, _ := protected(t, protectToken, 0)
	for _, c := range []struct{ method, path string }{{"OPTIONS", "/keys"}, {"OPTIONS", "/reload"}, {"GET", "/metrics"}, {"OPTIONS", "/usage/key"}} {
		a := do(t, srv, c.method, c.path, map[string]string{
			"Origin": "http://attacker.example", "Access-Control-Request-Method": "POST",
			"Access-Control-Request-Headers": "authorization, content-type", "Authorization": "Bearer " + protectToken,
		}, "")
		for k := range a.header {
			if strings.HasPrefix(strings.ToLower(k), "access-control-") {
				t.Errorf("%s %s: %s: %v", c.method, c.path, k, a.header[k])
			}
		}
	}
}

// Wrong tokens count against the client's budget: past it the client's wrong tokens get 429
// until its minute ends, while the right token is always served (Bearer and Basic alike), so
// nobody sharing the operator's address can lock the operator out. Requests without
// credentials (a browser's first request) do not count.
func TestAdminFailureBudget(t *testing.T) {
	srv, _, reloads, _ := protected(t, protectToken, 3)
	for range 10 {
		if a := do(t, srv, "GET", "/metrics", nil, ""); a.status != 401 {
			t.Fatalf("no credentials: %d", a.status)
		}
	}
	if a := do(t, srv, "GET", "/metrics", map[string]string{"Authorization": "Bearer x"}, ""); a.status != 401 {
		t.Fatalf("requests without credentials spent the budget: %d", a.status)
	}
	for _, guess := range []string{protectToken[:len(protectToken)-1], protectToken + "x"} {
		if a := do(t, srv, "GET", "/metrics", map[string]string{"Authorization": "Bearer " + guess}, ""); a.status != 401 {
			t.Fatalf("guess %q: %d", guess, a.status)
		}
	}
	spent := func(what string, hdr map[string]string) {
		t.Helper()
		a := do(t, srv, "GET", "/metrics", hdr, "")
		if a.status != 429 || a.code != "too_many_auth_failures" || a.header.Get("Retry-After") == "" {
			t.Fatalf("%s after 3 wrong tokens: %d %s %v, want 429 too_many_auth_failures with Retry-After", what, a.status, a.body, a.header)
		}
	}
	spent("a wrong token", map[string]string{"Authorization": "Bearer guess"})
	spent("a wrong Basic password", map[string]string{"Authorization": "Basic " + basic("ops", "guess")})
	spent("no credentials", nil)
	for range 3 {
		if a := do(t, srv, "GET", "/metrics", map[string]string{"Authorization": "Bearer " + protectToken}, ""); a.status != 200 || a.body != "metrics" {
			t.Fatalf("the right token after the budget was spent: %d %s", a.status, a.body)
		}
		if a := do(t, srv, "GET", "/metrics", map[string]string{"Authorization": "Basic " + basic("ops", protectToken)}, ""); a.status != 200 {
			t.Fatalf("the right Basic password after the budget was spent: %d %s", a.status, a.body)
		}
	}
	if a := do(t, srv, "POST", "/reload", map[string]string{"Authorization": "Bearer " + protectToken}, ""); a.status != 200 || *reloads != 1 {
		t.Fatalf("a write with the right token after the budget was spent: %d %s, %d reloads", a.status, a.body, *reloads)
	}
	spent("a wrong token after the right one", map[string]string{"Authorization": "Bearer guess"})
	if a := do(t, srv, "GET", "/healthz", nil, ""); a.status != 200 {
		t.Fatalf("/healthz: %d", a.status)
	}
}

func basic(user, pass string) string {
	req, _ := http.NewRequest("GET", "/", nil)
	req.SetBasicAuth(user, pass)
	return strings.TrimPrefix(req.Header.Get("Authorization"), "Basic ")
}

// A Basic-auth user name is the actor the audit trail and the log keep: one holding a
// control, format or separator character (a bidi override that makes "alice" of
// "ecila\u202e", a line separator, a zero-width space) is refused with 400 invalid_request
// naming "user", on reads and writes, and nothing runs; the audit line of the refused write
// holds none of those characters. A wrong token with such a name is 401 as any wrong token.
func TestBasicUserRefused(t *testing.T) {
	srv, _, reloads, logs := protected(t, protectToken, 0)
	for _, user := range []string{"\u202eecila", "ops\u2028FORGED", "ops\u2029x", "op\u200bs", "ops\u2066x\u2069", "ops\x85", "ops\nx", "ops\xff"} {
		for _, c := range []struct{ method, path string }{{"GET", "/metrics"}, {"POST", "/reload"}} {
			a := do(t, srv, c.method, c.path, map[string]string{"Authorization": "Basic " + basic(user, protectToken)}, "")
			var body struct{ Code, Field, Error string }
			_ = json.Unmarshal([]byte(a.body), &body)
			if a.status != 400 || body.Code != "invalid_request" || body.Field != "user" || !strings.Contains(body.Error, "Basic-auth user name") {
				t.Errorf("%s %s as %q: %d %s, want 400 invalid_request naming user", c.method, c.path, user, a.status, a.body)
			}
		}
		if a := do(t, srv, "POST", "/reload", map[string]string{"Authorization": "Basic " + basic(user, "wrong")}, ""); a.status != 401 {
			t.Errorf("a wrong password as %q: %d, want 401", user, a.status)
		}
	}
	if *reloads != 0 {
		t.Fatalf("a refused user reloaded the config %d times", *reloads)
	}
	for _, e := range logs.FilterMessage("admin write").All() {
		actor := e.ContextMap()["actor"].(string)
		if strings.ContainsAny(actor, "\u202e\u2028\u2029\u200b\u2066\u0085\n") || !utf8.ValidString(actor) {
			t.Errorf("audit line with actor %q", actor)
		}
	}
	// Names in any script, with spaces and punctuation, pass.
	for _, user := range []string{"alice", "Zoë Müller", "運用チーム", "ops (on call)", ""} {
		if a := do(t, srv, "GET", "/metrics", map[string]string{"Authorization": "Basic " + basic(user, protectToken)}, ""); a.status != 200 {
			t.Errorf("user %q: %d %s", user, a.status, a.body)
		}
	}
}

// Every write leaves one audit line: the actor (Basic user name, or "token"), the action, the
// target (a digest or the path) and the result, whatever the outcome; never a key.
func TestAuditLines(t *testing.T) {
	srv, _, _, logs := protected(t, protectToken, 0)
	const key = "svc_auditkey0123456789abcdefghij"
	basic := func(user string) map[string]string {
		req, _ := http.NewRequest("GET", "/", nil)
		req.SetBasicAuth(user, protectToken)
		return map[string]string{"Authorization": req.Header.Get("Authorization"), "Content-Type": "application/json"}
	}
	bearer := map[string]string{"Authorization": "Bearer " + protectToken, "Content-Type": "application/json"}
	do(t, srv, "POST", "/keys", basic("alice"), `{"key":"`+key+`","kind":"admin","org":"acme","projects":["p1"]}`)
	do(t, srv, "DELETE", "/keys/"+auth.Digest(key), bearer, "")
	do(t, srv, "POST", "/reload", bearer, "")
	do(t, srv, "POST", "/keys", map[string]string{"Sec-Fetch-Site": "cross-site", "Content-Type": "text/plain", "Authorization": "Bearer " + protectToken}, `{"key":"`+key+`"}`)
	do(t, srv, "POST", "/reload", map[string]string{"Authorization": "Bearer wrong"}, "")
	do(t, srv, "GET", "/keys", bearer, "") // a read: no audit line

	type line struct{ actor, action, target, result string }
	want := []line{
		{"alice", "keys.add", auth.Digest(key), "ok"},
		{"token", "keys.revoke", auth.Digest(key), "ok"},
		{"token", "reload", "/reload", "ok"},
		{"token", "keys.add", "/keys", "cross_origin_refused"},
		{"token", "reload", "/reload", "invalid_credentials"},
	}
	entries := logs.FilterMessage("admin write").All()
	if len(entries) != len(want) {
		t.Fatalf("%d audit lines, want %d: %v", len(entries), len(want), entries)
	}
	for i, e := range entries {
		f := e.ContextMap()
		got := line{f["actor"].(string), f["action"].(string), f["target"].(string), f["result"].(string)}
		if got != want[i] {
			t.Errorf("audit line %d: %+v, want %+v", i, got, want[i])
		}
		for _, v := range f {
			if s, ok := v.(string); ok && strings.Contains(s, "auditkey") {
				t.Errorf("audit line %d holds the key: %v", i, f)
			}
		}
	}
}

// An export asked for by a page of another origin (an <img> or link carrying the operator's
// cached credentials) is refused before it costs the store anything; the usage page's own
// link, a typed address and clients without browser headers pass.
func TestExportOwnPagesOnly(t *testing.T) {
	ran := 0
	h := ownPagesOnly(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { ran++ }))
	for site, want := range map[string]int{"": 200, "same-origin": 200, "none": 200, "same-site": 403, "cross-site": 403} {
		before := ran
		r := httptest.NewRequest("GET", "/usage/export?limit=x&window=current", nil)
		if site != "" {
			r.Header.Set("Sec-Fetch-Site", site)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != want || (want == 403) != (ran == before) {
			t.Errorf("Sec-Fetch-Site %q: %d (handler ran %t), want %d", site, w.Code, ran > before, want)
		}
		if want == 403 && !strings.Contains(w.Body.String(), `"code":"cross_origin_refused"`) {
			t.Errorf("Sec-Fetch-Site %q: %s", site, w.Body.String())
		}
	}
}
