package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
// listener's answer for the same counters.
func TestSelfUsageAnswersWhatTheRouteCounts(t *testing.T) {
	stores(t, func(t *testing.T, withStore gatewayOpt, _ *redistest.Server) {
		g := newGateway(t, newUpstream(t, nil), withStore, setLimit("assistant_per_org", 50, "hour"), func(c *cfgT) {
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
		views, err := g.gw.UsageViews(context.Background(), "org", "acme")
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

// Each key gets self_usage.per_key_per_minute answers a minute, and another key its own.
func TestSelfUsagePerKeyBound(t *testing.T) {
	g := newGateway(t, newUpstream(t, nil), func(c *cfgT) { c.SelfUsage.PerKeyPerMinute = 3 })
	if s := time.Now().Second(); s > 55 { // the four requests stay in one minute
		time.Sleep(time.Duration(61-s) * time.Second)
	}
	for range 3 {
		g.getUsage(t, "route=agent_job&projectId=p1", bearerHdr(adminKey), 200)
	}
	res, data := g.getUsage(t, "route=agent_job&projectId=p1", bearerHdr(adminKey), 429)
	if e := decodeError(t, res, data); e.Code != "rate_limited" || res.Header.Get("Retry-After") == "" {
		t.Fatalf("%v %s", res.Header, data)
	}
	g.getUsage(t, "route=agent_job&projectId=p1", bearerHdr("svc_otherAdminKey123"), 200)
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
	_, err := New(Options{Config: &cfg, Logger: zap.NewNop(), Metrics: metrics.New(prometheus.NewRegistry()), Limiter: limits.NewMemory()})
	var ce *config.Error
	if !errors.As(err, &ce) || ce.Problems[0].Key != "self_usage.path" || !strings.Contains(err.Error(), "catch_all") {
		t.Fatalf("a route matching the path: %v", err)
	}
	cfg.SelfUsage.Path = "/tenant/usage"
	if _, err := New(Options{Config: &cfg, Logger: zap.NewNop(), Metrics: metrics.New(prometheus.NewRegistry()), Limiter: limits.NewMemory()}); err != nil {
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

// The bound tracks at most maxBoundKeys keys a minute; past it new keys are refused until the
// minute turns, the keys already seen keep their own count, and the next minute starts afresh.
func TestSelfUsageBoundCapsItsKeys(t *testing.T) {
	var b keyBound
	now := time.Date(2026, 11, 27, 13, 0, 10, 0, time.UTC)
	for i := range maxBoundKeys {
		if ok, _ := b.allow(fmt.Sprint(i), 2, now); !ok {
			t.Fatalf("key %d refused", i)
		}
	}
	if ok, retry := b.allow("one more", 2, now); ok || retry != 50 {
		t.Fatalf("a key past the cap: %v %d", ok, retry)
	}
	if ok, _ := b.allow("7", 2, now); !ok {
		t.Fatal("a key already seen was refused")
	}
	if ok, _ := b.allow("7", 2, now); ok {
		t.Fatal("a key past its limit was admitted")
	}
	if ok, _ := b.allow("one more", 2, now.Add(time.Minute)); !ok || len(b.counts) != 1 {
		t.Fatalf("the next minute: %v, %d keys tracked", ok, len(b.counts))
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
		res, data := g.do(t, "GET", "/gateway/usage?route=agent_job&projectId=p1", bearerHdr(adminKey), "")
		if res.StatusCode == 200 {
			break
		}
		if res.StatusCode != 503 || i == 20 {
			t.Fatalf("a read while the store is up: %d %s", res.StatusCode, data)
		}
		time.Sleep(250 * time.Millisecond)
	}
	srv.Stop(t)
	res, data := g.getUsage(t, "route=agent_job&projectId=p1", bearerHdr(adminKey), 503)
	if e := decodeError(t, res, data); e.Code != "limiter_unavailable" || res.Header.Get("Retry-After") != "1" || strings.Contains(string(data), `"limits"`) {
		t.Fatalf("%v %s", res.Header, data)
	}
}
