package limits

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"
)

// Holds across window ends: a counter lives as long as its live holds, whatever writes it in a
// later window.

// A shadow tokens limit with a reserve on a window (2 s) shorter than reserve_ttl (10 s): a hold
// taken in one window; in the next, an answer admitted without room (no hold) is debited, which
// opens that window. The counter must not expire at that window's end under the live hold: the
// hold still counts (reserved, no room for another), and its refresh and settle find it live.
func TestHoldOutlivesShortWindow(t *testing.T) {
	t.Parallel() // servers of its own, and no latency bound
	for _, b := range historyBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s := b.stores(t, 1)[0]
			r := tokenRule(t, "shadow_tok", 100, "2s")
			r.Shadow, r.Reserve, r.ReserveTTL, r.History = true, 60, 10*time.Second, 0
			hits := []Hit{{Rule: r, ID: "acme"}}
			take := func(room bool) Decision {
				t.Helper()
				var d Decision
				if err := s.Take(ctx, hits, &d); err != nil || !d.Allowed || d.Results[0].Allowed != room || (len(d.Held(hits, nil)) == 1) != room {
					t.Fatalf("take (room: %v): %v %+v", room, err, d)
				}
				return d
			}
			alignWindow(t, 2*time.Second, time.Second)
			held := take(true).Hold
			nextWindow(2 * time.Second)
			take(false) // a shadow limit admits without room, holding nothing: its answer is debited
			if err := s.Debit(ctx, hits, 30); err != nil {
				t.Fatal(err)
			}
			nextWindow(2 * time.Second) // the window the debit opened has ended; the hold has 6 s left
			if u, err := s.Usage(ctx, r, "acme"); err != nil || u.Reserved != 60 {
				t.Fatalf("usage once the debited window ended: %+v %v, want the live hold's 60 reserved", u, err)
			}
			take(false)
			if lapsed, err := s.(Refresher).Refresh(ctx, held, hits, nil); err != nil || len(lapsed) != 0 {
				t.Fatalf("refresh of the live hold: lapsed %v %v, want none", lapsed, err)
			}
			if expired, err := s.Settle(ctx, held, hits, 50); err != nil || len(expired) != 0 {
				t.Fatalf("settle of the live hold: expired %v %v, want none", expired, err)
			}
		})
	}
}

// Which window an answer is billed to, at a real month boundary on the in-process store's clock
// (the worked example of docs/operations.md): a monthly tokens limit of 1,000 with a reserve of 100, and one
// without a reserve (debited), 600 used in January. An answer admitted on January 31 at
// 23:59:50 holds 100 (300 remain). On February 1 January's 600 is final; February starts at 0
// used with the hold still live (900 remain: 9 more reserves fit, not 10). The answer ends at
// 00:00:20 having cost 70: February is charged 70 and January keeps 600, in the history and the
// export of both limits.
func TestAnswerBilledToMonthItEnds(t *testing.T) {
	var mu sync.Mutex
	now := time.Date(2025, 1, 10, 9, 0, 0, 0, time.UTC)
	at := func(tm time.Time) { mu.Lock(); now = tm; mu.Unlock() }
	m := NewMemory(WithClock(func() time.Time { mu.Lock(); defer mu.Unlock(); return now }))
	ctx := context.Background()
	held := tokenRule(t, "tokens_held", 1000, "month")
	held.Reserve, held.ReserveTTL, held.History = 100, 10*time.Minute, 13
	debited := tokenRule(t, "tokens_debited", 1000, "month")
	debited.History = 13
	hits := []Hit{{Rule: held, ID: "acme"}, {Rule: debited, ID: "acme"}}
	take := func() Decision {
		t.Helper()
		var d Decision
		if err := m.Take(ctx, hits, &d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	end := func(d Decision, n int64) { // an answer ends: its hold settled, the other limit debited
		t.Helper()
		if expired, err := m.Settle(ctx, d.Hold, hits[:1], n); err != nil || len(expired) != 0 {
			t.Fatalf("settle: %v %v", expired, err)
		}
		if n > 0 {
			if err := m.Debit(ctx, hits[1:], n); err != nil {
				t.Fatal(err)
			}
		}
	}
	usage := func(r *Rule, used, reserved, remaining int64) {
		t.Helper()
		if u, err := m.Usage(ctx, r, "acme"); err != nil || u.Used != used || u.Reserved != reserved || u.Remaining != remaining {
			t.Fatalf("%s at %s: %+v %v, want used %d reserved %d remaining %d", r.Name, m.now().Format(time.RFC3339), u, err, used, reserved, remaining)
		}
	}
	if d := take(); d.Allowed {
		end(d, 600)
	} else {
		t.Fatalf("January: %+v", d)
	}
	at(time.Date(2025, 1, 31, 23, 59, 50, 0, time.UTC))
	x := take()
	if !x.Allowed || x.Hold == "" {
		t.Fatalf("the answer at 23:59:50: %+v", x)
	}
	usage(held, 600, 100, 300)
	usage(debited, 600, 0, 400)

	at(time.Date(2025, 2, 1, 0, 0, 5, 0, time.UTC))
	usage(held, 0, 100, 900)
	usage(debited, 0, 0, 1000)
	var more []Decision
	for range 9 {
		if d := take(); d.Allowed {
			more = append(more, d)
		} else {
			t.Fatalf("February, admission %d with 900 left: %+v", len(more)+1, d)
		}
	}
	if d := take(); d.Allowed || d.Results[0].Allowed || d.Results[0].RetryAfter != time.Second {
		t.Fatalf("February, a 10th reserve beside the January answer's hold: %+v, want denied until holds come back", d)
	}
	usage(held, 0, 1000, 0) // used + live holds = limit
	for _, d := range more {
		end(d, -1)
	}

	at(time.Date(2025, 2, 1, 0, 0, 20, 0, time.UTC))
	end(x, 70)
	jan := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC).Unix()
	feb := time.Date(2025, 2, 1, 0, 0, 0, 0, time.UTC).Unix()
	for _, r := range []*Rule{held, debited} {
		if got := historyUsed(t, m, r, "acme")[:2]; !slices.Equal(got, []int64{70, 600}) {
			t.Errorf("%s: history %v, want February 70 and January 600", r.Name, got)
		}
		if got := exportOf(t, m, r, jan); len(got) != 1 || got["acme"] != 600 {
			t.Errorf("%s: export of January %v, want acme 600", r.Name, got)
		}
		if got := exportOf(t, m, r, feb); len(got) != 1 || got["acme"] != 70 {
			t.Errorf("%s: export of February %v, want acme 70", r.Name, got)
		}
	}
	usage(held, 70, 0, 930)
}
