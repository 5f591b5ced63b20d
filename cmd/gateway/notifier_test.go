package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/docsgate/gateway/engine"
	"github.com/docsgate/gateway/internal/redistest"
	"github.com/docsgate/gateway/limits"
	"github.com/docsgate/gateway/metrics"
	"github.com/docsgate/gateway/notify"
)

func testNotifier(t *testing.T, body string) *notifier {
	t.Helper()
	cfg, err := loadConfig(writeConfig(t, "upstream: {url: 'http://127.0.0.1:1'}\n"+body+
		fmt.Sprintf("notifications:\n  webhooks:\n    - {name: h, url: 'http://127.0.0.1:1/', secret: %q, allow_private_addresses: true}\n", hookSecret)))
	if err != nil {
		t.Fatal(err)
	}
	nt := newNotifier(cfg, metrics.New(prometheus.NewRegistry()), zap.NewNop())
	t.Cleanup(nt.close)
	return nt
}

// An event whose write into the outbox fails (Redis down) is kept and written once Redis is
// back: its crossing is marked in the counter already and would never be detected again.
func TestNotifierKeepsWhatItCannotWrite(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	nt := testNotifier(t, fmt.Sprintf("redis: {addrs: [%q]}\n", srv.Addr))
	ctx := context.Background()
	c := engine.Crossing{Limit: "assistant_per_org", Tenant: "acme", By: "org", WindowStart: time.Now().Truncate(time.Hour),
		Used: 8, Quota: 10, Thresholds: []float64{0.8}, Exhausted: true, Time: time.Now()}
	srv.Stop(t)
	nt.publish(ctx, eventsOf(c))
	if nt.unwritten.Len() != 2 {
		t.Fatalf("%d events kept, want 2", nt.unwritten.Len())
	}
	kept := nt.unwritten.Pop(2)
	nt.unwritten.PushFront(kept)
	ids := []string{kept[0].ID, kept[1].ID}
	srv.Restart(t)
	nt.writeUnwritten(ctx)
	if nt.unwritten.Len() != 0 {
		t.Fatalf("%d events still kept after Redis came back", nt.unwritten.Len())
	}
	pending, err := nt.box.List(ctx, false, 10)
	if err != nil || len(pending) != 2 || pending[0].ID == pending[1].ID || (pending[0].ID != ids[0] && pending[0].ID != ids[1]) {
		t.Fatalf("outbox holds %+v (%v), want the kept events %v", pending, err, ids)
	}
}

// failingOverrides lists one override until fail is set, then fails every read.
type failingOverrides struct {
	limits.QuotaStore
	calls atomic.Int32
	fail  atomic.Bool
	o     limits.Override
}

func (f *failingOverrides) Overrides(context.Context) ([]limits.Override, error) {
	f.calls.Add(1)
	if f.fail.Load() {
		return nil, errors.New("redis down")
	}
	return []limits.Override{f.o}, nil
}

// The watch of overrides' ends waits between reads whatever happens: an override past its
// expiry that cannot be read again (Redis down) is no reason to read in a loop.
func TestNotifierWatchNeverSpins(t *testing.T) {
	t.Parallel()
	nt := testNotifier(t, "")
	q := &failingOverrides{o: limits.Override{Limit: "assistant_per_org", ID: "acme", Value: 5, Expires: time.Now().Add(300 * time.Millisecond)}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { nt.watch(ctx, q, nil); close(done) }()
	time.Sleep(100 * time.Millisecond)
	q.fail.Store(true)
	time.Sleep(2 * time.Second)
	cancel()
	<-done
	if n := q.calls.Load(); n > 4 {
		t.Fatalf("%d reads of the overrides in about 2 s", n)
	}
}

// An outage of the outbox in the middle of a sustained flood ends while the flood goes on:
// the tenant's event kept meanwhile (with the visitors' beyond the bound of the unwritten
// dropped first) is written by the next retries, not once the flood stops.
func TestNotifierRetriesDuringFlood(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	nt := testNotifier(t, fmt.Sprintf("redis: {addrs: [%q]}\nlimits: {assistant_per_ip: {thresholds: [1.0]}}\n", srv.Addr))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	nt.start(ctx, nil, nil)
	var stop atomic.Bool
	flooding := make(chan struct{})
	go func() {
		defer close(flooding)
		// As fast as crossings come: faster than the writer takes them, so that its queue
		// never runs empty while the flood lasts.
		for i := 0; !stop.Load(); i++ {
			nt.crossed(visitorCrossing(i))
		}
	}()
	defer func() { stop.Store(true); <-flooding }()
	srv.Stop(t)
	nt.crossed(engine.Crossing{Limit: "assistant_per_org", Tenant: "acme", By: "org", WindowStart: time.Now().Truncate(time.Hour),
		Used: 8, Quota: 10, Thresholds: []float64{0.8}, Time: time.Now()})
	time.Sleep(1500 * time.Millisecond) // written and failed, kept among the unwritten
	srv.Restart(t)
	deadline := time.Now().Add(20 * time.Second)
	for {
		ds, err := nt.box.List(ctx, false, 100_000)
		if err == nil && slices.ContainsFunc(ds, func(d notify.Delivery) bool { return strings.Contains(string(d.Body), `"tenant":"acme"`) }) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the tenant's event is not in the outbox 20 s after Redis came back, the flood going on (%d held, %v)", len(ds), err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
