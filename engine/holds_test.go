package engine

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/docsgate/gateway/limits"
	"github.com/docsgate/gateway/metrics"
)

// countingLimiter counts refreshes; while block is set, a refresh waits for it to close.
type countingLimiter struct {
	*limits.Memory
	refreshes atomic.Int32
	block     atomic.Pointer[chan struct{}]
}

func (l *countingLimiter) Refresh(ctx context.Context, hold string, hits []limits.Hit, passed func(*limits.Rule) int64) ([]string, error) {
	l.refreshes.Add(1)
	if b := l.block.Load(); b != nil {
		<-*b
	}
	return l.Memory.Refresh(ctx, hold, hits, passed)
}

// An answer's holds are refreshed every quarter of reserve_ttl while it lives; stop waits for
// a refresh under way (a settle after it cannot be undone by it), and none follows it.
func TestHoldKeeperRefreshesUntilStopped(t *testing.T) {
	lim := &countingLimiter{Memory: limits.NewMemory()}
	e := New(Options{Limiter: lim, Metrics: metrics.New(prometheus.NewRegistry()), Logger: zap.NewNop()})
	a := &Admission{hold: "h"}
	a.held = []limits.Hit{{Rule: &limits.Rule{Name: "st", Limit: 1, Unit: limits.Streams, ReserveTTL: 200 * time.Millisecond}, ID: "x"}}
	e.KeepHolds(a, "r", nil)
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
	go func() { a.keeper.stop(); close(stopped) }()
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
