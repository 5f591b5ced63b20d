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
		{rule(t, "per_project", limit, win, Fixed), ids[0]},
		{rule(t, "per_org", limit, win, Fixed), ids[1]},
		{rule(t, "per_ip", limit, win, GCRA), ids[2]},
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
				all := append(hits, Hit{tokens, hits[0].ID}, Hit{off, hits[0].ID})
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
