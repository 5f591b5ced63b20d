package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/internal/redistest"
	"github.com/docsgate/gateway/limits"
	"github.com/docsgate/gateway/metrics"
)

type selfUsageAnswer struct {
	Route  string        `json:"route"`
	Limits []limits.View `json:"limits"`
}

func bearerHdr(key string) http.Header { return hdr("Authorization", "Bearer "+key) }

// getUsage asks the tenants' endpoint; want is the status expected.
func (g *gateway) getUsage(t *testing.T, query string, h http.Header, want int) (*http.Response, []byte) {
	t.Helper()
	res, data := g.do(t, "GET", "/gateway/usage?"+query, h, "")
	if res.StatusCode != want {
		t.Fatalf("GET /gateway/usage?%s: %d %s, want %d", query, res.StatusCode, data, want)
	}
	return res, data
}

func decodeUsage(t *testing.T, data []byte) selfUsageAnswer {
	t.Helper()
	var a selfUsageAnswer
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&a); err != nil {
		t.Fatalf("%s: %v", data, err)
	}
	return a
}

// The endpoint lists the enforced limits a request of this key from this address would take,
// with the counts the requests left, reads them without counting, and agrees with the admin
// listener's answer for the same counters. In prefix mode the limits by key, org and project
// are shown only where self_usage.prefix_mode_exposes names them, as here.
func TestSelfUsageAnswersWhatTheRouteCounts(t *testing.T) {
	stores(t, func(t *testing.T, withStore gatewayOpt, _ *redistest.Server) {
		g := newGateway(t, newUpstream(t, nil), withStore, setLimit("assistant_per_org", 50, "hour"), func(c *cfgT) {
			c.SelfUsage.PrefixModeExposes = []string{"key", "org", "project"}
			c.Limits["assistant_per_ip"] = config.Limit{Limit: limitPtr(7), Mode: "shadow"}
			c.Plans = map[string]map[string]config.Limit{"gold": {"assistant_per_org": {Limit: limitPtr(80)}}}
			c.Orgs = map[string]config.Org{"acme": {Domains: []string{"acme-docs"}, Plan: "gold"}}
		})
		for range 3 {
			if res, data := g.do(t, "POST", "/discovery/v1/assistant/acme-docs/message", jsonHdr(assistantKey), assistantBody); res.StatusCode != 201 {
				t.Fatalf("%d %s", res.StatusCode, data)
			}
		}
		for range 2 { // reading counts nothing
			res, data := g.getUsage(t, "route=assistant_message_v2&domain=acme-docs", bearerHdr(assistantKey), 200)
			if res.Header.Get("Cache-Control") != "no-store" || !strings.HasPrefix(res.Header.Get("Content-Type"), "application/json") {
				t.Fatalf("headers %v", res.Header)
			}
			if res.Header.Get("RateLimit") != "" {
				t.Fatalf("the usage answer carries rate-limit headers: %v", res.Header)
			}
			a := decodeUsage(t, data)
			if a.Route != "assistant_message_v2" || len(a.Limits) != 2 {
				t.Fatalf("answer %s: want the two enforced limits, not the shadow one", data)
			}
			key, org := a.Limits[0], a.Limits[1]
			if key.Name != "assistant_per_key" || key.Used != 3 || key.Limit != 10000 || key.Window == nil || *key.Window != "month" {
				t.Fatalf("per key: %+v", key)
			}
			if org.Name != "assistant_per_org" || org.Used != 3 || org.Limit != 80 || org.Remaining != 77 || org.Unit != "requests" {
				t.Fatalf("per org (gold plan): %+v", org)
			}
			if org.Forecast == nil || org.Forecast.RatePerHour <= 0 || org.ResetSeconds < 0 || org.ResetSeconds > 3600 {
				t.Fatalf("forecast: %+v", org)
			}
		}
		// The admin listener's answer for the org is the same view of the same counter.
		views, err := g.eng.UsageViews(context.Background(), "org", "acme")
		if err != nil || len(views) != 1 || views[0].Used != 3 || views[0].Limit != 80 || views[0].Forecast == nil {
			t.Fatalf("admin views: %+v %v", views, err)
		}
		// Another org's domain shows that org's counters for this key's request: nothing used.
		_, data := g.getUsage(t, "route=assistant_message&domain=beta-docs", bearerHdr(assistantKey), 200)
		if a := decodeUsage(t, data); a.Limits[1].Used != 0 || a.Limits[1].Limit != 50 || a.Limits[0].Used != 3 {
			t.Fatalf("another domain: %s", data)
		}
		// An admin route: the project's counter.
		_, data = g.getUsage(t, "route=agent_job&projectId=p1", bearerHdr(adminKey), 200)
		if a := decodeUsage(t, data); len(a.Limits) != 1 || a.Limits[0].Name != "agent_job_per_project" || a.Limits[0].Used != 0 {
			t.Fatalf("agent_job: %s", data)
		}
		// The key's family is the route's.
		res, data := g.getUsage(t, "route=agent_job&projectId=p1", bearerHdr(assistantKey), 403)
		if e := decodeError(t, res, data); e.Code != "wrong_key_type" {
			t.Fatalf("%s", data)
		}
		res, data = g.getUsage(t, "route=agent_job&projectId=p1", nil, 401)
		if e := decodeError(t, res, data); e.Code != "missing_credentials" {
			t.Fatalf("%s", data)
		}
	})
}

// In prefix mode the endpoint lists only the limits by ip unless prefix_mode_exposes names
// more; an answer with none of them is an empty list.
func TestSelfUsagePrefixModeExposes(t *testing.T) {
	names := func(data []byte) string {
		var out []string
		for _, l := range decodeUsage(t, data).Limits {
			out = append(out, l.Name)
		}
		return strings.Join(out, ",")
	}
	for _, c := range []struct {
		exposes        []string
		assistant, job string
	}{
		{nil, "assistant_per_ip", ""},
		{[]string{"org"}, "assistant_per_org,assistant_per_ip", ""},
		{[]string{"key", "project"}, "assistant_per_key,assistant_per_ip", "agent_job_per_project"},
		{[]string{"project", "org", "key"}, "assistant_per_key,assistant_per_org,assistant_per_ip", "agent_job_per_project"},
	} {
		g := newGateway(t, newUpstream(t, nil), func(cfg *cfgT) { cfg.SelfUsage.PrefixModeExposes = c.exposes })
		if _, data := g.getUsage(t, "route=assistant_message_v2&domain=acme", bearerHdr(assistantKey), 200); names(data) != c.assistant {
			t.Errorf("exposes %v: %s, want %s", c.exposes, data, c.assistant)
		}
		_, data := g.getUsage(t, "route=agent_job&projectId=p1", bearerHdr(adminKey), 200)
		if names(data) != c.job || (c.job == "" && !strings.Contains(string(data), `"limits":[]`)) {
			t.Errorf("exposes %v: %s, want %s", c.exposes, data, c.job)
		}
	}
}

// Hostile and mistaken queries are refused with 400 invalid_request naming the parameter.
func TestSelfUsageQueryRefusals(t *testing.T) {
	g := newGateway(t, newUpstream(t, nil))
	cases := []struct{ query, field string }{
		{"", "route"},
		{"domain=acme", "route"},
		{"route=nope&domain=acme", "route"},
		{"route=assistant_message", "domain"},
		{"route=assistant_message&domain=", "domain"},
		{"route=assistant_message&domain=a&domain=b", "domain"},
		{"route=assistant_message&route=agent_job&domain=a", "route"},
		{"route=assistant_message&domain=a&projectId=p", "projectId"},
		{"route=assistant_message&domain=a&key=svc_dsc_x", "key"},
		{"route=agent_job&projectId=a%00b", "projectId"},
		{"route=agent_job&projectId=a%0Ab", "projectId"},
		{"route=agent_job&projectId=%E2%80%AEevil", "projectId"},
		{"route=agent_job&projectId=%FF", "projectId"},
		{"route=agent_job&projectId=" + strings.Repeat("a", 300), "projectId"},
		{"route=agent_job&projectId=p&" + strings.Repeat("x", 3000) + "=1", "query"},
		{"route=agent_job&projectId=p;x=1", "query"},
		{"route=agent_job&projectId=%zz", "query"},
		{"route=agent_job&projectId=p&%3Cscript%3E=1", "query"},
		{"route=agent_job_status&projectId=p", "jobId"},
	}
	for _, c := range cases {
		res, data := g.getUsage(t, c.query, bearerHdr(adminKey), 400)
		if e := decodeError(t, res, data); e.Code != "invalid_request" || e.Field != c.field {
			t.Errorf("?%.60s: %s, want field %s", c.query, data, c.field)
		}
		if strings.Contains(string(data), "<script>") {
			t.Errorf("?%.60s: the answer echoes the query: %s", c.query, data)
		}
	}
	// A route with two parameters takes both.
	g.getUsage(t, "route=agent_job_status&projectId=p&jobId=j", bearerHdr(adminKey), 200)
	// HEAD and POST are not GET.
	if res, _ := g.do(t, "POST", "/gateway/usage?route=agent_job&projectId=p", bearerHdr(adminKey), ""); res.StatusCode != 405 || res.Header.Get("Allow") != "GET, OPTIONS" {
		t.Fatalf("POST: %d %v", res.StatusCode, res.Header)
	}
	g.assertNoSecrets(t)
}

// Registry mode: the endpoint authenticates as the route does, and shows nothing of other
// tenants: a domain or project the key is not granted gets the route's 403, a revoked or
// unknown key 401, and those 401s count against auth.failure_limit.
func TestSelfUsageRegistryIsolation(t *testing.T) {
	now := time.Now()
	revoked := now
	reg, err := auth.NewMemoryRegistry([]auth.Entry{
		{Digest: auth.Digest(adminKey), Kind: "admin", Org: "acme", Projects: []string{"p1"}, Created: now},
		{Digest: auth.Digest(assistantKey), Kind: "assistant", Org: "acme", Plan: "gold", Domains: []string{"acme-docs"}, Created: now},
		{Digest: auth.Digest("svc_dsc_revokedSECRET"), Kind: "assistant", Org: "acme", Domains: []string{"acme-docs"}, Created: now, Revoked: &revoked},
	})
	if err != nil {
		t.Fatal(err)
	}
	g := newGatewayWith(t, newUpstream(t, nil), reg, setLimit("assistant_per_org", 5, "hour"), func(c *cfgT) {
		c.Auth.FailureLimit = 3
		c.Plans = map[string]map[string]config.Limit{"gold": {"assistant_per_org": {Limit: limitPtr(9)}}}
	})
	g.do(t, "POST", "/discovery/v1/assistant/acme-docs/message", jsonHdr(assistantKey), assistantBody)
	_, data := g.getUsage(t, "route=assistant_message&domain=acme-docs", bearerHdr(assistantKey), 200)
	if a := decodeUsage(t, data); a.Limits[1].Limit != 9 || a.Limits[1].Used != 1 {
		t.Fatalf("the key's plan: %s", data)
	}
	for _, c := range []struct {
		query, key string
		status     int
		code       string
	}{
		{"route=assistant_message&domain=beta-docs", assistantKey, 403, "forbidden"},
		{"route=agent_job&projectId=p2", adminKey, 403, "forbidden"},
		{"route=assistant_message&domain=acme-docs", "svc_dsc_revokedSECRET", 401, "invalid_credentials"},
		{"route=assistant_message&domain=acme-docs", "svc_dsc_inventedSECRET", 401, "invalid_credentials"},
		{"route=assistant_message&domain=acme-docs", "svc_dsc_invented2SECRET", 401, "invalid_credentials"},
		// The fourth failure from this address within the minute: refused before any lookup.
		{"route=assistant_message&domain=acme-docs", assistantKey, 429, "too_many_auth_failures"},
	} {
		res, data := g.getUsage(t, c.query, bearerHdr(c.key), c.status)
		if e := decodeError(t, res, data); e.Code != c.code {
			t.Fatalf("%s with %.12s: %s, want %s", c.query, c.key, data, c.code)
		}
		if strings.Contains(string(data), `"limits"`) {
			t.Fatalf("a refusal shows counters: %s", data)
		}
	}
	g.assertNoSecrets(t)
}

// Each key gets self_usage.per_key_per_minute answers a minute, and another key its own; each
// client address gets self_usage.per_address_per_minute, whatever keys it sends, counted before
// the key is checked. Each 429 names its cause.
func TestSelfUsageBounds(t *testing.T) {
	g := newGateway(t, newUpstream(t, nil), func(c *cfgT) { c.SelfUsage.PerKeyPerMinute, c.SelfUsage.PerAddressPerMinute = 3, 6 })
	q := "route=assistant_message_v2&domain=acme"
	for range 3 {
		g.getUsage(t, q, bearerHdr(assistantKey), 200)
	}
	res, data := g.getUsage(t, q, bearerHdr(assistantKey), 429)
	if e := decodeError(t, res, data); e.Code != "rate_limited" || res.Header.Get("Retry-After") == "" || !strings.Contains(string(data), `"limit":"self_usage"`) ||
		!strings.HasPrefix(e.Error, "Too many usage requests for this key (3 a minute). Please retry in ") {
		t.Fatalf("%v %s", res.Header, data)
	}
	g.getUsage(t, q, bearerHdr("svc_dsc_otherKey123"), 200)
	// Five answered so far from this address; the sixth request takes the last of its minute,
	// whatever its key (none here: 401), and the seventh, with a fresh key, is refused.
	g.getUsage(t, q, nil, 401)
	res, data = g.getUsage(t, q, bearerHdr("svc_dsc_yetAnotherKey123"), 429)
	if e := decodeError(t, res, data); e.Code != "rate_limited" || !strings.Contains(string(data), `"limit":"self_usage"`) ||
		!strings.HasPrefix(e.Error, "Too many usage requests from this address (6 a minute). Please retry in ") {
		t.Fatalf("%v %s", res.Header, data)
	}
	// The access log names the bound that refused (its line follows the answer).
	for _, bound := range []string{"self_usage.per_key_per_minute", "self_usage.per_address_per_minute"} {
		eventually(t, "a log line denied_by "+bound, func() bool { return g.logs.FilterField(zap.String("denied_by", bound)).Len() == 1 })
	}
	// The bound is the endpoint's own: the routes are not refused.
	if res, _ := g.do(t, "POST", "/v2/agent/p1/job", jsonHdr(adminKey), agentBody); res.StatusCode != 201 {
		t.Fatalf("the route after the bound: %d", res.StatusCode)
	}
}

// CORS as on the assistant routes: preflights answer, answers about assistant routes carry
// the allowed origin, answers about admin routes none.
func TestSelfUsageCORS(t *testing.T) {
	g := newGateway(t, newUpstream(t, nil), func(c *cfgT) { c.CORS.AllowedOrigins = []string{"https://docs.example.com"} })
	res, _ := g.do(t, "OPTIONS", "/gateway/usage", hdr("Origin", "https://docs.example.com", "Access-Control-Request-Method", "GET",
		"Access-Control-Request-Headers", "authorization"), "")
	if res.StatusCode != 204 || res.Header.Get("Access-Control-Allow-Origin") != "https://docs.example.com" ||
		!strings.Contains(res.Header.Get("Access-Control-Allow-Methods"), "GET") || !strings.Contains(strings.ToLower(res.Header.Get("Access-Control-Allow-Headers")), "authorization") {
		t.Fatalf("preflight: %d %v", res.StatusCode, res.Header)
	}
	h := bearerHdr(assistantKey)
	h.Set("Origin", "https://docs.example.com")
	res, _ = g.getUsage(t, "route=assistant_message_v2&domain=acme", h, 200)
	if res.Header.Get("Access-Control-Allow-Origin") != "https://docs.example.com" {
		t.Fatalf("assistant route: %v", res.Header)
	}
	h.Set("Origin", "https://evil.example")
	if res, _ = g.getUsage(t, "route=assistant_message_v2&domain=acme", h, 200); res.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("another origin: %v", res.Header)
	}
	h = bearerHdr(adminKey)
	h.Set("Origin", "https://docs.example.com")
	if res, _ = g.getUsage(t, "route=agent_job&projectId=p", h, 200); res.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("admin route: %v", res.Header)
	}
}

// A route that would match the path is refused at load; a disabled endpoint is no route.
func TestSelfUsagePathConfig(t *testing.T) {
	cfg := config.Defaults()
	cfg.Upstream.URL = "http://127.0.0.1:1"
	cfg.Routes = []config.Route{{Name: "catch_all", Method: "GET", Path: "/gateway/{what}", Key: "admin"}}
	_, err := newTestGateway(&cfg, limits.NewMemory(), metrics.New(prometheus.NewRegistry()), nil, nil)
	var ce *config.Error
	if !errors.As(err, &ce) || ce.Problems[0].Key != "self_usage.path" || !strings.Contains(err.Error(), "catch_all") {
		t.Fatalf("a route matching the path: %v", err)
	}
	cfg.SelfUsage.Path = "/tenant/usage"
	if _, err := newTestGateway(&cfg, limits.NewMemory(), metrics.New(prometheus.NewRegistry()), nil, nil); err != nil {
		t.Fatal(err)
	}
	g := newGateway(t, newUpstream(t, nil), func(c *cfgT) { c.SelfUsage.Enabled = false })
	if res, _ := g.do(t, "GET", "/gateway/usage?route=agent_job&projectId=p", bearerHdr(adminKey), ""); res.StatusCode != 404 {
		t.Fatalf("disabled: %d", res.StatusCode)
	}
	g = newGateway(t, newUpstream(t, nil), func(c *cfgT) { c.SelfUsage.Path = "/v1/my-usage" })
	g.getUsage(t, "route=agent_job&projectId=p", bearerHdr(adminKey), 404)
	if res, _ := g.do(t, "GET", "/v1/my-usage?route=agent_job&projectId=p", bearerHdr(adminKey), ""); res.StatusCode != 200 {
		t.Fatalf("configured path: %d", res.StatusCode)
	}
}

// A store that cannot be read answers 503 limiter_unavailable, whatever redis.on_error says
// for the routes: there is nothing to show.
func TestSelfUsageStoreDown(t *testing.T) {
	srv := redistest.Start(t)
	g := newGateway(t, newUpstream(t, nil), func(c *cfgT) { c.Redis.Addrs = []string{srv.Addr}; c.Redis.OnError = "allow" })
	// While the store is up, a read can still miss redis.timeout on a busy machine (the
	// first one also dials): that too is a 503, so the healthy read is polled for, slowly
	// enough to stay inside the key's 60 reads a minute.
	for i := 0; ; i++ {
		res, data := g.do(t, "GET", "/gateway/usage?route=assistant_message_v2&domain=acme", bearerHdr(assistantKey), "")
		if res.StatusCode == 200 {
			break
		}
		if res.StatusCode != 503 || i == 20 {
			t.Fatalf("a read while the store is up: %d %s", res.StatusCode, data)
		}
		time.Sleep(250 * time.Millisecond)
	}
	srv.Stop(t)
	res, data := g.getUsage(t, "route=assistant_message_v2&domain=acme", bearerHdr(assistantKey), 503)
	if e := decodeError(t, res, data); e.Code != "limiter_unavailable" || res.Header.Get("Retry-After") != "1" || strings.Contains(string(data), `"limits"`) {
		t.Fatalf("%v %s", res.Header, data)
	}
}
