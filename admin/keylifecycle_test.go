package admin

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"

	"github.com/docsgate/gateway/auth"
)

// lifecycleServer serves the key endpoints with the running config's rules: routes
// agent_job (admin) and assistant_message (assistant), assistant keys living 30 days by
// default and 90 at most, and last uses from uses.
func lifecycleServer(t *testing.T, reg auth.Registry, uses map[string]time.Time) *httptest.Server {
	t.Helper()
	day := 24 * time.Hour
	h := Handler(Options{Token: testToken, Keys: reg, Logger: zap.NewNop(),
		RouteKind: func(name string) (auth.Kind, bool) {
			k, ok := map[string]auth.Kind{"agent_job": auth.Admin, "assistant_message": auth.Assistant}[name]
			return k, ok
		},
		KeyLifetime: func(k auth.Kind) auth.Lifetime {
			if k == auth.Assistant {
				return auth.Lifetime{Default: 30 * day, Max: 90 * day}
			}
			return auth.Lifetime{}
		},
		KeyLastUse: fixedUses(uses),
	})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv
}

type fixedUses map[string]time.Time

func (f fixedUses) Load(context.Context) (map[string]time.Time, error) { return f, nil }

// POST /keys: a new key gets its kind's default lifetime, an expiry past the longest is
// refused naming the field, an update keeps the expiry, and scopes must name routes of the
// key's kind. GET /keys shows the last uses.
func TestKeysExpiryAndScopes(t *testing.T) {
	reg, _ := auth.NewMemoryRegistry(nil)
	used := time.Date(2026, 12, 4, 9, 30, 0, 0, time.UTC)
	srv := lifecycleServer(t, reg, map[string]time.Time{auth.Digest("svc_dsc_a"): used})
	d := auth.Digest("svc_dsc_a")
	add := func(extra string) result {
		return call(t, srv, "POST", "/keys", testToken, `{"digest":"`+d+`","kind":"assistant","org":"acme","domains":["acme-docs"]`+extra+`}`)
	}
	r := add(`,"scopes":["assistant_message"]`)
	if r.code != 201 {
		t.Fatalf("add: %d %s", r.code, r.raw)
	}
	exp, err := time.Parse(time.RFC3339, r.body["expires"].(string))
	if err != nil || exp.Sub(time.Now().Add(30*24*time.Hour)).Abs() > time.Minute {
		t.Fatalf("a new assistant key's expiry %v, want 30 days from now", r.body["expires"])
	}
	if r := add(`,"label":"renamed"`); r.code != 201 || r.body["expires"] != exp.Format(time.RFC3339) || r.body["scopes"] != nil {
		t.Fatalf("an update without expires keeps the expiry (and sets the scopes it names): %d %s", r.code, r.raw)
	}
	past90 := time.Now().Add(91 * 24 * time.Hour).UTC().Format(time.RFC3339)
	if r := add(`,"expires":"` + past90 + `"`); r.code != 400 || r.body["field"] != "expires" || !strings.Contains(r.raw, "90d") {
		t.Fatalf("an expiry past the longest lifetime: %d %s", r.code, r.raw)
	}
	if r := add(`,"expires":"2020-01-01"`); r.code != 400 || r.body["field"] != "expires" {
		t.Fatalf("an expiry past: %d %s", r.code, r.raw)
	}
	for _, bad := range []string{`["agent_job"]`, `["nope"]`, `["assistant message"]`} {
		if r := add(`,"scopes":` + bad); r.code != 400 || !strings.Contains(r.raw, "scopes") {
			t.Fatalf("scopes %s: %d %s", bad, r.code, r.raw)
		}
	}
	admin := call(t, srv, "POST", "/keys", testToken, `{"digest":"`+auth.Digest("svc_b")+`","kind":"admin","org":"acme","projects":["p"]}`)
	if admin.code != 201 || admin.body["expires"] != nil {
		t.Fatalf("an admin key with no lifetime configured: %d %s", admin.code, admin.raw)
	}
	r = call(t, srv, "GET", "/keys", testToken, "")
	if !strings.Contains(r.raw, `"last_used":"2026-12-04T09:30:00Z"`) || strings.Count(r.raw, "last_used") != 1 {
		t.Fatalf("GET /keys with last uses: %s", r.raw)
	}
}

// POST /keys/{digest}/rotate answers the new key once with both entries: the successor has
// the old key's org, grants, plan, label and scopes, and is in its lineage; the old key ends
// after the overlap. A second rotation of the old key, and rotations of revoked, expired and
// unknown keys, are refused with their codes.
func TestKeysRotate(t *testing.T) {
	reg, _ := auth.NewMemoryRegistry(nil)
	srv := lifecycleServer(t, reg, nil)
	const old = "svc_dsc_rotateme0123456789abcdefghij"
	d := auth.Digest(old)
	if r := call(t, srv, "POST", "/keys", testToken, `{"key":"`+old+`","kind":"assistant","org":"acme","domains":["acme-docs"],"plan":"","label":"widget","scopes":["assistant_message"]}`); r.code != 201 {
		t.Fatalf("add: %d %s", r.code, r.raw)
	}
	before := time.Now()
	r := call(t, srv, "POST", "/keys/"+d+"/rotate", testToken, `{"overlap":"2d"}`)
	if r.code != 201 {
		t.Fatalf("rotate: %d %s", r.code, r.raw)
	}
	key, _ := r.body["key"].(string)
	if !strings.HasPrefix(key, "svc_dsc_") || auth.CheckStrength(key, auth.Assistant) != nil {
		t.Fatalf("the new key %q is no strong assistant key", key)
	}
	next, prev := r.body["entry"].(map[string]any), r.body["previous"].(map[string]any)
	if next["digest"] != auth.Digest(key) || next["lineage"] != d || next["replaces"] != d || next["org"] != "acme" ||
		next["label"] != "widget" || next["scopes"].([]any)[0] != "assistant_message" || next["expires"] == nil {
		t.Fatalf("the new entry: %v", next)
	}
	ends, _ := time.Parse(time.RFC3339, prev["revoked"].(string))
	if prev["rotated_to"] != auth.Digest(key) || ends.Before(before.Add(48*time.Hour-time.Second)) || ends.After(time.Now().Add(48*time.Hour)) {
		t.Fatalf("the old entry: %v", prev)
	}
	if strings.Contains(call(t, srv, "GET", "/keys", testToken, "").raw, key) {
		t.Fatal("GET /keys shows the new key itself")
	}
	for _, c := range []struct{ path, body, code string }{
		{"/keys/" + d + "/rotate", "", "key_rotated"},
		{"/keys/" + strings.Repeat("a", 64) + "/rotate", "", "not_found"},
		{"/keys/" + d + "/rotate", `{"overlap":"soon"}`, "invalid_request"},
		{"/keys/" + d + "/rotate", `{"overlap":"400d"}`, "invalid_request"},
		{"/keys/" + d + "/rotate", `{"expires":"2999-01-01"}`, "invalid_request"},
		{"/keys/" + d + "/rotate", `{"nope":1}`, "invalid_request"},
	} {
		if r := call(t, srv, "POST", c.path, testToken, c.body); r.body["code"] != c.code {
			t.Errorf("POST %s %s: %d %s; want %s", c.path, c.body, r.code, r.raw, c.code)
		}
	}
	// The successor rotates in turn, with no overlap: it ends now, and stays in the lineage.
	r = call(t, srv, "POST", "/keys/"+auth.Digest(key)+"/rotate", testToken, `{"overlap":"0s"}`)
	if r.code != 201 || r.body["entry"].(map[string]any)["lineage"] != d {
		t.Fatalf("rotating the successor: %d %s", r.code, r.raw)
	}
	if r := call(t, srv, "POST", "/keys/"+auth.Digest(key)+"/rotate", testToken, ""); r.body["code"] != "key_revoked" {
		t.Fatalf("rotating a key that ended: %d %s", r.code, r.raw)
	}
}
