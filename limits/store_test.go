package limits

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/docsgate/gateway/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// backend builds Store instances that share one backing state: n instances
// simulate n gateway replicas (one client each for Redis).
type backend struct {
	name    string
	stores  func(t *testing.T, n int) []Store
	redis   redis.UniversalClient // nil for memory
	cluster bool
	ref     *redis.Client // standalone server for redis_rate comparisons
}

var prefixSeq atomic.Int64

// uniquePrefix keeps subtests on one server apart.
func uniquePrefix() string { return fmt.Sprintf("t%d", prefixSeq.Add(1)) }

// onEveryStore runs suite in parallel against the memory store, a standalone redis-server and
// a 3-master Redis Cluster, each also behind a Guard as the gateway uses it.
func onEveryStore(t *testing.T, suite func(t *testing.T, s Store)) {
	for _, b := range backends(t, true) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			suite(t, b.stores(t, 1)[0])
		})
		t.Run(b.name+"/guard", func(t *testing.T) {
			t.Parallel()
			suite(t, NewGuard(b.stores(t, 1)[0], GuardOptions{Timeout: time.Second}))
		})
	}
}

// admitted takes hits on s and fails t unless the decision admits them.
func admitted(t *testing.T, s Store, hits []Hit) Decision {
	t.Helper()
	var d Decision
	if err := s.Take(context.Background(), hits, &d); err != nil || !d.Allowed {
		t.Fatalf("take: %v %+v", err, d)
	}
	return d
}

func backends(t *testing.T, withCluster bool) []backend {
	srv := redistest.Start(t)
	bs := []backend{
		{name: "memory", stores: func(t *testing.T, n int) []Store {
			m := NewMemory()
			out := make([]Store, n)
			for i := range out {
				out[i] = m
			}
			return out
		}},
		{name: "redis", redis: srv.Client(t), stores: func(t *testing.T, n int) []Store {
			p := uniquePrefix()
			out := make([]Store, n)
			for i := range out {
				out[i] = newRedisT(t, srv.Client(t), p)
			}
			return out
		}},
		{name: "redis-coalesced", redis: srv.Client(t), stores: func(t *testing.T, n int) []Store {
			p := uniquePrefix()
			out := make([]Store, n)
			for i := range out {
				out[i] = newRedisT(t, srv.Client(t), p, WithCoalescing())
			}
			return out
		}},
	}
	for i := range bs {
		bs[i].ref = srv.Client(t)
	}
	if withCluster {
		cl := redistest.StartCluster(t, 3)
		bs = append(bs, backend{name: "cluster", redis: cl.Client(t), cluster: true, stores: func(t *testing.T, n int) []Store {
			p := uniquePrefix()
			out := make([]Store, n)
			for i := range out {
				out[i] = newRedisT(t, cl.Client(t), p)
			}
			return out
		}, ref: srv.Client(t)})
		bs = append(bs, backend{name: "cluster-coalesced", redis: cl.Client(t), cluster: true, stores: func(t *testing.T, n int) []Store {
			p := uniquePrefix()
			out := make([]Store, n)
			for i := range out {
				out[i] = newRedisT(t, cl.Client(t), p, WithCoalescing())
			}
			return out
		}, ref: srv.Client(t)})
	}
	return bs
}

func rule(t testing.TB, name string, limit int64, win string, algo Algorithm) *Rule {
	return &Rule{Name: name, Limit: limit, Window: mustWindow(t, win), Algorithm: algo}
}

// alignWindow waits until at least need is left in the current window of
// length win, so a burst stays inside one window. Redis TIME and the memory
// store both use this machine's clock.
func alignWindow(t *testing.T, win, need time.Duration) {
	t.Helper()
	_, end := Window{kind: kindDuration, secs: int64(win / time.Second)}.Bounds(time.Now())
	if left := time.Until(end); left < need {
		time.Sleep(left + 5*time.Millisecond)
	}
}

// idsOnDistinctNodes returns ids whose hash slots fall in the three slot
// ranges redis-cli assigns to a 3-master cluster.
func idsOnDistinctNodes(n int) []string {
	var ids []string
	want := 0
	for i := 0; len(ids) < n; i++ {
		id := fmt.Sprintf("id%d", i)
		if int(keySlot(id))*3/16384 == want%3 {
			ids = append(ids, id)
			want++
		}
	}
	return ids
}

// TestStores runs the shared suite against the memory store, a standalone
// redis-server and a 3-master Redis Cluster.
func TestStores(t *testing.T) {
	t.Parallel() // servers of its own, and no latency bound
	for _, b := range backends(t, true) {
		t.Run(b.name, func(t *testing.T) {
			t.Run("Exact", func(t *testing.T) { testExact(t, b) })
			t.Run("ExactMultiRule", func(t *testing.T) { testExactMultiRule(t, b) })
			t.Run("AllOrNothing", func(t *testing.T) { testAllOrNothing(t, b) })
			t.Run("NewWindow", func(t *testing.T) { testNewWindow(t, b) })
			t.Run("Usage", func(t *testing.T) { testUsage(t, b) })
			t.Run("Disabled", func(t *testing.T) { testDisabled(t, b) })
			t.Run("GCRAvsRedisRate", func(t *testing.T) {
				t.Parallel() // it mostly sleeps: beside the others, on keys of its own
				testGCRADifferential(t, b)
			})
			t.Run("GCRAWithFixed", func(t *testing.T) { testGCRAWithFixed(t, b) })
			t.Run("Tokens", func(t *testing.T) { testTokens(t, b) })
			t.Run("TokensConcurrentDebits", func(t *testing.T) { testTokensConcurrentDebits(t, b) })
			t.Run("Scan", func(t *testing.T) { testScan(t, b) })
			t.Run("AlgorithmSwitch", func(t *testing.T) { testAlgorithmSwitch(t, b) })
			t.Run("LargestLimit", func(t *testing.T) { testLargestLimit(t, b) })
			t.Run("ShadowHits", func(t *testing.T) { testShadowHits(t, b) })
			t.Run("Units", func(t *testing.T) { testUnits(t, b) })
		})
	}
}

// testExact: many goroutines over 3 store instances push 3x the limit; exactly
// Limit are admitted, never more.
func testExact(t *testing.T, b backend) {
	const limit, perWorker, workers = 60, 15, 12 // demand 180
	stores := b.stores(t, 3)
	r := rule(t, "exact", limit, "3s", Fixed)
	alignWindow(t, 3*time.Second, 2*time.Second)
	var admitted atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(s Store) {
			defer wg.Done()
			var d Decision
			for i := 0; i < perWorker; i++ {
				if err := s.Take(context.Background(), []Hit{{Rule: r, ID: "p1"}}, &d); err != nil {
					errs <- err
					return
				}
				if d.Allowed {
					admitted.Add(1)
				}
			}
		}(stores[w%len(stores)])
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := admitted.Load(); got != limit {
		t.Fatalf("admitted %d, want exactly %d", got, limit)
	}
	u, err := stores[0].Usage(context.Background(), r, "p1")
	if err != nil || u.Used != limit || u.Remaining != 0 {
		t.Fatalf("usage %+v %v", u, err)
	}
}

// testExactMultiRule: concurrent decisions over two rules and ids (on
// different cluster nodes); the tighter rule caps admissions, and the looser
// one counts exactly the admitted ones (nothing leaks from denied decisions).
func testExactMultiRule(t *testing.T, b backend) {
	stores := b.stores(t, 3)
	ids := idsOnDistinctNodes(3)
	tight := rule(t, "tight", 25, "3s", Fixed)
	loose := rule(t, "loose", 1000, "3s", Fixed)
	g := rule(t, "gloose", 1000, "hour", GCRA)
	alignWindow(t, 3*time.Second, 2*time.Second)
	var admitted atomic.Int64
	var wg sync.WaitGroup
	var failed atomic.Value
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(s Store) {
			defer wg.Done()
			hits := []Hit{{Rule: loose, ID: ids[0]}, {Rule: g, ID: ids[2]}, {Rule: tight, ID: ids[1]}}
			var d Decision
			for i := 0; i < 10; i++ {
				if err := s.Take(context.Background(), hits, &d); err != nil {
					failed.Store(err)
					return
				}
				if d.Allowed {
					admitted.Add(1)
				} else if d.Denied() != 2 {
					failed.Store(fmt.Errorf("denied by %d, want 2: %+v", d.Denied(), d.Results))
					return
				}
			}
		}(stores[w%3])
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		t.Fatal(err)
	}
	if admitted.Load() != 25 {
		t.Fatalf("admitted %d, want 25", admitted.Load())
	}
	ul, _ := stores[0].Usage(context.Background(), loose, ids[0])
	ug, _ := stores[1].Usage(context.Background(), g, ids[2])
	if ul.Used != 25 || ug.Used != 25 {
		t.Fatalf("loose used %d, gcra used %d, want 25 each (denied decisions consumed)", ul.Used, ug.Used)
	}
}

func testAllOrNothing(t *testing.T, b backend) {
	s := b.stores(t, 1)[0]
	ctx := context.Background()
	ids := idsOnDistinctNodes(3)
	big := rule(t, "big", 100, "hour", Fixed)
	small := rule(t, "small", 2, "hour", Fixed)
	gc := rule(t, "gc", 50, "hour", GCRA)
	hits := []Hit{{Rule: big, ID: ids[0]}, {Rule: gc, ID: ids[2]}, {Rule: small, ID: ids[1]}}
	var d Decision
	for i := 0; i < 5; i++ {
		if err := s.Take(ctx, hits, &d); err != nil {
			t.Fatal(err)
		}
		if want := i < 2; d.Allowed != want {
			t.Fatalf("take %d: allowed %v, want %v", i, d.Allowed, want)
		}
		if len(d.Results) != 3 || d.Results[0].Rule != big || d.Results[2].Rule != small {
			t.Fatalf("results not in hit order: %+v", d.Results)
		}
		if i == 1 && (d.Results[0].Remaining != 98 || d.Results[1].Remaining != 48 || d.Results[2].Remaining != 0) {
			t.Fatalf("remaining after 2nd admit: %+v", d.Results)
		}
	}
	if d.Denied() != 2 {
		t.Fatalf("Denied() = %d, want 2", d.Denied())
	}
	r0, r2 := d.Results[0], d.Results[2]
	if !r0.Allowed || r0.Remaining != 98 || r0.RetryAfter != 0 {
		t.Fatalf("big result on deny: %+v", r0)
	}
	if d.Results[1].Remaining != 48 || !d.Results[1].Allowed {
		t.Fatalf("gcra result on deny: %+v", d.Results[1])
	}
	if r2.Allowed || r2.Remaining != 0 || r2.RetryAfter <= 0 || r2.RetryAfter < r2.Reset || r2.Reset > time.Hour {
		t.Fatalf("small result on deny: %+v", r2)
	}
	for _, c := range []struct {
		r    *Rule
		id   string
		used int64
	}{{big, ids[0], 2}, {gc, ids[2], 2}, {small, ids[1], 2}} {
		u, err := s.Usage(ctx, c.r, c.id)
		if err != nil || u.Used != c.used {
			t.Fatalf("%s: usage %+v %v, want used %d", c.r.Name, u, err, c.used)
		}
	}
	// Denied() on an admitted decision.
	if err := s.Take(ctx, hits[:1], &d); err != nil || !d.Allowed || d.Denied() != -1 || len(d.Results) != 1 {
		t.Fatalf("single hit: %+v %v", d, err)
	}
}

func testNewWindow(t *testing.T, b backend) {
	s := b.stores(t, 1)[0]
	ctx := context.Background()
	r := rule(t, "nw", 3, "1s", Fixed)
	alignWindow(t, time.Second, 500*time.Millisecond)
	var d Decision
	hits := []Hit{{Rule: r, ID: "x"}}
	for i := 0; i < 4; i++ {
		if err := s.Take(ctx, hits, &d); err != nil {
			t.Fatal(err)
		}
	}
	res := d.Results[0]
	if d.Allowed || res.RetryAfter <= 0 || res.RetryAfter > time.Second || res.RetryAfter < res.Reset {
		t.Fatalf("4th take: %+v", d)
	}
	time.Sleep(res.RetryAfter + 20*time.Millisecond)
	if err := s.Take(ctx, hits, &d); err != nil || !d.Allowed || d.Results[0].Remaining != 2 {
		t.Fatalf("new window: %+v %v", d, err)
	}
}

func testUsage(t *testing.T, b backend) {
	s := b.stores(t, 1)[0]
	ctx := context.Background()
	fixed := rule(t, "uf", 10, "hour", Fixed)
	month := rule(t, "um", 10000, "month", Fixed)
	gc := rule(t, "ug", 10, "10s", GCRA)
	u, err := s.Usage(ctx, fixed, "nobody")
	if err != nil || u.Used != 0 || u.Remaining != 10 || u.Limit != 10 || u.Name != "uf" {
		t.Fatalf("fresh usage %+v %v", u, err)
	}
	var d Decision
	for i := 0; i < 3; i++ {
		if err := s.Take(ctx, []Hit{{Rule: fixed, ID: "a"}, {Rule: gc, ID: "a"}, {Rule: month, ID: "a"}}, &d); err != nil || !d.Allowed {
			t.Fatalf("take: %+v %v", d, err)
		}
	}
	now := time.Now()
	for i := 0; i < 2; i++ { // reading twice must not consume
		u, err = s.Usage(ctx, fixed, "a")
		if err != nil || u.Used != 3 || u.Remaining != 7 {
			t.Fatalf("fixed usage %+v %v", u, err)
		}
	}
	if _, end := fixed.Window.Bounds(now); !u.Reset.Equal(end) {
		t.Fatalf("fixed reset %v, want %v", u.Reset, end)
	}
	// The month window of the store (Lua arithmetic from Redis TIME for Redis)
	// agrees with Go's Bounds, both in Usage and in the Take result.
	_, mend := month.Window.Bounds(now)
	if u, err = s.Usage(ctx, month, "a"); err != nil || u.Used != 3 || !u.Reset.Equal(mend) {
		t.Fatalf("month usage %+v %v, want reset %v", u, err, mend)
	}
	if got := now.Add(d.Results[2].Reset); got.Sub(mend).Abs() > time.Second {
		t.Fatalf("month Take reset ends at %v, want %v", got, mend)
	}
	u, err = s.Usage(ctx, gc, "a")
	if err != nil || u.Used != 3 || u.Remaining != 7 {
		t.Fatalf("gcra usage %+v %v", u, err)
	}
	// TAT = 3 emission intervals (1s each) ahead of the first take.
	if d := time.Until(u.Reset); d < 2500*time.Millisecond || d > 3*time.Second {
		t.Fatalf("gcra reset in %v, want ~3s", d)
	}
}

func testDisabled(t *testing.T, b backend) {
	s := b.stores(t, 1)[0]
	off := rule(t, "off", 0, "hour", Fixed)
	on := rule(t, "on", 1, "hour", Fixed)
	var d Decision
	for i := 0; i < 3; i++ {
		if err := s.Take(context.Background(), []Hit{{Rule: off, ID: "a"}}, &d); err != nil || !d.Allowed {
			t.Fatalf("disabled rule denied: %+v %v", d, err)
		}
	}
	s.Take(context.Background(), []Hit{{Rule: off, ID: "a"}, {Rule: on, ID: "a"}}, &d)
	if !d.Allowed {
		t.Fatalf("first take with limit 1 denied: %+v", d)
	}
	s.Take(context.Background(), []Hit{{Rule: off, ID: "a"}, {Rule: on, ID: "a"}}, &d)
	if d.Allowed || d.Denied() != 1 {
		t.Fatalf("second take: %+v", d)
	}
	bad := &Rule{Name: "x{y}", Limit: 1, Window: mustWindow(t, "hour")}
	if err := s.Take(context.Background(), []Hit{{Rule: bad, ID: "a"}}, &d); err == nil {
		t.Fatal("rule name with braces accepted")
	}
	if err := s.Take(context.Background(), []Hit{{Rule: nil, ID: "a"}}, &d); err == nil {
		t.Fatal("nil rule accepted")
	}
}

// testGCRAWithFixed: a GCRA rule denies inside a decision with a fixed rule,
// and the fixed rule is not consumed.
func testGCRAWithFixed(t *testing.T, b backend) {
	s := b.stores(t, 1)[0]
	ids := idsOnDistinctNodes(2)
	gc := rule(t, "g2", 3, "hour", GCRA)
	fx := rule(t, "f2", 100, "hour", Fixed)
	var d Decision
	for i := 0; i < 5; i++ {
		if err := s.Take(context.Background(), []Hit{{Rule: fx, ID: ids[0]}, {Rule: gc, ID: ids[1]}}, &d); err != nil {
			t.Fatal(err)
		}
		if d.Allowed != (i < 3) {
			t.Fatalf("take %d: %+v", i, d)
		}
	}
	g := d.Results[1]
	// One emission interval is 20 minutes.
	if g.Allowed || g.RetryAfter < 19*time.Minute || g.RetryAfter > 20*time.Minute || g.Reset < 59*time.Minute {
		t.Fatalf("gcra deny result: %+v", g)
	}
	if u, _ := s.Usage(context.Background(), fx, ids[0]); u.Used != 3 {
		t.Fatalf("fixed used %d, want 3", u.Used)
	}
}

// newRedisT is NewRedis for tests: an option error fails the test.
func newRedisT(tb testing.TB, c redis.UniversalClient, prefix string, opts ...RedisOption) *Redis {
	tb.Helper()
	r, err := NewRedis(c, prefix, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = r.Close() })
	return r
}
