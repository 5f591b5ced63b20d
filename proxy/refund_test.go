package proxy

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/docsgate/gateway/config"
)

// Issue 20, finding 2: in prefix mode an invented key passes the family check; the upstream
// refuses it, and the request's counts are given back, so invented keys cannot spend a
// tenant's quota.

// keyCheckingUpstream answers 401 (or status) to every key but good ones, as the platform
// does.
func keyCheckingUpstream(t *testing.T, status int, good ...string) *upstream {
	return newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		for _, k := range good {
			if r.Header.Get("Authorization") == "Bearer "+k {
				if strings.HasPrefix(r.URL.Path, "/discovery/") {
					w.Header().Set("Content-Type", "text/plain; charset=utf-8")
					_, _ = io.WriteString(w, "0:\"hi\"\nd:{\"finishReason\":\"stop\"}\n")
					return
				}
				w.WriteHeader(http.StatusCreated)
				_, _ = io.WriteString(w, `{"id":"j"}`)
				return
			}
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, `{"error":"Invalid API key."}`)
	})
}

// usedOf reads a counter through the gateway's usage read-back.
func usedOf(t *testing.T, g *gateway, what, subject, limit string) int64 {
	t.Helper()
	us, err := g.eng.Usage(context.Background(), what, subject)
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range us {
		if u.Name == limit {
			return u.Used
		}
	}
	t.Fatalf("no %s in %+v", limit, us)
	return 0
}

// eventually polls cond (refunds run after the answer) for up to 5 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestInventedKeysDoNotSpendTheQuota(t *testing.T) {
	up := keyCheckingUpstream(t, http.StatusUnauthorized, adminKey)
	g := newGateway(t, up, func(c *cfgT) {
		c.Limits = map[string]config.Limit{"agent_job_per_project": {Limit: limitPtr(3)}}
		c.Auth.FailureLimit = 0 // this test is about the quota; the budget has its own
	})
	for i := range 5 {
		res, data := g.do(t, "POST", "/v2/agent/victim/job", jsonHdr("svc_invented"+strings.Repeat("x", i)+"SECRET"), agentBody)
		if res.StatusCode != 401 || !strings.Contains(string(data), "Invalid API key") {
			t.Fatalf("invented key %d: %d %s", i, res.StatusCode, data)
		}
	}
	eventually(t, "5 refunds counted", func() bool {
		return g.counter(t, "gateway_ratelimit_refunds_total", "limit", "agent_job_per_project", "reason", "upstream_401") == 5
	})
	if used := usedOf(t, g, "project", "victim", "agent_job_per_project"); used != 0 {
		t.Fatalf("invented keys spent %d of the project's quota", used)
	}
	for i := range 3 {
		if res, data := g.do(t, "POST", "/v2/agent/victim/job", jsonHdr(adminKey), agentBody); res.StatusCode != 201 {
			t.Fatalf("the owner's request %d: %d %s", i, res.StatusCode, data)
		}
	}
	if res, _ := g.do(t, "POST", "/v2/agent/victim/job", jsonHdr(adminKey), agentBody); res.StatusCode != 429 {
		t.Fatalf("the owner's fourth request: %d, want 429", res.StatusCode)
	}
	// An admitted request is never given back.
	time.Sleep(100 * time.Millisecond)
	if used := usedOf(t, g, "project", "victim", "agent_job_per_project"); used != 3 {
		t.Fatalf("used %d after the owner's 3 requests", used)
	}
	var refunds int
	for _, e := range g.logs.All() {
		if e.Message == "request" && e.ContextMap()["refund"] == "upstream_401" {
			refunds++
		}
	}
	if refunds != 5 {
		t.Fatalf("%d access-log lines with refund=upstream_401, want 5", refunds)
	}
	g.assertNoSecrets(t)
}

// On an assistant route a 403 gives back all three limits of the request, per key, org
// and IP, in one store call.
func TestUpstream403RefundsEveryLimit(t *testing.T) {
	up := keyCheckingUpstream(t, http.StatusForbidden, assistantKey)
	g := newGateway(t, up, func(c *cfgT) { c.Auth.FailureLimit = 0 })
	for range 4 {
		res, _ := g.do(t, "POST", "/discovery/v1/assistant/acme/message", jsonHdr("svc_dsc_inventedSECRET"), assistantBody)
		if res.StatusCode != 403 {
			t.Fatalf("%d", res.StatusCode)
		}
	}
	for _, l := range []string{"assistant_per_key", "assistant_per_org", "assistant_per_ip"} {
		eventually(t, "refunds of "+l, func() bool {
			return g.counter(t, "gateway_ratelimit_refunds_total", "limit", l, "reason", "upstream_403") == 4
		})
	}
	if used := usedOf(t, g, "org", "acme", "assistant_per_org"); used != 0 {
		t.Fatalf("assistant_per_org used %d", used)
	}
	if used := usedOf(t, g, "ip", "127.0.0.1", "assistant_per_ip"); used != 0 {
		t.Fatalf("assistant_per_ip used %d", used)
	}
}

// A request admitted while a shadow limit is spent took the enforced limit and the shadow
// limits that still had room, in its one decision: a refund gives back exactly those, and the
// spent shadow limit's count, taken by an earlier request, stays.
func TestRefundAfterShadowDenial(t *testing.T) {
	up := keyCheckingUpstream(t, http.StatusUnauthorized, adminKey)
	g := newGateway(t, up, func(c *cfgT) {
		c.Auth.FailureLimit = 0
		c.Limits = map[string]config.Limit{
			"agent_job_per_project": {Limit: limitPtr(5)},
			"shadow_per_project":    {Limit: limitPtr(1), Window: "hour", By: "project", Mode: "shadow"},
			"shadow_roomy":          {Limit: limitPtr(100), Window: "hour", By: "project", Mode: "shadow"},
		}
		c.Routes = append(c.Routes, config.Route{Name: "agent_job", Limits: &[]string{"agent_job_per_project", "shadow_per_project", "shadow_roomy"}})
	})
	if res, _ := g.do(t, "POST", "/v2/agent/sh/job", jsonHdr(adminKey), agentBody); res.StatusCode != 201 {
		t.Fatalf("%d", res.StatusCode)
	}
	if res, _ := g.do(t, "POST", "/v2/agent/sh/job", jsonHdr("svc_inventedSECRET"), agentBody); res.StatusCode != 401 {
		t.Fatalf("%d", res.StatusCode)
	}
	eventually(t, "the refund", func() bool {
		return g.counter(t, "gateway_ratelimit_refunds_total", "limit", "agent_job_per_project", "reason", "upstream_401") == 1
	})
	for l, want := range map[string]float64{"shadow_per_project": 0, "shadow_roomy": 1} {
		if n := g.counter(t, "gateway_ratelimit_refunds_total", "limit", l, "reason", "upstream_401"); n != want {
			t.Fatalf("%s refunded %v times, want %v (taken by the refused request: %v)", l, n, want, want == 1)
		}
		if used := usedOf(t, g, "project", "sh", l); used != 1 {
			t.Fatalf("%s used %d, want 1 (the owner's request)", l, used)
		}
	}
	if used := usedOf(t, g, "project", "sh", "agent_job_per_project"); used != 1 {
		t.Fatalf("agent_job_per_project used %d, want 1 (the owner's request)", used)
	}
}

// In prefix mode the budget counts what the upstream refused: past auth.failure_limit the
// client gets 429 too_many_auth_failures and nothing more is forwarded. The gateway's own
// 401s cost nothing in prefix mode and do not count.
func TestUpstreamRefusalsSpendTheFailureBudget(t *testing.T) {
	up := keyCheckingUpstream(t, http.StatusUnauthorized, adminKey)
	g := newGateway(t, up, func(c *cfgT) { c.Auth.FailureLimit = 3 })
	for range 10 {
		if res, _ := g.do(t, "POST", "/v2/agent/b/job", hdr("Content-Type", "application/json"), agentBody); res.StatusCode != 401 {
			t.Fatalf("no key: %d", res.StatusCode)
		}
	}
	if res, _ := g.do(t, "POST", "/v2/agent/b/job", jsonHdr(adminKey), agentBody); res.StatusCode != 201 {
		t.Fatalf("the gateway's own 401s spent the budget in prefix mode: %d", res.StatusCode)
	}
	for i := range 3 {
		if res, _ := g.do(t, "POST", "/v2/agent/b/job", jsonHdr("svc_inventedSECRET"), agentBody); res.StatusCode != 401 {
			t.Fatalf("invented key %d: %d", i, res.StatusCode)
		}
	}
	res, data := g.do(t, "POST", "/v2/agent/b/job", jsonHdr("svc_inventedSECRET"), agentBody)
	if res.StatusCode != 429 || !strings.Contains(string(data), `"code":"too_many_auth_failures"`) || res.Header.Get("Retry-After") == "" {
		t.Fatalf("past the budget: %d %s", res.StatusCode, data)
	}
	if res, _ := g.do(t, "POST", "/v2/agent/b/job", jsonHdr(adminKey), agentBody); res.StatusCode != 429 {
		t.Fatalf("a valid key from the same client past the budget: %d", res.StatusCode)
	}
	if n := len(up.requests()); n != 4 {
		t.Fatalf("the upstream saw %d requests, want 4 (1 valid, 3 refused)", n)
	}
}
