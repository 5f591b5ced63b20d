package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/docsgate/gateway/apierror"
	"github.com/docsgate/gateway/auth"
)

// countingLookup counts the lookups that reach the registry.
type countingLookup struct {
	KeyLookup
	n atomic.Int64
}

func (c *countingLookup) Lookup(ctx context.Context, digest string) (auth.Entry, bool, error) {
	c.n.Add(1)
	return c.KeyLookup.Lookup(ctx, digest)
}

// Registry mode: past auth.failure_limit failed authentications a client gets 429
// too_many_auth_failures with Retry-After, and none of its keys is looked up, a valid one
// included; other clients are not affected; IPv6 clients are grouped by their /64; a key of
// the wrong family (403) is no failed authentication.
func TestAuthFailureLimit(t *testing.T) {
	reg, err := auth.NewMemoryRegistry([]auth.Entry{
		{Digest: auth.Digest(adminKey), Kind: "admin", Org: "acme", Projects: []string{"p1"}, Created: time.Now()},
	})
	if err != nil {
		t.Fatal(err)
	}
	lookups := &countingLookup{KeyLookup: reg}
	up := newUpstream(t, nil)
	g := newGatewayWith(t, up, lookups, func(c *cfgT) {
		c.Auth.FailureLimit = 3
		c.ClientIP.TrustedProxies = []string{"127.0.0.1/32"}
	})
	send := func(ip, key string) (int, apierror.Body, string) {
		t.Helper()
		h := jsonHdr(key)
		h.Set("X-Forwarded-For", ip)
		res, data := g.do(t, "POST", "/v2/agent/p1/job", h, agentBody)
		var e apierror.Body
		if res.StatusCode >= 400 {
			decodeError(t, res, data) // the shape every error has
			if err := json.Unmarshal(data, &e); err != nil {
				t.Fatal(err)
			}
		}
		return res.StatusCode, e, res.Header.Get("Retry-After")
	}
	const ip = "198.51.100.1"
	for range 3 {
		if code, _, _ := send(ip, "svc_dsc_wrongfamilySECRET"); code != 403 {
			t.Fatalf("wrong key type: %d", code)
		}
	}
	for i := range 3 {
		if code, _, _ := send(ip, fmt.Sprintf("svc_invented%dSECRET", i)); code != 401 {
			t.Fatalf("invented key %d: %d, want 401", i, code)
		}
	}
	if n := lookups.n.Load(); n != 3 {
		t.Fatalf("%d lookups, want 3", n)
	}
	for _, key := range []string{"svc_invented9SECRET", adminKey} {
		code, e, retry := send(ip, key)
		secs, _ := strconv.Atoi(retry)
		if code != 429 || e.Code != "too_many_auth_failures" || secs < 1 || secs > 60 || e.RetryAfter == nil || *e.RetryAfter != int64(secs) {
			t.Fatalf("past the limit: %d %+v, Retry-After %q", code, e, retry)
		}
	}
	if n := lookups.n.Load(); n != 3 {
		t.Fatalf("%d lookups, want 3: keys were looked up past the limit", n)
	}
	if code, _, _ := send("198.51.100.2", adminKey); code != 201 {
		t.Fatalf("another client with a valid key: %d", code)
	}

	// IPv6: the /64 is one client.
	for i := range 3 {
		if code, _, _ := send(fmt.Sprintf("2001:db8::%d", i+1), "svc_inventedSECRET"); code != 401 {
			t.Fatalf("IPv6 failure %d: %d", i, code)
		}
	}
	if code, e, _ := send("2001:db8::ffff", adminKey); code != 429 || e.Code != "too_many_auth_failures" {
		t.Fatalf("same /64: %d %+v", code, e)
	}
	if code, _, _ := send("2001:db8:0:1::1", adminKey); code != 201 {
		t.Fatalf("another /64: %d", code)
	}
	if n := g.counter(t, "gateway_auth_rejections_total", "reason", "too_many_failures"); n != 3 {
		t.Fatalf("gateway_auth_rejections_total{reason=too_many_failures} = %v, want 3", n)
	}
	if n := g.counter(t, "gateway_auth_rejections_total", "reason", "unknown_key"); n != 6 {
		t.Fatalf("gateway_auth_rejections_total{reason=unknown_key} = %v, want 6", n)
	}
	g.assertNoSecrets(t)
}

// failure_limit: 0 turns the budget off; prefix mode has none (a refused key costs no lookup).
func TestAuthFailureLimitOff(t *testing.T) {
	reg, err := auth.NewMemoryRegistry(nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, g := range map[string]*gateway{
		"failure_limit 0": newGatewayWith(t, newUpstream(t, nil), reg, func(c *cfgT) { c.Auth.FailureLimit = 0 }),
		"prefix mode":     newGateway(t, newUpstream(t, nil)),
	} {
		for i := range 40 {
			res, data := g.do(t, "POST", "/v2/agent/p1/job", jsonHdr("nope_"+strconv.Itoa(i)), agentBody)
			if res.StatusCode != 401 {
				t.Fatalf("%s: failure %d answered %d %s", name, i, res.StatusCode, data)
			}
		}
		if g.gw.keys.failures.Len() != 0 {
			t.Fatalf("%s: failures were counted", name)
		}
	}
}
