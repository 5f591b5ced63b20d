package admin

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/docsgate/gateway/auth"
)

const testToken = "admintoken"

func keysServer(t *testing.T, km KeyManager) *httptest.Server {
	t.Helper()
	h := Handler(Options{Token: testToken, Keys: km, KnownPlan: func(p string) bool { return p == "enterprise" }, Logger: zap.NewNop()})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

type result struct {
	code int
	body map[string]any
	raw  string
}

func call(t *testing.T, srv *httptest.Server, method, path, token string, body string) result {
	t.Helper()
	req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	var m map[string]any
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatalf("%s %s: not JSON: %q", method, path, raw)
	}
	if ct := res.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Fatalf("content type %q", ct)
	}
	return result{res.StatusCode, m, string(raw)}
}

func TestKeysEndpoints(t *testing.T) {
	reg, err := auth.NewMemoryRegistry(nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := keysServer(t, reg)
	const key = "svc_dsc_s3cr3tvalue0123456789abcdef"

	// The token guards every endpoint.
	for _, c := range []struct{ method, path string }{{"GET", "/keys"}, {"POST", "/keys"}, {"DELETE", "/keys/" + auth.Digest(key)}} {
		if r := call(t, srv, c.method, c.path, "", `{}`); r.code != 401 {
			t.Fatalf("%s %s without token: %d", c.method, c.path, r.code)
		}
		if r := call(t, srv, c.method, c.path, "wrong", `{}`); r.code != 401 {
			t.Fatalf("%s %s with a wrong token: %d", c.method, c.path, r.code)
		}
	}

	r := call(t, srv, "GET", "/keys", testToken, "")
	if r.code != 200 || r.raw != "{\"keys\":[]}\n" {
		t.Fatalf("empty list: %d %s", r.code, r.raw)
	}

	r = call(t, srv, "POST", "/keys", testToken, `{"key":"`+key+`","kind":"assistant","org":"acme","domains":["acme-docs"],"plan":"enterprise","label":"docs site"}`)
	if r.code != 201 || r.body["digest"] != auth.Digest(key) || r.body["kind"] != "assistant" || r.body["org"] != "acme" ||
		r.body["plan"] != "enterprise" || r.body["label"] != "docs site" || r.body["created"] == nil || r.body["revoked"] != nil {
		t.Fatalf("add by key: %d %s", r.code, r.raw)
	}
	if strings.Contains(r.raw, "s3cr3t") {
		t.Fatal("the response repeats the key")
	}
	e, ok, _ := reg.Lookup(context.Background(), auth.Digest(key))
	if !ok || !e.Allows("acme-docs") || !e.Active() {
		t.Fatalf("registry: %+v %v", e, ok)
	}

	admin := auth.Digest("svc_elsewhere")
	r = call(t, srv, "POST", "/keys", testToken, `{"digest":"`+admin+`","kind":"admin","org":"acme","projects":["p1","p2"]}`)
	if r.code != 201 || r.body["digest"] != admin {
		t.Fatalf("add by digest: %d %s", r.code, r.raw)
	}

	r = call(t, srv, "GET", "/keys", testToken, "")
	list, _ := r.body["keys"].([]any)
	if r.code != 200 || len(list) != 2 || strings.Contains(r.raw, "s3cr3t") {
		t.Fatalf("list: %d %s", r.code, r.raw)
	}

	r = call(t, srv, "DELETE", "/keys/"+auth.Digest(key), testToken, "")
	if r.code != 200 || r.body["digest"] != auth.Digest(key) || r.body["revoked"] == nil {
		t.Fatalf("revoke: %d %s", r.code, r.raw)
	}
	if e, _, _ := reg.Lookup(context.Background(), auth.Digest(key)); e.Active() {
		t.Fatal("not revoked in the registry")
	}
	r = call(t, srv, "DELETE", "/keys/"+auth.Digest("svc_nobody"), testToken, "")
	if r.code != 404 || r.body["code"] != "not_found" || r.body["error"] == "" {
		t.Fatalf("revoke unknown: %d %s", r.code, r.raw)
	}
	r = call(t, srv, "DELETE", "/keys/"+key, testToken, "")
	if r.code != 400 || r.body["code"] != "invalid_request" || strings.Contains(r.raw, "s3cr3t") {
		t.Fatalf("revoke by raw key: %d %s", r.code, r.raw)
	}
}

func TestKeysAddRejects(t *testing.T) {
	reg, _ := auth.NewMemoryRegistry(nil)
	srv := keysServer(t, reg)
	d := auth.Digest("svc_dsc_x")
	cases := []struct{ name, body string }{
		{"not json", `{`},
		{"unknown field", `{"key":"svc_dsc_s3cr3t","kind":"assistant","org":"acme","domains":["d"],"colour":"red"}`},
		{"trailing data", `{"digest":"` + d + `","kind":"assistant","org":"acme","domains":["d"]} {}`},
		{"no key or digest", `{"kind":"assistant","org":"acme","domains":["d"]}`},
		{"both", `{"key":"svc_dsc_s3cr3t","digest":"` + d + `","kind":"assistant","org":"acme","domains":["d"]}`},
		{"bad kind", `{"key":"svc_dsc_s3cr3t","kind":"root","org":"acme","domains":["d"]}`},
		{"wrong family", `{"key":"svc_dsc_s3cr3t","kind":"admin","org":"acme","projects":["p"]}`},
		{"admin key as assistant", `{"key":"svc_s3cr3t","kind":"assistant","org":"acme","domains":["d"]}`},
		{"unknown family", `{"key":"pk_s3cr3t","kind":"assistant","org":"acme","domains":["d"]}`},
		{"malformed key", `{"key":"svc_dsc_s3cr3t with space","kind":"assistant","org":"acme","domains":["d"]}`},
		{"bad digest", `{"digest":"ABC","kind":"assistant","org":"acme","domains":["d"]}`},
		{"raw key as digest", `{"digest":"svc_dsc_s3cr3t","kind":"assistant","org":"acme","domains":["d"]}`},
		{"raw key as label", `{"digest":"` + d + `","kind":"assistant","org":"acme","domains":["d"],"label":"svc_dsc_s3cr3t"}`},
		{"no org", `{"digest":"` + d + `","kind":"assistant","domains":["d"]}`},
		{"no domains", `{"digest":"` + d + `","kind":"assistant","org":"acme"}`},
		{"projects on assistant", `{"digest":"` + d + `","kind":"assistant","org":"acme","domains":["d"],"projects":["p"]}`},
		{"too big", `{"digest":"` + d + `","kind":"assistant","org":"acme","domains":["d"],"label":"` + strings.Repeat("x", 17<<10) + `"}`},
		// Weak keys: too few characters after the prefix, or characters outside [A-Za-z0-9_-].
		{"weak key", `{"key":"svc_dsc_s3cr3t","kind":"assistant","org":"acme","domains":["d"]}`},
		{"weak admin key", `{"key":"svc_1","kind":"admin","org":"acme","projects":["p"]}`},
		{"23 characters", `{"key":"svc_s3cr3t0123456789abcdef","kind":"admin","org":"acme","projects":["p"]}`},
		{"odd characters", `{"key":"svc_s3cr3t0123456789abcdef.~","kind":"admin","org":"acme","projects":["p"]}`},
		{"bad revoked time", `{"digest":"` + d + `","kind":"assistant","org":"acme","domains":["d"],"revoked":"soon"}`},
	}
	for _, c := range cases {
		r := call(t, srv, "POST", "/keys", testToken, c.body)
		if r.code != 400 || r.body["code"] != "invalid_request" || r.body["error"] == "" {
			t.Errorf("%s: %d %s", c.name, r.code, r.raw)
		}
		if strings.Contains(r.raw, "s3cr3t") {
			t.Errorf("%s: the response repeats the key: %s", c.name, r.raw)
		}
	}
	if list, _ := reg.List(context.Background()); len(list) != 0 {
		t.Fatalf("rejected requests registered keys: %+v", list)
	}
}

// Labels, orgs, plans, projects and domains are free text shown in exports, on the page and
// by gateway keys list: a bidi override, a zero-width or a separator character is refused
// (400 naming the field), and the text of any script passes.
func TestKeysAddRefusesMisleadingText(t *testing.T) {
	reg, _ := auth.NewMemoryRegistry(nil)
	srv := keysServer(t, reg)
	d := auth.Digest("svc_dsc_text")
	entry := func(field, v string) string {
		b, _ := json.Marshal(map[string]any{"digest": d, "kind": "assistant", "org": "acme", "domains": []string{"d"}, field: v})
		return string(b)
	}
	for _, c := range []struct{ field, value, named string }{
		{"label", "invoice\u202Efdp.exe", "label"},
		{"label", "billing\u2028FORGED", "label"},
		{"org", "ac\u200Bme", "org"},
		{"label", "bot\u0085", "label"},
		{"plan", "enter\u2066prise", "plan"},
	} {
		r := call(t, srv, "POST", "/keys", testToken, entry(c.field, c.value))
		if r.code != 400 || r.body["code"] != "invalid_request" || !strings.Contains(r.raw, c.named+": must not hold") {
			t.Errorf("%s %q: %d %s", c.field, c.value, r.code, r.raw)
		}
	}
	b, _ := json.Marshal(map[string]any{"digest": d, "kind": "assistant", "org": "acme", "domains": []string{"docs.example", "x\u2029y"}})
	if r := call(t, srv, "POST", "/keys", testToken, string(b)); r.code != 400 || !strings.Contains(r.raw, "domains[1]: must not hold") {
		t.Errorf("a domain with U+2029: %d %s", r.code, r.raw)
	}
	if list, _ := reg.List(context.Background()); len(list) != 0 {
		t.Fatalf("refused entries were registered: %+v", list)
	}
	if r := call(t, srv, "POST", "/keys", testToken, entry("label", "=Zoë's bot, 東京 (prod)")); r.code != 201 {
		t.Fatalf("a plain label: %d %s", r.code, r.raw)
	}
}

// failing is a registry whose store is down.
type failing struct{}

func (failing) Add(context.Context, auth.Entry) error      { return errors.New("down") }
func (failing) Revoke(context.Context, string) error       { return errors.New("down") }
func (failing) List(context.Context) ([]auth.Entry, error) { return nil, errors.New("down") }
func (failing) Rotate(context.Context, string, auth.Entry, time.Time) (auth.Entry, error) {
	return auth.Entry{}, errors.New("down")
}

func TestKeysRegistryUnavailable(t *testing.T) {
	srv := keysServer(t, failing{})
	d := auth.Digest("svc_dsc_x")
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/keys", ""},
		{"DELETE", "/keys/" + d, ""},
		{"POST", "/keys/" + d + "/rotate", ""},
		{"POST", "/keys", `{"digest":"` + d + `","kind":"assistant","org":"acme","domains":["d"]}`},
	} {
		r := call(t, srv, c.method, c.path, testToken, c.body)
		if r.code != 503 || r.body["code"] != "registry_unavailable" {
			t.Errorf("%s %s: %d %s", c.method, c.path, r.code, r.raw)
		}
	}
}

// listOnly has no Lookup: DELETE finds the revoked entry through List.
type listOnly struct{ reg *auth.MemoryRegistry }

func (l listOnly) Add(ctx context.Context, e auth.Entry) error    { return l.reg.Add(ctx, e) }
func (l listOnly) Revoke(ctx context.Context, d string) error     { return l.reg.Revoke(ctx, d) }
func (l listOnly) List(ctx context.Context) ([]auth.Entry, error) { return l.reg.List(ctx) }
func (l listOnly) Rotate(ctx context.Context, old string, next auth.Entry, ends time.Time) (auth.Entry, error) {
	return l.reg.Rotate(ctx, old, next, ends)
}

func TestKeysRevokeWithoutLookup(t *testing.T) {
	reg, _ := auth.NewMemoryRegistry([]auth.Entry{{Digest: auth.Digest("svc_a"), Kind: "admin", Org: "o", Projects: []string{"p"}}})
	srv := keysServer(t, listOnly{reg})
	r := call(t, srv, "DELETE", "/keys/"+auth.Digest("svc_a"), testToken, "")
	if r.code != 200 || r.body["revoked"] == nil || r.body["org"] != "o" {
		t.Fatalf("%d %s", r.code, r.raw)
	}
}

// Without a token configured, writes are refused (403 admin_token_required) and nothing
// changes; reading the list still works.
func TestKeysNoToken(t *testing.T) {
	reg, _ := auth.NewMemoryRegistry(nil)
	srv := httptest.NewServer(Handler(Options{Keys: reg, Metrics: http.NotFoundHandler(), Logger: zap.NewNop()}))
	defer srv.Close()
	d := auth.Digest("svc_k")
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/keys", `{"key":"svc_k0123456789abcdefghijklmn","kind":"admin","org":"o","projects":["*"]}`},
		{"POST", "/keys", `{"digest":"` + d + `","kind":"admin","org":"o","projects":["*"]}`},
		{"DELETE", "/keys/" + d, ""},
		{"POST", "/keys/" + d + "/rotate", ""},
	} {
		r := call(t, srv, c.method, c.path, "", c.body)
		if r.code != 403 || r.body["code"] != "admin_token_required" {
			t.Errorf("%s %s without a configured token: %d %s", c.method, c.path, r.code, r.raw)
		}
	}
	if list, _ := reg.List(t.Context()); len(list) != 0 {
		t.Fatalf("registered without a token: %+v", list)
	}
	if r := call(t, srv, "GET", "/keys", "", ""); r.code != 200 {
		t.Fatalf("GET /keys without a configured token: %d %s", r.code, r.raw)
	}
}

func TestKeysRefuseUnknownPlanAndRevival(t *testing.T) {
	reg, err := auth.NewMemoryRegistry(nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := keysServer(t, reg)
	post := func(body string) int {
		req, _ := http.NewRequest("POST", srv.URL+"/keys", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+testToken)
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res.StatusCode
	}
	if c := post(`{"key":"svc_dsc_plankey1plankey1plankey1","kind":"assistant","org":"acme","domains":["d"],"plan":"nosuchplan"}`); c != 400 {
		t.Fatalf("unknown plan: %d", c)
	}
	if c := post(`{"key":"svc_dsc_plankey1plankey1plankey1","kind":"assistant","org":"acme","domains":["d"],"plan":"enterprise"}`); c != 201 {
		t.Fatalf("known plan: %d", c)
	}
	if err := reg.Revoke(t.Context(), auth.Digest("svc_dsc_plankey1plankey1plankey1")); err != nil {
		t.Fatal(err)
	}
	if c := post(`{"digest":"` + auth.Digest("svc_dsc_plankey1plankey1plankey1") + `","kind":"assistant","org":"acme","domains":["d"]}`); c != 409 {
		t.Fatalf("re-registering a revoked key: %d", c)
	}
	if e, ok, _ := reg.Lookup(t.Context(), auth.Digest("svc_dsc_plankey1plankey1plankey1")); !ok || e.Active() {
		t.Fatal("the revoked key came back")
	}
}
