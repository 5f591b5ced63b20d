package limits

import (
	"context"
	"slices"
	"testing"
	"time"
)

// TestRefresh runs the refresh suite against the memory store, a standalone redis-server and a
// 3-master Redis Cluster, each also behind a Guard as the gateway uses it.
func TestRefresh(t *testing.T) {
	t.Parallel() // servers of its own, and no latency bound
	onEveryStore(t, testRefreshKeepsHolds)
}

// testRefreshKeepsHolds: a hold and a slot refreshed more often than their ttl stay counted
// well past it; left alone they expire; a refresh then takes them again and names their limits,
// even past the limit when the slot was taken meanwhile. The two limits live on different
// Cluster nodes.
func testRefreshKeepsHolds(t *testing.T, s Store) {
	alignWindow(t, time.Hour, 30*time.Second)
	ctx := context.Background()
	const ttl = 600 * time.Millisecond
	ids := idsOnDistinctNodes(2)
	tok := reserveRule(t, "tok", 100, 100, ttl)
	st := streamsRule("st", 1, ttl)
	hits := []Hit{{Rule: tok, ID: ids[0]}, {Rule: st, ID: ids[1]}}
	if every := RefreshEvery(hits); every != ttl/4 {
		t.Fatalf("RefreshEvery %v, want %v", every, ttl/4)
	}
	r := s.(Refresher)
	var d1 Decision
	if err := s.Take(ctx, hits, &d1); err != nil || !d1.Allowed {
		t.Fatalf("%v %+v", err, d1)
	}
	held := func(reserved, slots int64) {
		t.Helper()
		u, err := s.Usage(ctx, tok, ids[0])
		if err != nil || u.Reserved != reserved {
			t.Fatalf("tokens usage %+v %v, want %d reserved", u, err, reserved)
		}
		if u, err = s.Usage(ctx, st, ids[1]); err != nil || u.Used != slots {
			t.Fatalf("streams usage %+v %v, want %d in flight", u, err, slots)
		}
	}
	for end := time.Now().Add(3 * ttl); time.Now().Before(end); time.Sleep(ttl / 4) {
		if lapsed, err := r.Refresh(ctx, d1.Hold, hits, nil); err != nil || len(lapsed) != 0 {
			t.Fatalf("refresh of live holds: %v %v", lapsed, err)
		}
		var d Decision
		if err := s.Take(ctx, hits, &d); err != nil || d.Allowed || d.Results[0].Allowed || d.Results[1].Allowed {
			t.Fatalf("a refreshed hold and slot must keep denying: %v %+v", err, d)
		}
		held(100, 1)
	}
	time.Sleep(ttl + 300*time.Millisecond)
	held(0, 0)
	var d2 Decision // drops the expired hold and slot, and takes them
	if err := s.Take(ctx, hits, &d2); err != nil || !d2.Allowed {
		t.Fatalf("expired holds must admit again: %v %+v", err, d2)
	}
	lapsed, err := r.Refresh(ctx, d1.Hold, hits, nil)
	if err != nil || !slices.Equal(lapsed, []string{"tok", "st"}) {
		t.Fatalf("a refresh of expired holds must name them: %v %v", lapsed, err)
	}
	// Taken again, past the limit: both answers are in flight (usage shows a streams limit's
	// slots up to its limit, so the first is seen once the second is settled).
	held(200, 1)
	settle := func(d Decision, reserved, slots int64) {
		t.Helper()
		if _, err := s.Settle(ctx, d.Hold, hits, -1); err != nil {
			t.Fatal(err)
		}
		held(reserved, slots)
	}
	settle(d2, 100, 1)
	settle(d1, 0, 0)
}

func TestRefreshEvery(t *testing.T) {
	req := &Rule{Name: "r", Limit: 10}
	for _, c := range []struct {
		hits []Hit
		want time.Duration
	}{
		{nil, 0},
		{[]Hit{{Rule: req}}, 0},
		{[]Hit{{Rule: streamsRule("st", 5, 0)}}, DefaultReserveTTL / 4},
		{[]Hit{{Rule: req}, {Rule: streamsRule("st", 5, 8*time.Second)}, {Rule: reserveRule(t, "tok", 100, 10, 4*time.Second)}}, time.Second},
		{[]Hit{{Rule: reserveRule(t, "tok", 100, 0, 4*time.Second)}}, 0}, // no reserve: nothing held
	} {
		if got := RefreshEvery(c.hits); got != c.want {
			t.Errorf("RefreshEvery(%v) = %v, want %v", c.hits, got, c.want)
		}
	}
}

// TestRefreshCarriesWhatPassed runs the reaping suite against the memory store, a standalone
// redis-server and a 3-master Redis Cluster, each also behind a Guard.
func TestRefreshCarriesWhatPassed(t *testing.T) {
	t.Parallel() // servers of its own, and no latency bound
	onEveryStore(t, testReap)
}

// testReap: a hold carries what its answer had passed at its last refresh; when it expires
// unsettled, the next decision on the tenant's counter charges that (reads alone do not), and
// a hold that never carried anything is charged nothing. An answer whose hold was reaped but
// which was alive after all is taken again by its refresh, and its settle charges only what
// reaping did not; a reaped hold whose answer is settled later is named expired. Nothing is
// charged twice once the reaped hold's own ttl has passed.
func testReap(t *testing.T, s Store) {
	alignWindow(t, time.Hour, 30*time.Second)
	ctx := context.Background()
	const ttl = 600 * time.Millisecond
	tok := reserveRule(t, "tok", 1000, 100, ttl)
	hits := []Hit{{Rule: tok, ID: "acme"}}
	r := s.(Refresher)
	take := func() Decision { t.Helper(); return admitted(t, s, hits) }
	refresh := func(d Decision, passed int64, lapsed ...string) {
		t.Helper()
		got, err := r.Refresh(ctx, d.Hold, hits, func(rule *Rule) int64 {
			if rule != tok {
				t.Errorf("passed asked for %v", rule)
			}
			return passed
		})
		if err != nil || !slices.Equal(got, lapsed) {
			t.Fatalf("refresh: lapsed %v %v, want %v", got, err, lapsed)
		}
	}
	settle := func(d Decision, n int64, expired ...string) {
		t.Helper()
		got, err := s.Settle(ctx, d.Hold, hits, n)
		if err != nil || !slices.Equal(got, expired) {
			t.Fatalf("settle: expired %v %v, want %v", got, err, expired)
		}
	}
	usage := func(used, reserved int64) {
		t.Helper()
		if u, err := s.Usage(ctx, tok, "acme"); err != nil || u.Used != used || u.Reserved != reserved {
			t.Fatalf("usage %+v %v, want %d used and %d reserved", u, err, used, reserved)
		}
	}
	expire := func() { time.Sleep(ttl + 300*time.Millisecond) }

	a := take()
	refresh(a, 40)
	b := take() // never refreshed: carries nothing
	_ = b
	expire()
	usage(0, 0) // a read reaps nothing
	c := take() // reaps a's 40; b's hold goes for nothing
	usage(40, 100)
	refresh(a, 60, "tok") // a's answer was alive after all: its hold is taken again
	usage(40, 200)
	settle(a, 70) // 70 in all, 40 of them charged already
	usage(70, 100)

	refresh(c, 25)
	expire()
	d := take() // reaps c's 25
	usage(95, 100)
	settle(c, 30, "tok") // its hold was reaped: named expired, charged the 5 more
	usage(100, 100)
	settle(d, -1)
	usage(100, 0)
	expire() // c's reaped hold of 0 is gone now too
	e := take()
	settle(e, 0)
	usage(100, 0)
}
