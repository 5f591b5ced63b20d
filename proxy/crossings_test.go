package proxy

import (
	"net/http"
	"slices"
	"sync"
	"testing"

	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/engine"
	"github.com/docsgate/gateway/internal/redistest"
)

// With notifications on, the decision that reaches a threshold of a limit, and the tenant's
// first refusal, are handed over once per tenant and window, with what an event says.
func TestCrossingsHandedOver(t *testing.T) {
	stores(t, func(t *testing.T, withStore gatewayOpt, _ *redistest.Server) {
		up := newUpstream(t, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(201) })
		var mu sync.Mutex
		var got []engine.Crossing
		notifications := func(c *cfgT) {
			c.Notifications.Webhooks = []config.Webhook{{Name: "h", URL: "http://127.0.0.1:1/", Secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", AllowPrivateAddresses: true}}
			c.Limits["assistant_per_org"] = config.Limit{Limit: ptr(int64(5)), Window: "hour", Thresholds: &[]float64{0.6, 1}}
		}
		g := newGatewayOptions(t, up, nil, func(o *engine.Options) {
			o.Crossings = func(c engine.Crossing) { mu.Lock(); got = append(got, c); mu.Unlock() }
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

// A limit by ip (one counter per visitor) hands over only the crossings it asks for itself:
// none with the defaults that a tenant's limit gets, its own thresholds when it sets them,
// and a first refusal only when its events list quota.exhausted.
func TestVisitorLimitsCrossOnlyWhatTheySet(t *testing.T) {
	for _, tc := range []struct {
		name       string
		limit      config.Limit
		thresholds [][]float64 // of each crossing, in order
		exhausted  []bool
	}{
		{"defaults", config.Limit{}, nil, nil},
		{"thresholds", config.Limit{Thresholds: &[]float64{0.5}}, [][]float64{{0.5}}, []bool{false}},
		{"events", config.Limit{Events: &[]string{config.EventThresholdCrossed, config.EventExhausted}},
			[][]float64{{0.8, 1}, nil}, []bool{false, true}}, // the default thresholds, both at 2 of 2
	} {
		t.Run(tc.name, func(t *testing.T) {
			up := newUpstream(t, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(201) })
			var mu sync.Mutex
			var got []engine.Crossing
			notifications := func(c *cfgT) {
				c.Notifications.Webhooks = []config.Webhook{{Name: "h", URL: "http://127.0.0.1:1/", Secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", AllowPrivateAddresses: true}}
				l := tc.limit
				l.Limit, l.Window = ptr(int64(2)), "hour"
				c.Limits = map[string]config.Limit{"assistant_per_ip": l}
			}
			g := newGatewayOptions(t, up, nil, func(o *engine.Options) {
				o.Crossings = func(c engine.Crossing) {
					if c.Limit == "assistant_per_ip" {
						mu.Lock()
						got = append(got, c)
						mu.Unlock()
					}
				}
			}, notifications)
			for i := 1; i <= 3; i++ {
				res, data := g.do(t, "POST", "/discovery/v2/assistant/acme/message", jsonHdr(assistantKey), assistantBody)
				if want := map[bool]int{true: 201, false: 429}[i <= 2]; res.StatusCode != want {
					t.Fatalf("request %d: %d %s", i, res.StatusCode, data)
				}
			}
			mu.Lock()
			defer mu.Unlock()
			if len(got) != len(tc.exhausted) {
				t.Fatalf("crossings of the visitor's limit: %+v, want %d", got, len(tc.exhausted))
			}
			for i, c := range got {
				if c.By != "ip" || !slices.Equal(c.Thresholds, tc.thresholds[i]) || c.Exhausted != tc.exhausted[i] {
					t.Errorf("crossing %d: %+v", i, c)
				}
			}
		})
	}
}
