package limits

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/docsgate/gateway/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// usagesRules are one limit of each kind: requests in a fixed window, GCRA, tokens with a
// reserve, streams.
func usagesRules(t *testing.T) []*Rule {
	return []*Rule{
		rule(t, "mu_req", 10, "hour", Fixed),
		rule(t, "mu_gcra", 20, "1m", GCRA),
		{Name: "mu_tok", Limit: 1000, Window: mustWindow(t, "hour"), Unit: Tokens, Reserve: 100},
		{Name: "mu_streams", Limit: 10, Unit: Streams},
	}
}

// checkUsages takes a request for several tenants, debits tokens, then compares Usages with
// Usage counter by counter.
func checkUsages(t *testing.T, s Store, ids []string) []Hit {
	t.Helper()
	ctx := context.Background()
	rules := usagesRules(t)
	var hits []Hit
	for _, id := range ids {
		for _, r := range rules {
			hits = append(hits, Hit{Rule: r, ID: id})
		}
	}
	for k, id := range ids {
		one := hits[k*len(rules) : (k+1)*len(rules)]
		for range k + 1 {
			var d Decision
			if err := s.Take(ctx, one, &d); err != nil || !d.Allowed {
				t.Fatalf("take for %s: %v %+v", id, err, d)
			}
		}
		if err := s.Debit(ctx, one, int64(7*(k+1))); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.(Usages).Usages(ctx, hits)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(hits) {
		t.Fatalf("%d usages for %d hits", len(got), len(hits))
	}
	for i, h := range hits {
		want, err := s.Usage(ctx, h.Rule, h.ID)
		if err != nil {
			t.Fatal(err)
		}
		g := got[i]
		if h.Rule.Unit == Streams || h.Rule.Algorithm == GCRA {
			// now, or a moment that moves with now: compare to the second
			if d := g.Reset.Sub(want.Reset); d > time.Second || d < -time.Second {
				t.Errorf("%s/%s: reset %v, Usage says %v", h.Rule.Name, h.ID, g.Reset, want.Reset)
			}
			g.Reset = want.Reset
		}
		if fmt.Sprint(g) != fmt.Sprint(want) {
			t.Errorf("%s/%s: Usages %+v, Usage %+v", h.Rule.Name, h.ID, g, want)
		}
	}
	// The counts themselves: tenant k took k+1 requests and was debited 7(k+1) tokens plus
	// its holds (k+1 answers of 100 tokens each, unsettled).
	for k := range ids {
		req, tok, st := got[k*len(rules)], got[k*len(rules)+2], got[k*len(rules)+3]
		if req.Used != int64(k+1) || req.Remaining != int64(10-k-1) {
			t.Errorf("requests of %s: %+v", ids[k], req)
		}
		if tok.Used != int64(7*(k+1)) || tok.Reserved != int64(100*(k+1)) || !tok.Reserves {
			t.Errorf("tokens of %s: %+v", ids[k], tok)
		}
		if st.Used != int64(k+1) {
			t.Errorf("streams of %s: %+v", ids[k], st)
		}
	}
	return hits
}

func TestUsagesMemory(t *testing.T) {
	checkUsages(t, NewMemory(), []string{"a", "b"})
}

// TestUsagesRedisOneCall: on a standalone Redis, reading every counter of a request is one
// script call.
func TestUsagesRedisOneCall(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	s := newRedisT(t, client, uniquePrefix())
	if err := s.Preload(context.Background()); err != nil {
		t.Fatal(err)
	}
	hits := checkUsages(t, s, []string{"a", "b", "c"})
	before := redistest.ScriptCalls(t, client)
	if _, err := s.Usages(context.Background(), hits); err != nil {
		t.Fatal(err)
	}
	if n := redistest.ScriptCalls(t, client) - before; n != 1 {
		t.Fatalf("Usages of %d counters ran %d script calls, want 1", len(hits), n)
	}
	g := NewGuard(s, GuardOptions{Timeout: time.Second})
	before = redistest.ScriptCalls(t, client)
	if _, err := g.Usages(context.Background(), hits); err != nil {
		t.Fatal(err)
	}
	if n := redistest.ScriptCalls(t, client) - before; n != 1 {
		t.Fatalf("the guard's Usages ran %d script calls, want 1", n)
	}
}

// TestUsagesClusterOneCallPerNode: on a Cluster, one script call per master holding one of
// the counters, none on the others.
func TestUsagesClusterOneCallPerNode(t *testing.T) {
	t.Parallel() // servers of its own, and no latency bound
	cl := redistest.StartCluster(t, 3)
	cc := cl.Client(t)
	s := newRedisT(t, cc, uniquePrefix())
	if err := s.Preload(context.Background()); err != nil {
		t.Fatal(err)
	}
	ids := []string{"a", "b", "c", "d", "e", "f"}
	hits := checkUsages(t, s, ids)
	nodes := make([]*redis.Client, len(cl.Servers))
	for i, srv := range cl.Servers {
		nodes[i] = srv.Client(t)
	}
	// Which masters hold the counters.
	holding := map[string]bool{}
	for _, h := range hits {
		k, _ := s.Key(h.Rule, h.ID)
		m, err := cc.MasterForKey(context.Background(), k)
		if err != nil {
			t.Fatal(err)
		}
		holding[m.Options().Addr] = true
	}
	if len(holding) < 2 {
		t.Fatalf("the ids all hash to one node (%v): choose others", holding)
	}
	for _, store := range []Usages{s, NewGuard(s, GuardOptions{Timeout: time.Second})} {
		before := make([]int, len(nodes))
		for i, n := range nodes {
			before[i] = redistest.ScriptCalls(t, n)
		}
		if _, err := store.Usages(context.Background(), hits); err != nil {
			t.Fatal(err)
		}
		for i, n := range nodes {
			calls := redistest.ScriptCalls(t, n) - before[i]
			want := 0
			if holding[cl.Servers[i].Addr] {
				want = 1
			}
			if calls != want {
				t.Errorf("%T: node %s ran %d script calls, want %d", store, cl.Servers[i].Addr, calls, want)
			}
		}
	}
}
