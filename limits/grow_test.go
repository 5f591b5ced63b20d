package limits

import (
	"context"
	"testing"
	"time"
)

// TestGrow runs the grow suite against the memory store, a standalone redis-server and a
// 3-master Redis Cluster, each also behind a Guard as the gateway uses it.
func TestGrow(t *testing.T) {
	t.Parallel() // servers of its own, and no latency bound
	onEveryStore(t, testGrow)
}

// testGrow: a hold grows as far as the allowance has room net of the used tokens and the
// other holds, never shrinks, counts in what the next decision sees, settles like any hold,
// and follows a grant; one that expired is taken again at what there is room for.
func testGrow(t *testing.T, s Store) {
	alignWindow(t, time.Hour, 30*time.Second)
	ctx := context.Background()
	const ttl = 500 * time.Millisecond
	id := idsOnDistinctNodes(1)[0]
	tok := reserveRule(t, "tok", 1000, 100, ttl)
	hits := []Hit{{Rule: tok, ID: id}}
	g := s.(Grower)
	take := func() Decision { t.Helper(); return admitted(t, s, hits) }
	grow := func(hold string, want, got int64) {
		t.Helper()
		n, err := g.Grow(ctx, hold, hits[0], want)
		if err != nil || n != got {
			t.Fatalf("grow to %d: %d %v, want %d", want, n, err, got)
		}
	}
	reserved := func(want int64) {
		t.Helper()
		if u, err := s.Usage(ctx, tok, id); err != nil || u.Reserved != want {
			t.Fatalf("usage %+v %v, want %d reserved", u, err, want)
		}
	}
	if err := s.Debit(ctx, hits, 200); err != nil {
		t.Fatal(err)
	}
	a, b := take(), take()
	reserved(200)
	grow(a.Hold, 500, 500) // 200 used, b holds 100: room for 700
	reserved(600)
	grow(a.Hold, 300, 500) // never shrinks
	grow(a.Hold, 900, 700) // as far as there is room
	reserved(800)
	var d Decision
	if err := s.Take(ctx, hits, &d); err != nil || d.Allowed {
		t.Fatalf("a grown hold must count in decisions: %v %+v", err, d)
	}
	grow(b.Hold, 150, 100) // no room left for b
	if _, err := s.Settle(ctx, a.Hold, hits, 650); err != nil {
		t.Fatal(err)
	}
	reserved(100)
	grow(b.Hold, 150, 150) // 850 used: room for 150
	if qs, ok := s.(QuotaStore); ok {
		if _, _, err := qs.Grant(ctx, tok, id, 100, Who{Actor: "test"}); err != nil {
			t.Fatal(err)
		}
		grow(b.Hold, 400, 250) // a grant adds to the allowance
	} else {
		grow(b.Hold, 400, 150)
	}
	// Expired: taken again, at what there is room for.
	time.Sleep(ttl + 200*time.Millisecond)
	reserved(0)
	grow(b.Hold, 50, 50)
	reserved(50)
	if expired, err := s.Settle(ctx, b.Hold, hits, 40); err != nil || len(expired) != 0 {
		t.Fatalf("settle of a hold taken again: %v %v", expired, err)
	}
	reserved(0)
	if u, _ := s.Usage(ctx, tok, id); u.Used != 890 {
		t.Fatalf("used %d, want 890", u.Used)
	}
}
