package limits

import (
	"context"
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
			if lapsed, err := s.(Refresher).Refresh(ctx, held, hits); err != nil || len(lapsed) != 0 {
				t.Fatalf("refresh of the live hold: lapsed %v %v, want none", lapsed, err)
			}
			if expired, err := s.Settle(ctx, held, hits, 50); err != nil || len(expired) != 0 {
				t.Fatalf("settle of the live hold: expired %v %v, want none", expired, err)
			}
		})
	}
}
