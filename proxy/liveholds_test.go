package proxy

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/limits"
	"github.com/docsgate/gateway/metrics"
)

// A hold that expired all the same (its refreshes failed: here the store's clock jumps past
// its reserve_ttl) is charged when the answer ends, and gateway_ratelimit_holds_expired_total
// counts it.
func TestHoldExpiredUnderAnswerCounted(t *testing.T) {
	var skew atomic.Int64
	mem := limits.NewMemory(limits.WithClock(func() time.Time { return time.Now().Add(time.Duration(skew.Load())) }))
	release := make(chan struct{})
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		startUIStream(w)
		<-release
		io.WriteString(w, sse(`{"type":"text-delta","id":"t","delta":"Hello"}`,
			`{"type":"finish","finishReason":"stop","messageMetadata":{"usage":{"inputTokens":5,"outputTokens":6}}}`, `[DONE]`))
	})
	cfg := config.Defaults()
	cfg.Upstream.URL = up.URL
	tokens, reserve := int64(1000), int64(100)
	cfg.Limits = map[string]config.Limit{"tok": {Limit: &tokens, Window: "month", By: "org", Unit: "tokens", Reserve: &reserve, ReserveTTL: time.Hour}}
	cfg.Routes = []config.Route{{Name: "assistant_message_v2", Limits: &[]string{"tok"}}}
	reg := prometheus.NewRegistry()
	gw, err := newTestGateway(&cfg, mem, metrics.New(reg), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gw)
	defer srv.Close()
	g := &gateway{Server: srv, reg: reg, gw: gw}
	req, _ := http.NewRequest("POST", srv.URL+"/discovery/v2/assistant/acme/message", strings.NewReader(assistantBody))
	req.Header = jsonHdr(assistantKey)
	res, err := srv.Client().Do(req)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("%v %v", res, err)
	}
	skew.Store(int64(2 * time.Hour)) // the hold's hour has passed, unrefreshed
	close(release)
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	for deadline := time.Now().Add(5 * time.Second); g.counter(t, "gateway_ratelimit_holds_expired_total", "limit", "tok") != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a hold settled after it expired was not counted")
		}
	}
	us, err := gw.quota.engine.Usage(context.Background(), "org", "acme")
	i := slices.IndexFunc(us, func(u limits.Usage) bool { return u.Name == "tok" })
	if err != nil || i < 0 || us[i].Used != 11 || us[i].Reserved != 0 {
		t.Fatalf("usage %+v %v, want the answer's 11 tokens charged and nothing held", us, err)
	}
}
