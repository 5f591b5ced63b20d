package notify

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

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

// shareDelivery is delivery of share s, due at.
func shareDelivery(id string, s Share, at time.Time) Delivery {
	d := delivery(id, "h", at)
	d.Limit, d.Visitor = s.Limit, s.Visitor
	return d
}

// outboxesAndCluster runs f as outboxes does, and on a Redis Cluster (the shares' keys are
// made inside the scripts, in the outbox's hash slot).
func outboxesAndCluster(t *testing.T, max int, f func(t *testing.T, box Outbox)) {
	outboxes(t, max, f)
	t.Run("cluster", func(t *testing.T) {
		c := redistest.StartCluster(t, 3)
		f(t, NewRedis(c.Client(t), "gw", max))
	})
}

// A full outbox makes room with the visitors' deliveries first: their dead letters, then the
// share holding the most, due first; a visitor's delivery never displaces a tenant's, and a
// tenant's displaces a tenant's only when no visitor's is held, the dead letters first.
func TestOutboxFullMakesRoomFairly(t *testing.T) {
	outboxesAndCluster(t, 6, func(t *testing.T, box Outbox) {
		ctx := context.Background()
		list := must[[]Delivery](t)
		at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Second) }
		add := func(d Delivery) string {
			t.Helper()
			return fmt.Sprint(keys(list(box.Add(ctx, []Delivery{d}))))
		}
		for i := range 4 {
			add(shareDelivery(fmt.Sprintf("evt_a%d", i), ipA, at(i)))
		}
		add(shareDelivery("evt_b0", ipB, at(10)))
		add(shareDelivery("evt_o0", orgs, at(20)))
		// A tenant's delivery leased, failed and killed stays a dead letter, counted.
		for _, tc := range []struct {
			in   Delivery
			drop string
		}{
			{shareDelivery("evt_o1", orgs, at(21)), "[evt_a0/h]"},
			{shareDelivery("evt_b1", ipB, at(11)), "[evt_a1/h]"},
			{shareDelivery("evt_b2", ipB, at(12)), "[evt_b0/h]"}, // a tie goes to the share adding
			{shareDelivery("evt_k0", keysT, at(30)), "[evt_a2/h]"},
			{shareDelivery("evt_o2", orgs, at(22)), "[evt_b1/h]"},
			{shareDelivery("evt_k1", keysT, at(31)), "[evt_a3/h]"},
			// Only tenants' and one visitor's left: the visitor's goes; then a visitor's is
			// refused, and a tenant's takes from the tenants' share holding the most.
			{shareDelivery("evt_o3", orgs, at(23)), "[evt_b2/h]"},
			{shareDelivery("evt_a9", ipA, at(9)), "[evt_a9/h]"},
			{shareDelivery("evt_k2", keysT, at(32)), "[evt_o0/h]"},
		} {
			if got := add(tc.in); got != tc.drop {
				t.Fatalf("adding %s dropped %s, want %s", tc.in.Key, got, tc.drop)
			}
		}
		if p, d, _ := box.Count(ctx); p != 6 || d != 0 {
			t.Fatalf("count %d %d", p, d)
		}
		// A tenant's dead letter goes before the tenants' pending deliveries.
		ds := list(box.Claim(ctx, at(100), 1, time.Minute))
		if len(ds) != 1 || ds[0].Key != "evt_o1/h" {
			t.Fatalf("claimed %v", keys(ds))
		}
		ds[0].Attempts, ds[0].LastError = 1, "answered 410"
		if ok, err := box.Kill(ctx, ds[0], at(100)); !ok || err != nil {
			t.Fatal(ok, err)
		}
		if got := add(shareDelivery("evt_k3", keysT, at(33))); got != "[evt_o1/h]" {
			t.Fatalf("adding beside a dead letter dropped %s", got)
		}
		if got := add(shareDelivery("evt_o4", orgs, at(24))); got != "[evt_k0/h]" {
			t.Fatalf("adding evt_o4 dropped %s", got)
		}
		if got := keys(list(box.List(ctx, false, 10))); fmt.Sprint(got) != "[evt_o2/h evt_o3/h evt_o4/h evt_k1/h evt_k2/h evt_k3/h]" {
			t.Fatalf("pending %v", got)
		}
	})
}

// Claims hand out the tenants' due deliveries first, then the visitors', each by when due;
// a visitors' dead letter makes room before any visitor's pending delivery.
func TestOutboxClaimsTenantsFirst(t *testing.T) {
	outboxes(t, 100, func(t *testing.T, box Outbox) {
		ctx := context.Background()
		list := must[[]Delivery](t)
		var ds []Delivery
		for i := range 5 {
			ds = append(ds, shareDelivery(fmt.Sprintf("evt_v%d", i), ipA, t0.Add(time.Duration(i)*time.Second)))
		}
		ds = append(ds, shareDelivery("evt_t1", orgs, t0.Add(10*time.Second)), shareDelivery("evt_t0", keysT, t0.Add(9*time.Second)),
			shareDelivery("evt_w0", ipB, t0.Add(-time.Second)), shareDelivery("evt_late", orgs, t0.Add(time.Hour)))
		list(box.Add(ctx, ds))
		got := keys(list(box.Claim(ctx, t0.Add(time.Minute), 4, time.Minute)))
		if fmt.Sprint(got) != "[evt_t0/h evt_t1/h evt_w0/h evt_v0/h]" {
			t.Fatalf("claimed %v", got)
		}
		got = keys(list(box.Claim(ctx, t0.Add(time.Minute), 10, time.Minute)))
		if fmt.Sprint(got) != "[evt_v1/h evt_v2/h evt_v3/h evt_v4/h]" {
			t.Fatalf("then claimed %v", got)
		}
		if p, d, _ := box.Count(ctx); p != 9 || d != 0 {
			t.Fatalf("count %d %d", p, d)
		}
		// Pending deliveries are listed by when due (a leased one when its lease runs out),
		// then key, whatever their share.
		if got := keys(list(box.List(ctx, false, 3))); fmt.Sprint(got) != "[evt_t0/h evt_t1/h evt_v0/h]" {
			t.Fatalf("listed %v", got)
		}
		// Kill a visitor's delivery: it makes room first; Drop and Requeue find it.
		claimed := list(box.Claim(ctx, t0.Add(2*time.Hour), 10, time.Minute))
		for _, d := range claimed {
			if d.Key == "evt_v2/h" {
				if ok, err := box.Kill(ctx, d, t0.Add(2*time.Hour)); !ok || err != nil {
					t.Fatal(ok, err)
				}
			}
		}
		if p, d, _ := box.Count(ctx); p != 8 || d != 1 {
			t.Fatalf("count %d %d", p, d)
		}
		if ok, err := box.Requeue(ctx, "evt_v2/h", t0.Add(3*time.Hour)); !ok || err != nil {
			t.Fatal("requeue", ok, err)
		}
		if ok, err := box.Drop(ctx, "evt_w0/h"); !ok || err != nil {
			t.Fatal("drop", ok, err)
		}
		// The tenants' leases ran out at one instant: by key, before the visitor's requeued.
		got = keys(list(box.Claim(ctx, t0.Add(3*time.Hour), 1, time.Minute)))
		if fmt.Sprint(got) != "[evt_late/h]" {
			t.Fatalf("claimed %v", got)
		}
		got = keys(list(box.List(ctx, false, 100)))
		if len(got) != 8 || slices.Contains(got, "evt_w0/h") || !slices.Contains(got, "evt_v2/h") {
			t.Fatalf("pending %v", got)
		}
	})
}

// What an earlier release wrote (due, dead and age only, records without a share) is the
// tenants' share of no limit: claimed, settled, made room with, and its age entries go with it.
func TestOutboxReadsEarlierLayout(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	box := NewRedis(c, "gw", 3)
	base := "gw:notify:{notify}:"
	for i, id := range []string{"evt_old0", "evt_old1"} {
		d := delivery(id, "h", t0.Add(time.Duration(i)*time.Second))
		rec, _ := json.Marshal(d)
		c.HSet(ctx, base+"items", d.Key, rec)
		c.ZAdd(ctx, base+"due", redis.Z{Score: float64(ms(d.Next)), Member: d.Key})
		c.ZAdd(ctx, base+"age", redis.Z{Score: float64(ms(d.Created)), Member: d.Key})
	}
	list := must[[]Delivery](t)
	list(box.Add(ctx, []Delivery{shareDelivery("evt_v", ipA, t0)}))
	// Full: a tenant's delivery takes the visitor's room, another the room of the share
	// holding the most (the earlier release's two against org's one), due first.
	if got := keys(list(box.Add(ctx, []Delivery{shareDelivery("evt_t", orgs, t0)}))); fmt.Sprint(got) != "[evt_v/h]" {
		t.Fatalf("dropped %v", got)
	}
	if got := keys(list(box.Add(ctx, []Delivery{shareDelivery("evt_t2", orgs, t0.Add(time.Second))}))); fmt.Sprint(got) != "[evt_old0/h]" {
		t.Fatalf("dropped %v", got)
	}
	ds := list(box.Claim(ctx, t0.Add(time.Minute), 10, time.Minute))
	if fmt.Sprint(keys(ds)) != "[evt_t/h evt_old1/h evt_t2/h]" {
		t.Fatalf("claimed %v", keys(ds))
	}
	for _, d := range ds {
		if ok, err := box.Done(ctx, d); !ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	if n := c.Exists(ctx, base+"age", base+"items", base+"due").Val(); n != 0 {
		t.Fatalf("%d keys left", n)
	}
}

// A visitors' dead letter makes room before any visitor's pending delivery.
func TestOutboxVisitorsDeadLettersGoFirst(t *testing.T) {
	outboxes(t, 2, func(t *testing.T, box Outbox) {
		ctx := context.Background()
		list := must[[]Delivery](t)
		list(box.Add(ctx, []Delivery{shareDelivery("evt_a", ipA, t0), shareDelivery("evt_b", ipA, t0.Add(time.Second))}))
		ds := list(box.Claim(ctx, t0.Add(time.Second), 2, time.Minute))
		if len(ds) != 2 {
			t.Fatalf("claimed %v", keys(ds))
		}
		if ok, err := box.Kill(ctx, ds[1], t0.Add(time.Second)); !ok || err != nil {
			t.Fatal(ok, err)
		}
		if got := keys(list(box.List(ctx, true, 10))); fmt.Sprint(got) != "[evt_b/h]" {
			t.Fatalf("dead %v", got)
		}
		if got := keys(list(box.Add(ctx, []Delivery{shareDelivery("evt_t", orgs, t0)}))); fmt.Sprint(got) != "[evt_b/h]" {
			t.Fatalf("dropped %v", got)
		}
		if p, d, _ := box.Count(ctx); p != 2 || d != 0 {
			t.Fatalf("count %d %d", p, d)
		}
	})
}
