package limits

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/docsgate/gateway/internal/redistest"
)

func reserveRule(t testing.TB, name string, limit, reserve int64, ttl time.Duration) *Rule {
	r := tokenRule(t, name, limit, "hour")
	r.Reserve, r.ReserveTTL = reserve, ttl
	return r
}

func streamsRule(name string, limit int64, ttl time.Duration) *Rule {
	return &Rule{Name: name, Limit: limit, Unit: Streams, ReserveTTL: ttl}
}

// TestHolds runs the holds suite against the memory store, a standalone redis-server and a
// 3-master Redis Cluster.
func TestHolds(t *testing.T) {
	t.Parallel() // servers of its own, and no latency bound
	for _, b := range backends(t, true) {
		t.Run(b.name, func(t *testing.T) {
			t.Run("ReserveExact", func(t *testing.T) { testReserveExact(t, b) })
			t.Run("ReserveSettle", func(t *testing.T) { testReserveSettle(t, b) })
			t.Run("ReserveExpired", func(t *testing.T) { testReserveExpired(t, b) })
			t.Run("StreamsExact", func(t *testing.T) { testStreamsExact(t, b) })
			t.Run("HoldsAllOrNothing", func(t *testing.T) { testHoldsAllOrNothing(t, b) })
			t.Run("ResetKeepsHolds", func(t *testing.T) { testResetKeepsHolds(t, b) })
			t.Run("HoldsRandom", func(t *testing.T) { testHoldsRandom(t, b) })
			t.Run("SomeHoldsExpired", func(t *testing.T) { testSomeHoldsExpired(t, b) })
		})
	}
}

// concurrentTakes decides hits n times at once, spread over stores, and returns the holds of
// the admitted decisions. Every denial must say to retry in a second (holds come back as
// answers end).
func concurrentTakes(t *testing.T, stores []Store, hits []Hit, n int) []string {
	t.Helper()
	var mu sync.Mutex
	var holds []string
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var d Decision
			if err := stores[i%len(stores)].Take(context.Background(), hits, &d); err != nil {
				t.Error(err)
				return
			}
			if !d.Allowed {
				if r := d.Results[0]; r.RetryAfter != time.Second {
					t.Errorf("denied for holds in flight: retry %v, want 1s", r.RetryAfter)
				}
				return
			}
			if d.Hold == "" || len(d.Held(hits, nil)) != len(hits) {
				t.Errorf("admitted without its holds: %+v", d)
			}
			mu.Lock()
			holds = append(holds, d.Hold)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return holds
}

// testReserveExact: 40 concurrent admissions from 3 replicas against 1,000 tokens with a
// reserve of 100: exactly 10 admitted; settled at 100 each, the use is exactly 1,000.
func testReserveExact(t *testing.T, b backend) {
	alignWindow(t, time.Hour, 30*time.Second)
	ctx := context.Background()
	stores := b.stores(t, 3)
	tok := reserveRule(t, "tok", 1000, 100, 0)
	hits := []Hit{{Rule: tok, ID: "acme"}}
	holds := concurrentTakes(t, stores, hits, 40)
	if len(holds) != 10 {
		t.Fatalf("admitted %d, want exactly 10", len(holds))
	}
	u, err := stores[0].Usage(ctx, tok, "acme")
	if err != nil || u.Used != 0 || u.Reserved != 1000 || u.Remaining != 0 {
		t.Fatalf("usage while in flight: %+v %v", u, err)
	}
	for i, h := range holds {
		expired, err := stores[i%3].Settle(ctx, h, hits, 100)
		if err != nil || len(expired) != 0 {
			t.Fatalf("settle: %v %v", expired, err)
		}
	}
	u, err = stores[1].Usage(ctx, tok, "acme")
	if err != nil || u.Used != 1000 || u.Reserved != 0 || u.Remaining != 0 {
		t.Fatalf("usage after settling: %+v %v", u, err)
	}
	var d Decision
	if err := stores[2].Take(ctx, hits, &d); err != nil || d.Allowed || d.Results[0].RetryAfter != d.Results[0].Reset {
		t.Fatalf("a spent budget must deny until the window resets: %v %+v", err, d)
	}
}

// testReserveSettle: settling refunds what an answer did not use, charges what it used past
// its reserve, and a release gives the whole hold back.
func testReserveSettle(t *testing.T, b backend) {
	alignWindow(t, time.Hour, 30*time.Second)
	ctx := context.Background()
	s := b.stores(t, 1)[0]
	tok := reserveRule(t, "tok", 1000, 100, 0)
	hits := []Hit{{Rule: tok, ID: "acme"}}
	take := func() *Decision {
		t.Helper()
		d := &Decision{}
		if err := s.Take(ctx, hits, d); err != nil {
			t.Fatal(err)
		}
		return d
	}
	var ds []*Decision
	for range 10 {
		d := take()
		if !d.Allowed {
			t.Fatal("denied within the budget")
		}
		ds = append(ds, d)
	}
	if take().Allowed {
		t.Fatal("admitted past the budget")
	}
	if _, err := s.Settle(ctx, ds[0].Hold, hits, 50); err != nil { // 50 refunded
		t.Fatal(err)
	}
	if _, err := s.Settle(ctx, ds[1].Hold, hits, -1); err != nil { // released
		t.Fatal(err)
	}
	u, _ := s.Usage(ctx, tok, "acme")
	if u.Used != 50 || u.Reserved != 800 || u.Remaining != 150 {
		t.Fatalf("usage: %+v", u)
	}
	if d := take(); !d.Allowed || d.Results[0].Remaining != 50 {
		t.Fatalf("the refund must admit one more: %+v", d)
	}
	if take().Allowed {
		t.Fatal("50 left must not admit a reserve of 100")
	}
	if _, err := s.Settle(ctx, ds[2].Hold, hits, 130); err != nil { // charged past the reserve
		t.Fatal(err)
	}
	if u, _ := s.Usage(ctx, tok, "acme"); u.Used != 180 || u.Reserved != 800 {
		t.Fatalf("usage after a charge: %+v", u)
	}
	// Settling twice charges twice (the caller settles once) but never finds the hold again.
	if exp, _ := s.Settle(ctx, ds[2].Hold, hits, 0); len(exp) != 1 {
		t.Fatalf("a hold settled twice must read as gone: %v", exp)
	}
}

// testReserveExpired: a hold whose gateway died comes back after its ttl; settled late, the
// answer's tokens are charged all the same and the limit is reported.
func testReserveExpired(t *testing.T, b backend) {
	alignWindow(t, time.Hour, 30*time.Second)
	ctx := context.Background()
	s := b.stores(t, 1)[0]
	tok := reserveRule(t, "tok", 200, 100, 300*time.Millisecond)
	st := streamsRule("st", 1, 300*time.Millisecond)
	hits := []Hit{{Rule: tok, ID: "acme"}, {Rule: st, ID: "acme"}}
	var d1, d2 Decision
	if err := s.Take(ctx, hits, &d1); err != nil || !d1.Allowed {
		t.Fatalf("%v %+v", err, d1)
	}
	if err := s.Take(ctx, hits, &d2); err != nil || d2.Allowed || d2.Results[1].Allowed || !d2.Results[0].Allowed {
		t.Fatalf("the slot must deny: %v %+v", err, d2)
	}
	time.Sleep(600 * time.Millisecond)
	if u, _ := s.Usage(ctx, tok, "acme"); u.Reserved != 0 || u.Remaining != 200 {
		t.Fatalf("an expired hold still counts: %+v", u)
	}
	if u, _ := s.Usage(ctx, st, "acme"); u.Used != 0 {
		t.Fatalf("an expired slot still counts: %+v", u)
	}
	if err := s.Take(ctx, hits, &d2); err != nil || !d2.Allowed {
		t.Fatalf("expired holds must admit again: %v %+v", err, d2)
	}
	expired, err := s.Settle(ctx, d1.Hold, hits, 70)
	if err != nil || len(expired) != 1 || expired[0] != "tok" {
		t.Fatalf("late settle: %v %v", expired, err)
	}
	if u, _ := s.Usage(ctx, tok, "acme"); u.Used != 70 || u.Reserved != 100 {
		t.Fatalf("a late settle must charge: %+v", u)
	}
}

// testStreamsExact: 20 concurrent admissions from 3 replicas against 5 slots: exactly 5, with
// Retry-After 1s for the others; a slot given back admits one more.
func testStreamsExact(t *testing.T, b backend) {
	ctx := context.Background()
	stores := b.stores(t, 3)
	st := streamsRule("st", 5, 0)
	hits := []Hit{{Rule: st, ID: "acme"}}
	held := concurrentTakes(t, stores, hits, 20)
	if len(held) != 5 {
		t.Fatalf("admitted %d, want 5", len(held))
	}
	if u, _ := stores[0].Usage(ctx, st, "acme"); u.Used != 5 || u.Remaining != 0 || u.Unit != Streams {
		t.Fatalf("usage: %+v", u)
	}
	if _, err := stores[1].Settle(ctx, held[0], hits, 123); err != nil {
		t.Fatal(err)
	}
	var d Decision
	if err := stores[2].Take(ctx, hits, &d); err != nil || !d.Allowed || d.Results[0].Remaining != 0 {
		t.Fatalf("a slot given back must admit one: %v %+v", err, d)
	}
}

// testHoldsAllOrNothing: a request denied by one limit takes no hold or slot of the others,
// whichever nodes they live on.
func testHoldsAllOrNothing(t *testing.T, b backend) {
	alignWindow(t, time.Hour, 30*time.Second)
	ctx := context.Background()
	s := b.stores(t, 1)[0]
	ids := idsOnDistinctNodes(3)
	tok := reserveRule(t, "tok", 1000, 100, 0)
	st := streamsRule("st", 10, 0)
	req := rule(t, "req", 1, "hour", Fixed)
	hits := []Hit{{Rule: tok, ID: ids[0]}, {Rule: st, ID: ids[1]}, {Rule: req, ID: ids[2]}}
	var d Decision
	if err := s.Take(ctx, hits, &d); err != nil || !d.Allowed {
		t.Fatalf("%v %+v", err, d)
	}
	if err := s.Take(ctx, hits, &d); err != nil || d.Allowed || d.Hold != "" {
		t.Fatalf("the requests limit must deny: %v %+v", err, d)
	}
	if u, _ := s.Usage(ctx, tok, ids[0]); u.Reserved != 100 {
		t.Fatalf("a denied request kept a hold: %+v", u)
	}
	if u, _ := s.Usage(ctx, st, ids[1]); u.Used != 1 {
		t.Fatalf("a denied request kept a slot: %+v", u)
	}
}

// testResetKeepsHolds: an operator's reset of a tokens limit zeroes the window's use but keeps
// the holds of the answers in flight (settled later, they are not taken for expired); a
// reset of a streams limit frees its slots.
func testResetKeepsHolds(t *testing.T, b backend) {
	alignWindow(t, time.Hour, 30*time.Second)
	ctx := context.Background()
	s := b.stores(t, 1)[0]
	qs, ok := s.(QuotaStore)
	if !ok {
		t.Fatalf("%T is no QuotaStore", s)
	}
	tok := reserveRule(t, "tok", 1000, 100, 0)
	st := streamsRule("st", 2, 0)
	hits := []Hit{{Rule: tok, ID: "acme"}, {Rule: st, ID: "acme"}}
	var d1, d2 Decision
	if err := s.Take(ctx, hits, &d1); err != nil || !d1.Allowed {
		t.Fatal(err, d1)
	}
	if err := s.Take(ctx, hits, &d2); err != nil || !d2.Allowed {
		t.Fatal(err, d2)
	}
	if _, err := s.Settle(ctx, d1.Hold, hits[:1], 80); err != nil {
		t.Fatal(err)
	}
	if _, err := qs.Reset(ctx, tok, "acme", Who{Actor: "test", Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	if u, _ := s.Usage(ctx, tok, "acme"); u.Used != 0 || u.Reserved != 100 || u.Remaining != 900 {
		t.Fatalf("after a reset: %+v", u)
	}
	if exp, err := s.Settle(ctx, d2.Hold, hits[:1], 60); err != nil || len(exp) != 0 {
		t.Fatalf("a hold kept through a reset must settle live: %v %v", exp, err)
	}
	if u, _ := s.Usage(ctx, tok, "acme"); u.Used != 60 || u.Reserved != 0 {
		t.Fatalf("after the settle: %+v", u)
	}
	if _, err := qs.Reset(ctx, st, "acme", Who{Actor: "test", Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	if u, _ := s.Usage(ctx, st, "acme"); u.Used != 0 {
		t.Fatalf("a reset must free the slots: %+v", u)
	}
}

// testHoldsRandom runs a seeded random sequence of admissions, settles and releases from two
// replicas against a model, on every store: each decision, and the used, reserved and slots
// read back after each step, are the model's. (FuzzHoldsInvariant does the same with expiry
// on the in-process store's clock.)
func testHoldsRandom(t *testing.T, b backend) {
	alignWindow(t, time.Hour, 30*time.Second)
	ctx := context.Background()
	stores := b.stores(t, 2)
	const L, R, S = 700, 60, 6
	tok := reserveRule(t, "tok", L, R, 0)
	st := streamsRule("st", S, 0)
	hits := []Hit{{Rule: tok, ID: "acme"}, {Rule: st, ID: "acme"}}
	rnd := rand.New(rand.NewPCG(26, 1))
	var out []string
	var used int64
	for step := range 300 {
		s := stores[step%2]
		if len(out) == 0 || rnd.IntN(2) == 0 {
			want := L-used-R*int64(len(out)) >= R && len(out) < S
			var d Decision
			if err := s.Take(ctx, hits, &d); err != nil {
				t.Fatal(err)
			}
			if d.Allowed != want {
				t.Fatalf("step %d: allowed %v, model %v (used %d, %d in flight)", step, d.Allowed, want, used, len(out))
			}
			if d.Allowed {
				out = append(out, d.Hold)
			}
		} else {
			k := rnd.IntN(len(out))
			n := rnd.Int64N(R+2) - 1 // -1: released
			if exp, err := s.Settle(ctx, out[k], hits, n); err != nil || len(exp) != 0 {
				t.Fatalf("step %d: settle: %v %v", step, exp, err)
			}
			out = append(out[:k], out[k+1:]...)
			used += max(n, 0)
		}
		u, err := s.Usage(ctx, tok, "acme")
		if err != nil || u.Used != used || u.Reserved != R*int64(len(out)) || u.Remaining != max(L-used-R*int64(len(out)), 0) {
			t.Fatalf("step %d: usage %+v %v, model used %d, %d in flight", step, u, err, used, len(out))
		}
		if u, err := s.Usage(ctx, st, "acme"); err != nil || u.Used != int64(len(out)) {
			t.Fatalf("step %d: slots %+v %v, model %d", step, u, err, len(out))
		}
	}
}

// TestLostReplyReleasesHolds: a decision whose reply is lost (the client's deadline passes
// while a busy script holds Redis; the decision's script runs afterwards) took a hold nobody
// will settle; the store releases it by itself instead of leaving the tenant held for
// reserve_ttl.
func TestLostReplyReleasesHolds(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	s := newRedisT(t, c, uniquePrefix())
	ctx := context.Background()
	if err := s.Preload(ctx); err != nil {
		t.Fatal(err)
	}
	tok := reserveRule(t, "tok", 1000, 100, 0)
	st := streamsRule("st", 5, 0)
	hits := []Hit{{Rule: tok, ID: "acme"}, {Rule: st, ID: "acme"}}
	// The busy script runs on a client that waits for it however long it takes and never
	// sends it twice (a retried EVAL would meet BUSY). Its length is measured on this
	// machine, under its load: about a second keeps Redis busy past the decision's
	// deadline and ends well before the last release, 4 s after the decision failed.
	busyClient := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: -1, MaxRetries: -1})
	t.Cleanup(func() { busyClient.Close() })
	const loop = "local n = 0 for i = 1, tonumber(ARGV[1]) do n = n + 1 end return n"
	const sample = 5_000_000
	began := time.Now()
	if err := busyClient.Eval(ctx, loop, nil, sample).Err(); err != nil {
		t.Fatal(err)
	}
	iterations := int64(float64(sample) * float64(time.Second) / float64(max(time.Since(began), time.Millisecond)))
	iterations = min(max(iterations, sample), 200_000_000)
	busy := make(chan error, 1)
	go func() {
		began := time.Now()
		err := busyClient.Eval(ctx, loop, nil, iterations).Err()
		t.Logf("Redis was busy for %v (%d iterations)", time.Since(began), iterations)
		busy <- err
	}()
	// The decision goes out once Redis is busy, not after a guess at how long the script
	// takes to get there (on a loaded machine it may not have started after 30 ms): a PING
	// on another connection then goes unanswered.
	probe := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { probe.Close() })
	for deadline := time.Now().Add(10 * time.Second); ; {
		pctx, pcancel := context.WithTimeout(ctx, 100*time.Millisecond)
		err := probe.Ping(pctx).Err()
		pcancel()
		if err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Redis never got busy with the script")
		}
		time.Sleep(5 * time.Millisecond)
	}
	tctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	var d Decision
	err := s.Take(tctx, hits, &d)
	cancel()
	if err == nil {
		t.Fatal("the decision must fail: Redis was busy past its deadline")
	}
	if err := <-busy; err != nil {
		t.Fatal(err)
	}
	time.Sleep(4500 * time.Millisecond) // the releases (at once, 1 s and 3 s later) are through
	if u, err := s.Usage(ctx, tok, "acme"); err != nil || u.Reserved != 0 {
		t.Fatalf("a lost decision's hold stays: %+v %v", u, err)
	}
	if u, err := s.Usage(ctx, st, "acme"); err != nil || u.Used != 0 {
		t.Fatalf("a lost decision's slot stays: %+v %v", u, err)
	}
}

// testSomeHoldsExpired: of two holds the older expires first; the next decision drops it and
// keeps counting the younger one, whose settle is live while the expired one's is reported.
func testSomeHoldsExpired(t *testing.T, b backend) {
	alignWindow(t, time.Hour, 30*time.Second)
	ctx := context.Background()
	s := b.stores(t, 1)[0]
	tok := reserveRule(t, "tok", 1000, 100, 1500*time.Millisecond)
	hits := []Hit{{Rule: tok, ID: "acme"}}
	take := func() string {
		t.Helper()
		var d Decision
		if err := s.Take(ctx, hits, &d); err != nil || !d.Allowed {
			t.Fatalf("%v %+v", err, d)
		}
		return d.Hold
	}
	reserved := func(want int64) {
		t.Helper()
		if u, err := s.Usage(ctx, tok, "acme"); err != nil || u.Reserved != want || u.Remaining != 1000-u.Used-want {
			t.Fatalf("usage %+v %v, want %d reserved", u, err, want)
		}
	}
	old := take()
	time.Sleep(800 * time.Millisecond)
	young := take()
	reserved(200)
	time.Sleep(800 * time.Millisecond) // old expired (sleeps only run long), young live for 700 ms more
	reserved(100)
	third := take() // drops the expired hold
	reserved(200)
	if exp, err := s.Settle(ctx, young, hits, 30); err != nil || len(exp) != 0 {
		t.Fatalf("the younger hold must settle live: %v %v", exp, err)
	}
	if exp, err := s.Settle(ctx, old, hits, 40); err != nil || len(exp) != 1 {
		t.Fatalf("the expired hold must be reported: %v %v", exp, err)
	}
	reserved(100)
	if exp, err := s.Settle(ctx, third, hits, -1); err != nil || len(exp) != 0 {
		t.Fatalf("release: %v %v", exp, err)
	}
	reserved(0)
	if u, _ := s.Usage(ctx, tok, "acme"); u.Used != 70 {
		t.Fatalf("used %d, want 70", u.Used)
	}
}
