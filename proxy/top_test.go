package proxy

import (
	"errors"
	"testing"
	"time"

	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/internal/redistest"
	"github.com/docsgate/gateway/limits"
)

// Registered keys are listed by digest with their label, org and plan, against their plan's
// limit; a GCRA limit lists the burst in use; unknown names wrap limits.ErrUnknownLimit.
func TestTopRegisteredKeys(t *testing.T) {
	stores(t, func(t *testing.T, withStore gatewayOpt, _ *redistest.Server) {
		now := time.Now()
		const goldKey, plainKey = "svc_dsc_goldTOPSECRET", "svc_dsc_plainTOPSECRET"
		reg, err := auth.NewMemoryRegistry([]auth.Entry{
			{Digest: auth.Digest(goldKey), Kind: "assistant", Org: "acme", Domains: []string{"*"}, Plan: "gold", Label: "docs site", Created: now},
			{Digest: auth.Digest(plainKey), Kind: "assistant", Org: "beta", Domains: []string{"*"}, Label: "widget", Created: now},
		})
		if err != nil {
			t.Fatal(err)
		}
		g := newGatewayWith(t, newUpstream(t, nil), reg, withStore, setLimit("assistant_per_key", 10, "month"), func(c *cfgT) {
			c.Plans = map[string]map[string]config.Limit{"gold": {"assistant_per_key": {Limit: limitPtr(100)}}}
			c.Limits["assistant_per_ip"] = config.Limit{Limit: limitPtr(50), Window: "hour", Algorithm: "gcra"}
		})
		for range 6 {
			g.do(t, "POST", "/discovery/v1/assistant/a/message", jsonHdr(goldKey), assistantBody)
		}
		for range 4 {
			g.do(t, "POST", "/discovery/v1/assistant/b/message", jsonHdr(plainKey), assistantBody)
		}
		lists, err := g.eng.Top(t.Context(), "assistant_per_key", 10)
		if err != nil || len(lists) != 1 {
			t.Fatal(lists, err)
		}
		l := lists[0]
		if l.Window != "month" || l.Unit != "requests" || len(l.Tenants) != 2 {
			t.Fatalf("%+v", l)
		}
		plain, gold := l.Tenants[0], l.Tenants[1] // 4/10 before 6/100
		if plain.ID != auth.Digest(plainKey) || plain.Label != "widget" || plain.Org != "beta" || plain.Plan != "" ||
			plain.Used != 4 || plain.Limit != 10 || plain.Fraction != 0.4 {
			t.Fatalf("plain key: %+v", plain)
		}
		if gold.ID != auth.Digest(goldKey) || gold.Label != "docs site" || gold.Org != "acme" || gold.Plan != "gold" ||
			gold.Used != 6 || gold.Limit != 100 || gold.Remaining != 94 {
			t.Fatalf("gold key: %+v", gold)
		}
		ip, err := g.eng.Top(t.Context(), "assistant_per_ip", 10)
		if err != nil || len(ip[0].Tenants) != 1 || ip[0].Tenants[0].Used != 10 || ip[0].Tenants[0].Limit != 50 {
			t.Fatalf("gcra top: %+v %v", ip, err)
		}
		if _, err := g.eng.Top(t.Context(), "nope", 10); !errors.Is(err, limits.ErrUnknownLimit) {
			t.Fatalf("unknown limit: %v", err)
		}
		all, err := g.eng.Top(t.Context(), "", 1)
		if err != nil || len(all) != 4 || all[2].Limit != "assistant_per_key" || len(all[2].Tenants) != 1 || all[2].Tenants[0].Label != "widget" {
			t.Fatalf("every limit, n=1: %+v %v", all, err)
		}
	})
}
