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
	"go.uber.org/zap"

	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/limits"
	"github.com/docsgate/gateway/metrics"
)

// countingLimiter counts refreshes; while block is set, a refresh waits for it to close.
type countingLimiter struct {
	*limits.Memory
	refreshes atomic.Int32
	block     atomic.Pointer[chan struct{}]
}

func (l *countingLimiter) Refresh(ctx context.Context, hold string, hits []limits.Hit) ([]string, error) {
	l.refreshes.Add(1)
	if b := l.block.Load(); b != nil {
		<-*b
	}
	return l.Memory.Refresh(ctx, hold, hits)
}

// An answer's holds are refreshed every quarter of reserve_ttl while it lives; stop waits for
// a refresh under way (a settle after it cannot be undone by it), and none follows it.
func TestHoldKeeperRefreshesUntilStopped(t *testing.T) {
	lim := &countingLimiter{Memory: limits.NewMemory()}
	g := &Gateway{limiter: lim, log: zap.NewNop()}
	s := &scope{route: &route{name: "r"}, hold: "h"}
	s.held = []limits.Hit{{Rule: &limits.Rule{Name: "st", Limit: 1, Unit: limits.Streams, ReserveTTL: 200 * time.Millisecond}, ID: "x"}}
	g.keepHolds(s)
	time.Sleep(400 * time.Millisecond)
	if n := lim.refreshes.Load(); n < 3 {
		t.Fatalf("%d refreshes in 400 ms, every 50 ms", n)
	}
	block := make(chan struct{})
	lim.block.Store(&block)
	for n := lim.refreshes.Load(); lim.refreshes.Load() == n; {
		time.Sleep(5 * time.Millisecond) // until a refresh is under way, blocked
	}
	stopped := make(chan struct{})
	go func() { s.keeper.stop(); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("stop returned while a refresh was under way")
	case <-time.After(200 * time.Millisecond):
	}
	close(block)
	<-stopped
	n := lim.refreshes.Load()
	time.Sleep(200 * time.Millisecond)
	if m := lim.refreshes.Load(); m != n {
		t.Fatalf("%d refreshes after stop", m-n)
	}
}

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
	gw, err := New(Options{Config: &cfg, Logger: zap.NewNop(), Metrics: metrics.New(reg), Limiter: mem})
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
	us, err := gw.Usage(context.Background(), "org", "acme")
	i := slices.IndexFunc(us, func(u limits.Usage) bool { return u.Name == "tok" })
	if err != nil || i < 0 || us[i].Used != 11 || us[i].Reserved != 0 {
		t.Fatalf("usage %+v %v, want the answer's 11 tokens charged and nothing held", us, err)
	}
}
