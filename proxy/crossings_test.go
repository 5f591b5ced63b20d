package proxy

import (
	"net/http"
	"slices"
	"sync"
	"testing"

	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/internal/redistest"
)

// With notifications on, the decision that reaches a threshold of a limit, and the tenant's
// first refusal, are handed over once per tenant and window, with what an event says.
func TestCrossingsHandedOver(t *testing.T) {
	stores(t, func(t *testing.T, withStore gatewayOpt, _ *redistest.Server) {
		up := newUpstream(t, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(201) })
		var mu sync.Mutex
		var got []Crossing
		notifications := func(c *cfgT) {
			c.Notifications.Webhooks = []config.Webhook{{Name: "h", URL: "http://127.0.0.1:1/", Secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", AllowPrivateAddresses: true}}
			c.Limits["assistant_per_org"] = config.Limit{Limit: ptr(int64(5)), Window: "hour", Thresholds: &[]float64{0.6, 1}}
		}
		g := newGatewayOptions(t, up, nil, func(o *Options) {
			o.Crossings = func(c Crossing) { mu.Lock(); got = append(got, c); mu.Unlock() }
		}, withStore, setLimit("assistant_per_org", 5, "hour"), notifications)
		h := jsonHdr(assistantKey)
		for i := 1; i <= 7; i++ {
			res, data := g.do(t, "POST", "/discovery/v2/assistant/acme/message", h, assistantBody)
			if want := map[bool]int{true: 201, false: 429}[i <= 5]; res.StatusCode != want {
				t.Fatalf("request %d: %d %s", i, res.StatusCode, data)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		// assistant_per_key and assistant_per_ip (10000) cross nothing; their defaults
		// [0.8, 1] are far.
		if len(got) != 3 {
			t.Fatalf("crossings: %+v", got)
		}
		for i, want := range []struct {
			thresholds []float64
			exhausted  bool
			used       int64
		}{{[]float64{0.6}, false, 3}, {[]float64{1}, false, 5}, {nil, true, 5}} {
			c := got[i]
			if c.Limit != "assistant_per_org" || c.Tenant != "acme" || c.By != "org" || c.Org != "acme" || c.Quota != 5 ||
				c.Used != want.used || !slices.Equal(c.Thresholds, want.thresholds) || c.Exhausted != want.exhausted ||
				c.WindowStart.IsZero() || c.WindowStart.Minute() != 0 || c.Time.IsZero() {
				t.Errorf("crossing %d: %+v", i, c)
			}
		}
	})
}
