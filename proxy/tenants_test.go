package proxy

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/internal/redistest"
)

func limitPtr(n int64) *int64 { return &n }

// A plan's limits apply to its tenant alone: acme (enterprise) gets 5 per hour, everyone else
// the default 2, and the headers show each tenant its own allowance.
func TestPlansApplyToTheirTenantOnly(t *testing.T) {
	stores(t, func(t *testing.T, withStore gatewayOpt, _ *redistest.Server) {
		g := newGateway(t, newUpstream(t, nil), withStore, setLimit("assistant_per_org", 2, "hour"), func(c *cfgT) {
			c.Plans = map[string]map[string]config.Limit{"enterprise": {"assistant_per_org": {Limit: limitPtr(5)}}}
			c.Orgs = map[string]config.Org{"acme": {Domains: []string{"acme-docs"}, Plan: "enterprise"}, "beta": {Domains: []string{"beta-docs"}}}
		})
		count := func(domain string) (admitted int, policy string) {
			for range 8 {
				res, _ := g.do(t, "POST", "/discovery/v1/assistant/"+domain+"/message", jsonHdr(assistantKey), assistantBody)
				if res.StatusCode == 201 {
					admitted++
					policy = res.Header.Get("RateLimit-Policy")
				}
			}
			return admitted, policy
		}
		if n, p := count("acme-docs"); n != 5 || !strings.Contains(p, `"assistant_per_org";q=5;`) {
			t.Fatalf("enterprise org admitted %d (policy %q), want 5", n, p)
		}
		if n, p := count("beta-docs"); n != 2 || !strings.Contains(p, `"assistant_per_org";q=2;`) {
			t.Fatalf("default org admitted %d (policy %q), want 2", n, p)
		}
		if n, _ := count("unmapped"); n != 2 {
			t.Fatalf("unmapped domain admitted %d, want 2", n)
		}
	})
}

// A shadow limit is counted and reported, never denies; the enforced limits keep counting.
func TestShadowLimitNeverDenies(t *testing.T) {
	stores(t, func(t *testing.T, withStore gatewayOpt, _ *redistest.Server) {
		g := newGateway(t, newUpstream(t, nil), withStore, func(c *cfgT) {
			c.Limits = map[string]config.Limit{
				"assistant_per_org": {Limit: limitPtr(2), Mode: "shadow"},
				"assistant_per_key": {Limit: limitPtr(6)},
			}
		})
		codes := map[int]int{}
		var last string
		for range 8 {
			res, _ := g.do(t, "POST", "/discovery/v1/assistant/acme/message", jsonHdr(assistantKey), assistantBody)
			codes[res.StatusCode]++
			last = res.Header.Get("RateLimit")
		}
		// The shadow org limit (2) would have denied from the third request on; only the
		// enforced key limit (6) did.
		if codes[201] != 6 || codes[429] != 2 {
			t.Fatalf("codes %v, want 6 admitted by the key limit", codes)
		}
		if !strings.Contains(last, `"assistant_per_org";r=0;`) {
			t.Fatalf("RateLimit %q does not report the shadow limit", last)
		}
		// The single-limit headers describe the enforced limit, never the shadow one.
		res, _ := g.do(t, "POST", "/discovery/v1/assistant/other/message", jsonHdr("svc_dsc_anotherkey"), assistantBody)
		for range 2 {
			res, _ = g.do(t, "POST", "/discovery/v1/assistant/other/message", jsonHdr("svc_dsc_anotherkey"), assistantBody)
		}
		if res.StatusCode != 201 || res.Header.Get("RateLimit-Limit") == "2" || res.Header.Get("RateLimit-Remaining") == "0" {
			t.Fatalf("legacy headers follow the shadow limit: %d %v", res.StatusCode, res.Header)
		}
		if got := lastLogField(g, 8, "denied_by"); got != "assistant_per_key" {
			t.Fatalf("denied_by = %q", got)
		}
		if got := lastLogField(g, 6, "shadow_denied"); got != "assistant_per_org" {
			t.Fatalf("shadow_denied = %q", got)
		}
		found := g.counter(t, "gateway_ratelimit_decisions_total", "route", "assistant_message", "limit", "assistant_per_org", "decision", "shadow_denied")
		if found != 5 { // acme requests 3..6, and the third on other, were admitted past the shadow limit
			t.Fatalf("shadow_denied count %v, want 5", found)
		}
	})
}

func TestDeprecationHeaders(t *testing.T) {
	g := newGateway(t, newUpstream(t, nil), func(c *cfgT) {
		c.Routes = append(c.Routes, config.Route{Name: "assistant_message",
			Deprecation: &config.Deprecation{Since: "2025-06-01", Sunset: "2026-12-31", Link: "https://docs.example.com/migrate"}})
	})
	for _, h := range []http.Header{jsonHdr(assistantKey), jsonHdr("svc_dsc_")} { // success and error alike
		res, _ := g.do(t, "POST", "/discovery/v1/assistant/acme/message", h, assistantBody)
		if res.Header.Get("Deprecation") != "@1748736000" || res.Header.Get("Sunset") != "Thu, 31 Dec 2026 00:00:00 GMT" ||
			res.Header.Get("Link") != `<https://docs.example.com/migrate>; rel="deprecation"` {
			t.Fatalf("status %d headers %v", res.StatusCode, res.Header)
		}
	}
	res, _ := g.do(t, "POST", "/discovery/v2/assistant/acme/message", jsonHdr(assistantKey), assistantBody)
	if res.Header.Get("Deprecation") != "" {
		t.Fatal("a route that is not deprecated carries Deprecation")
	}
	// One authenticated use of the deprecated route, by an org the config does not name.
	if n := g.counter(t, "gateway_deprecated_requests_total", "route", "assistant_message", "org", "other"); n != 1 {
		t.Fatalf("gateway_deprecated_requests_total = %v, want 1", n)
	}
}

// Reload swaps limits for new requests; a bad config is refused and the old one stays.
func TestReloadSwapsLimits(t *testing.T) {
	up := newUpstream(t, nil)
	g := newGateway(t, up, setLimit("agent_job_per_project", 1, "hour"))
	if res, _ := g.do(t, "POST", "/v2/agent/p/job", jsonHdr(adminKey), agentBody); res.StatusCode != 201 {
		t.Fatal(res.StatusCode)
	}
	if res, _ := g.do(t, "POST", "/v2/agent/p/job", jsonHdr(adminKey), agentBody); res.StatusCode != 429 {
		t.Fatal(res.StatusCode)
	}
	gw := g.Config.Handler.(*Gateway)
	cfg := config.Defaults()
	cfg.Upstream.URL = up.URL
	cfg.Limits = map[string]config.Limit{"agent_job_per_project": {Limit: limitPtr(3)}}
	if err := gw.Reload(&cfg); err != nil {
		t.Fatal(err)
	}
	if res, _ := g.do(t, "POST", "/v2/agent/p/job", jsonHdr(adminKey), agentBody); res.StatusCode != 201 || res.Header.Get("RateLimit-Remaining") != "1" {
		t.Fatalf("after reload: %d remaining %q (counters must survive a reload)", res.StatusCode, res.Header.Get("RateLimit-Remaining"))
	}
	bad := cfg
	bad.Routes = []config.Route{{Name: "x", Method: "GET", Path: "/v2/agent/{projectId}/job", Key: "admin", Limits: &[]string{"assistant_per_org"}}}
	if err := gw.Reload(&bad); err == nil {
		t.Fatal("a route counting by org without {domain} was accepted")
	}
	if res, _ := g.do(t, "POST", "/v2/agent/p/job", jsonHdr(adminKey), agentBody); res.StatusCode != 201 {
		t.Fatalf("the running config was not kept: %d", res.StatusCode)
	}
}

// Registry mode: only registered, active keys pass, each on its own projects or domains, and
// the org of assistant_per_org is the key's.
func TestRegistryMode(t *testing.T) {
	now := time.Now()
	revoked := now
	reg, err := auth.NewMemoryRegistry([]auth.Entry{
		{Digest: auth.Digest(adminKey), Kind: "admin", Org: "acme", Projects: []string{"p1"}, Created: now},
		{Digest: auth.Digest(assistantKey), Kind: "assistant", Org: "acme", Domains: []string{"acme-docs", "acme-api"}, Created: now},
		{Digest: auth.Digest("svc_dsc_revokedSECRET"), Kind: "assistant", Org: "acme", Domains: []string{"acme-docs"}, Created: now, Revoked: &revoked},
	})
	if err != nil {
		t.Fatal(err)
	}
	up := newUpstream(t, nil)
	g := newGatewayWith(t, up, reg, setLimit("assistant_per_org", 2, "hour"))
	cases := []struct {
		path, key string
		status    int
		code      string
	}{
		{"/v2/agent/p1/job", adminKey, 201, ""},
		{"/v2/agent/p2/job", adminKey, 403, "forbidden"},
		{"/v2/agent/p1/job", "svc_inventedSECRET", 401, "invalid_credentials"},
		{"/discovery/v1/assistant/acme-docs/message", "svc_dsc_inventedSECRET", 401, "invalid_credentials"},
		{"/discovery/v1/assistant/acme-docs/message", "svc_dsc_revokedSECRET", 401, "invalid_credentials"},
		{"/discovery/v1/assistant/other-docs/message", assistantKey, 403, "forbidden"},
		{"/discovery/v1/assistant/acme-docs/message", assistantKey, 201, ""},
		{"/discovery/v1/assistant/acme-api/message", assistantKey, 201, ""}, // same org: shares the quota
		{"/discovery/v1/assistant/acme-docs/message", assistantKey, 429, "rate_limited"},
	}
	for _, c := range cases {
		body := agentBody
		if strings.HasPrefix(c.path, "/discovery") {
			body = assistantBody
		}
		res, data := g.do(t, "POST", c.path, jsonHdr(c.key), body)
		if res.StatusCode != c.status {
			t.Fatalf("%s with %s…: %d %s, want %d", c.path, c.key[:8], res.StatusCode, data, c.status)
		}
		if c.code != "" && decodeError(t, res, data).Code != c.code {
			t.Fatalf("%s: code %s", c.path, data)
		}
	}
	if n := len(up.requests()); n != 3 {
		t.Fatalf("upstream saw %d requests, want the 3 admitted", n)
	}
	// Invented and revoked keys consumed nothing.
	usages, err := g.eng.Usage(context.Background(), "key", "svc_dsc_inventedSECRET")
	if err != nil || usages[0].Used != 0 {
		t.Fatalf("an invented key consumed quota: %+v %v", usages, err)
	}
	g.assertNoSecrets(t)
}

// The usage API reads an org's counters with its plan's limits.
func TestUsageFollowsPlans(t *testing.T) {
	g := newGateway(t, newUpstream(t, nil), setLimit("assistant_per_org", 2, "hour"), func(c *cfgT) {
		c.Plans = map[string]map[string]config.Limit{"enterprise": {"assistant_per_org": {Limit: limitPtr(5)}}}
		c.Orgs = map[string]config.Org{"acme": {Domains: []string{"acme-docs"}, Plan: "enterprise"}}
	})
	for range 3 {
		g.do(t, "POST", "/discovery/v1/assistant/acme-docs/message", jsonHdr(assistantKey), assistantBody)
	}
	gw := g.Config.Handler.(*Gateway)
	u, err := gw.quota.engine.Usage(context.Background(), "org", "acme")
	if err != nil || len(u) != 1 || u[0].Limit != 5 || u[0].Used != 3 || u[0].Remaining != 2 {
		t.Fatalf("usage of a plan's org: %+v %v", u, err)
	}
	u, err = gw.quota.engine.Usage(context.Background(), "org", "beta")
	if err != nil || len(u) != 1 || u[0].Limit != 2 || u[0].Used != 0 {
		t.Fatalf("usage of a default org: %+v %v", u, err)
	}
}
