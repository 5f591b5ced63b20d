package notify

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/docsgate/gateway/internal/redistest"
)

// outboxes runs f against each Outbox: in process, and in a real redis-server.
func outboxes(t *testing.T, max int, f func(t *testing.T, box Outbox)) {
	t.Run("memory", func(t *testing.T) { f(t, NewMemory(max)) })
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Start(t)
		f(t, NewRedis(srv.Client(t), "gw", max))
	})
}

var t0 = time.Date(2026, 11, 27, 9, 0, 0, 0, time.UTC)

func delivery(id, endpoint string, at time.Time) Delivery {
	return Delivery{Key: DeliveryKey(id, endpoint), ID: id, Endpoint: endpoint, Type: "ping",
		Body: []byte(`{"type":"ping","id":"` + id + `"}`), Created: at, Next: at}
}

func keys(ds []Delivery) []string {
	var out []string
	for _, d := range ds {
		out = append(out, d.Key)
	}
	return out
}

func must[T any](t *testing.T) func(v T, err error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
}

func TestOutboxLifecycle(t *testing.T) {
	outboxes(t, 100, func(t *testing.T, box Outbox) {
		ctx := context.Background()
		ok := must[bool](t)
		list := must[[]Delivery](t)
		list(box.Add(ctx, []Delivery{delivery("evt_a", "h", t0), delivery("evt_b", "h", t0.Add(time.Second))}))
		// Adding a key already held leaves it as it is (two replicas publishing one event).
		again := delivery("evt_a", "h", t0.Add(time.Hour))
		again.Body = []byte(`{"changed":true}`)
		list(box.Add(ctx, []Delivery{again}))
		if p, d, _ := box.Count(ctx); p != 2 || d != 0 {
			t.Fatalf("count %d %d", p, d)
		}
		if ds := list(box.Claim(ctx, t0.Add(-time.Millisecond), 10, time.Minute)); len(ds) != 0 {
			t.Fatalf("claimed before due: %v", keys(ds))
		}
		ds := list(box.Claim(ctx, t0, 10, time.Minute))
		if len(ds) != 1 || ds[0].Key != "evt_a/h" || string(ds[0].Body) != `{"type":"ping","id":"evt_a"}` || !ds[0].Created.Equal(t0) {
			t.Fatalf("claim: %+v", ds)
		}
		a := ds[0]
		// Leased: nobody else gets it until the lease runs out.
		if ds := list(box.Claim(ctx, t0.Add(59*time.Second), 10, time.Minute)); len(ds) != 1 || ds[0].Key != "evt_b/h" {
			t.Fatalf("second claim: %v", keys(ds))
		}
		b := ds[0]
		_ = b
		// The lease runs out: another claimer takes evt_a over, and the first one's
		// settling is refused.
		taken := list(box.Claim(ctx, t0.Add(61*time.Second), 10, time.Minute))
		if len(taken) != 1 || taken[0].Key != "evt_a/h" {
			t.Fatalf("takeover: %v", keys(taken))
		}
		if ok(box.Done(ctx, a)) {
			t.Fatal("a stale claim removed a delivery another claimer holds")
		}
		// A failed attempt: pending again at Next, its attempts and error kept.
		r := taken[0]
		r.Attempts, r.LastError, r.Next = 1, "answered 500", t0.Add(2*time.Minute)
		if !ok(box.Retry(ctx, r)) {
			t.Fatal("retry refused")
		}
		if ok(box.Retry(ctx, r)) {
			t.Fatal("a settled claim settled twice")
		}
		pend := list(box.List(ctx, false, 10))
		if len(pend) != 2 || pend[1].Key != "evt_a/h" || pend[1].Attempts != 1 || pend[1].LastError != "answered 500" {
			t.Fatalf("pending: %+v", pend)
		}
		ds = list(box.Claim(ctx, t0.Add(2*time.Minute), 10, time.Minute))
		if len(ds) != 2 {
			t.Fatalf("due again: %v", keys(ds))
		}
		for _, d := range ds {
			if d.Key == "evt_a/h" {
				d.Attempts, d.LastError = 2, "answered 410"
				if !ok(box.Kill(ctx, d, t0.Add(3*time.Minute))) {
					t.Fatal("kill refused")
				}
			} else if !ok(box.Done(ctx, d)) {
				t.Fatal("done refused")
			}
		}
		if p, d, _ := box.Count(ctx); p != 0 || d != 1 {
			t.Fatalf("count %d %d", p, d)
		}
		dead := list(box.List(ctx, true, 10))
		if len(dead) != 1 || !dead[0].Dead || dead[0].Attempts != 2 || dead[0].LastError != "answered 410" || !dead[0].Next.Equal(t0.Add(3*time.Minute)) {
			t.Fatalf("dead: %+v", dead)
		}
		if ds := list(box.Claim(ctx, t0.Add(time.Hour), 10, time.Minute)); len(ds) != 0 {
			t.Fatalf("a dead letter was claimed: %v", keys(ds))
		}
		// Requeue: pending again with a fresh retry budget; only a dead letter is requeued.
		if ok(box.Requeue(ctx, "evt_none/h", t0)) {
			t.Fatal("requeued nothing")
		}
		if !ok(box.Requeue(ctx, "evt_a/h", t0.Add(time.Hour))) {
			t.Fatal("requeue refused")
		}
		if ok(box.Requeue(ctx, "evt_a/h", t0.Add(time.Hour))) {
			t.Fatal("a pending delivery was requeued")
		}
		ds = list(box.Claim(ctx, t0.Add(time.Hour), 10, time.Minute))
		if len(ds) != 1 || ds[0].Attempts != 0 || ds[0].Dead || !ds[0].Created.Equal(t0.Add(time.Hour)) {
			t.Fatalf("requeued: %+v", ds)
		}
		// Drop removes it whatever its state, and its claim with it.
		if !ok(box.Drop(ctx, "evt_a/h")) || ok(box.Drop(ctx, "evt_a/h")) {
			t.Fatal("drop")
		}
		if ok(box.Done(ctx, ds[0])) {
			t.Fatal("a dropped delivery was settled")
		}
		if p, d, _ := box.Count(ctx); p != 0 || d != 0 {
			t.Fatalf("count %d %d", p, d)
		}
		if _, err := box.Add(ctx, []Delivery{{Key: "x"}}); err != ErrInvalid {
			t.Fatalf("invalid delivery: %v", err)
		}
	})
}

// A full outbox drops its oldest deliveries, pending or dead, to take new ones, and says
// which.
func TestOutboxFullDropsOldest(t *testing.T) {
	outboxes(t, 3, func(t *testing.T, box Outbox) {
		ctx := context.Background()
		list := must[[]Delivery](t)
		for i := range 3 {
			list(box.Add(ctx, []Delivery{delivery(fmt.Sprintf("evt_%d", i), "h", t0.Add(time.Duration(i)*time.Second))}))
		}
		dropped := list(box.Add(ctx, []Delivery{delivery("evt_3", "h", t0.Add(3*time.Second)), delivery("evt_4", "h", t0.Add(4*time.Second))}))
		if got := keys(dropped); len(got) != 2 || got[0] != "evt_0/h" || got[1] != "evt_1/h" {
			t.Fatalf("dropped %v", got)
		}
		if got := keys(list(box.List(ctx, false, 10))); len(got) != 3 || got[0] != "evt_2/h" || got[2] != "evt_4/h" {
			t.Fatalf("left %v", got)
		}
	})
}

// A Once delivery (an event every replica detects) is taken once: not again after it was
// delivered, while a plain one with a key no longer held is taken again.
func TestOutboxOnce(t *testing.T) {
	outboxes(t, 100, func(t *testing.T, box Outbox) {
		ctx := context.Background()
		once := delivery("evt_once", "a", t0)
		once.Once = true
		plain := delivery("evt_plain", "a", t0)
		for round := range 2 {
			if _, err := box.Add(ctx, []Delivery{once, plain}); err != nil {
				t.Fatal(err)
			}
			claimed, err := box.Claim(ctx, t0, 10, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			want := []string{"evt_once/a", "evt_plain/a"}
			if round == 1 {
				want = want[1:]
			}
			if fmt.Sprint(keys(claimed)) != fmt.Sprint(want) {
				t.Fatalf("round %d claimed %v, want %v", round, keys(claimed), want)
			}
			for _, d := range claimed {
				if ok, err := box.Done(ctx, d); !ok || err != nil {
					t.Fatal(ok, err)
				}
			}
		}
	})
}
