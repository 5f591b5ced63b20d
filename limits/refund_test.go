package limits

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/docsgate/gateway/internal/redistest"
)

// refundHits are three limits of one request, one id each; on a Cluster the ids sit on
// three different masters, so a refund has to reach every node.
func refundHits(t *testing.T, limit int64, win string) []Hit {
	ids := idsOnDistinctNodes(3)
	return []Hit{
		{Rule: rule(t, "per_project", limit, win, Fixed), ID: ids[0]},
		{Rule: rule(t, "per_org", limit, win, Fixed), ID: ids[1]},
		{Rule: rule(t, "per_ip", limit, win, GCRA), ID: ids[2]},
	}
}

func takeOK(t *testing.T, s Store, hits []Hit) *Decision {
	t.Helper()
	d := &Decision{}
	if err := s.Take(context.Background(), hits, d); err != nil {
		t.Fatal(err)
	}
	return d
}

func refund(t *testing.T, s Store, taken []Taken) {
	t.Helper()
	if err := s.(Refunder).Refund(context.Background(), taken); err != nil {
		t.Fatal(err)
	}
}

// used reads every hit's counter.
func used(t *testing.T, s Store, hits []Hit) []int64 {
	t.Helper()
	out := make([]int64, len(hits))
	for i, h := range hits {
		u, err := s.Usage(context.Background(), h.Rule, h.ID)
		if err != nil {
			t.Fatal(err)
		}
		out[i] = u.Used
	}
	return out
}

func TestRefund(t *testing.T) {
	t.Parallel() // servers of its own, and no latency bound
	for _, b := range backends(t, true) {
		t.Run(b.name, func(t *testing.T) {
			t.Run("GivesBackEveryLimit", func(t *testing.T) {
				s := b.stores(t, 1)[0]
				hits := refundHits(t, 3, "hour")
				first := takeOK(t, s, hits)
				takeOK(t, s, hits)
				if d := takeOK(t, s, hits); !d.Allowed {
					t.Fatal("third request denied")
				}
				if d := takeOK(t, s, hits); d.Allowed {
					t.Fatal("fourth request admitted past the limit")
				}
				taken := first.Taken(hits, nil)
				if len(taken) != 3 {
					t.Fatalf("taken %+v", taken)
				}
				refund(t, s, taken)
				if u := used(t, s, hits); u[0] != 2 || u[1] != 2 || u[2] != 2 {
					t.Fatalf("after one refund: used %v, want 2 each", u)
				}
				if d := takeOK(t, s, hits); !d.Allowed {
					t.Fatal("the refunded unit is not admitted again")
				}
				if d := takeOK(t, s, hits); d.Allowed {
					t.Fatal("admitted past the limit after a refund")
				}
			})
			t.Run("NeverPastFull", func(t *testing.T) {
				s := b.stores(t, 1)[0]
				hits := refundHits(t, 3, "hour")
				d := takeOK(t, s, hits)
				taken := d.Taken(hits, nil)
				refund(t, s, taken)
				refund(t, s, taken) // a second refund of the same units gives nothing more
				if u := used(t, s, hits); u[0] != 0 || u[1] != 0 || u[2] != 0 {
					t.Fatalf("used %v after refunds, want 0", u)
				}
				for i := range 3 {
					if d := takeOK(t, s, hits); !d.Allowed {
						t.Fatalf("request %d denied", i)
					}
				}
				if d := takeOK(t, s, hits); d.Allowed {
					t.Fatal("a refund past full gave a fourth unit")
				}
			})
			t.Run("NotIntoALaterWindow", func(t *testing.T) {
				s := b.stores(t, 1)[0]
				hits := refundHits(t, 5, "2s")[:2] // the fixed limits
				alignWindow(t, 2*time.Second, time.Second)
				old := takeOK(t, s, hits).Taken(hits, nil)
				_, end := mustWindow(t, "2s").Bounds(time.Now())
				time.Sleep(time.Until(end) + 5*time.Millisecond) // into the next window
				takeOK(t, s, hits)
				refund(t, s, old)
				if u := used(t, s, hits); u[0] != 1 || u[1] != 1 {
					t.Fatalf("a refund from the previous window took from this one: used %v", u)
				}
			})
			t.Run("OnlyWhatWasTaken", func(t *testing.T) {
				s := b.stores(t, 1)[0]
				hits := refundHits(t, 1, "hour")
				tokens := &Rule{Name: "tokens", Limit: 100, Window: mustWindow(t, "hour"), Unit: Tokens}
				off := &Rule{Name: "off", Limit: 0, Window: mustWindow(t, "hour")}
				all := append(hits, Hit{Rule: tokens, ID: hits[0].ID}, Hit{Rule: off, ID: hits[0].ID})
				d := takeOK(t, s, all)
				if got := d.Taken(all, nil); len(got) != 3 {
					t.Fatalf("taken %+v, want the three requests limits", got)
				}
				denied := takeOK(t, s, all)
				if got := denied.Taken(all, nil); denied.Allowed || len(got) != 0 {
					t.Fatalf("a denied decision took %+v", got)
				}
			})
			t.Run("AfterScriptFlush", func(t *testing.T) {
				if b.redis == nil {
					t.Skip("in process")
				}
				s := b.stores(t, 1)[0]
				hits := refundHits(t, 2, "hour")
				d := takeOK(t, s, hits)
				// A restarted Redis has none of the scripts: the refund loads them itself.
				ctx := context.Background()
				if cc, ok := b.redis.(*redis.ClusterClient); ok {
					if err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return c.ScriptFlush(ctx).Err() }); err != nil {
						t.Fatal(err)
					}
				} else if err := b.redis.ScriptFlush(ctx).Err(); err != nil {
					t.Fatal(err)
				}
				refund(t, s, d.Taken(hits, nil))
				if u := used(t, s, hits); u[0] != 0 || u[1] != 0 || u[2] != 0 {
					t.Fatalf("used %v after a refund on a flushed script cache", u)
				}
			})
			t.Run("BehindAGuard", func(t *testing.T) {
				g := NewGuard(b.stores(t, 1)[0], GuardOptions{Timeout: time.Second})
				hits := refundHits(t, 2, "hour")
				d := takeOK(t, g, hits)
				refund(t, g, d.Taken(hits, nil))
				if u := used(t, g, hits); u[0] != 0 || u[1] != 0 || u[2] != 0 {
					t.Fatalf("used %v after a refund through the guard", u)
				}
			})
		})
	}
}

// A refund is one script call on a standalone Redis, whatever the number of limits.
func TestRefundOneScriptCall(t *testing.T) {
	srv := redistest.Start(t)
	stats := srv.Client(t)
	s := newRedisT(t, srv.Client(t), "gw")
	if err := s.Preload(context.Background()); err != nil { // as the gateway does at start
		t.Fatal(err)
	}
	hits := refundHits(t, 10, "hour")
	d := takeOK(t, s, hits)
	before := redistest.ScriptCalls(t, stats)
	refund(t, s, d.Taken(hits, nil))
	if n := redistest.ScriptCalls(t, stats) - before; n != 1 {
		t.Fatalf("%d script calls for one refund of three limits, want 1", n)
	}
}

// A refund that arrives once a later window began (the tenant's next unit moved the unit's
// window into history) goes back into that window's kept count, never below 0, and leaves
// the current window's count alone; where the window is no longer kept (the history
// shortened since), it is dropped. Windows of 2 s on every store.
func TestRefundIntoKeptWindow(t *testing.T) {
	t.Parallel() // servers of its own, and no latency bound
	for _, b := range historyBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			s := b.stores(t, 1)[0]
			hs := s.(HistoryStore)
			hits := refundHits(t, 10, "2s")[:2] // the fixed limits, on two nodes of a Cluster
			for _, h := range hits {
				h.Rule.History = 3
			}
			// in takes one unit of every hit, which must land in the window starting at ws.
			in := func(ws int64) []Taken {
				t.Helper()
				taken := takeOK(t, s, hits).Taken(hits, nil)
				if len(taken) != 2 || taken[0].WindowStart != ws {
					t.Fatalf("a unit taken in window %+v, want %d (the machine stalled for a whole window?)", taken, ws)
				}
				return taken
			}
			// ended checks every hit's count of the window starting at ws (and its export).
			ended := func(ws, want int64, when string) {
				t.Helper()
				for _, h := range hits {
					if n := usedInWindow(t, hs, h.Rule, h.ID, ws); n != want {
						t.Errorf("%s, %s: the ended window shows %d, want %d", when, h.Rule.Name, n, want)
					}
					if got := exportOf(t, hs, h.Rule, ws)[h.ID]; got != want {
						t.Errorf("%s, %s: the export of the ended window shows %d, want %d", when, h.Rule.Name, got, want)
					}
				}
			}
			current := func(when string) {
				t.Helper()
				if u := used(t, s, hits); u[0] != 1 || u[1] != 1 {
					t.Errorf("%s: the current window's count is %v, want 1 each", when, u)
				}
			}
			alignWindow(t, 2*time.Second, 1200*time.Millisecond)
			w0, _ := hits[0].Rule.Window.boundsUnix(time.Now().Unix())
			a, b := in(w0), in(w0)
			in(w0)
			in(w0)
			nextWindow(2 * time.Second)
			in(w0 + 2) // w0 (4 units) moves into history
			refund(t, s, a)
			ended(w0, 3, "a refund after the window ended")
			current("a refund after the window ended")

			nextWindow(2 * time.Second)
			in(w0 + 4) // w0 is kept two windows back
			short := make([]Taken, len(b))
			for i, tk := range b {
				r := *tk.Rule
				r.History = 1 // keeps the window before this one only
				short[i] = tk
				short[i].Rule = &r
			}
			refund(t, s, short)
			ended(w0, 3, "a refund of a window the shortened history no longer keeps")
			for range 4 { // one more than the window still holds
				refund(t, s, b)
			}
			ended(w0, 0, "refunds past the window's count")
			ended(w0+2, 1, "refunds of an older window")
			current("refunds of an older window")
		})
	}
}
