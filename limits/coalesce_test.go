package limits

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/docsgate/gateway/internal/redistest"
)

// A Redis that stalls while a batch is in flight: every decision in the batch, and every one
// queued behind it, is answered within redis.timeout plus a margin (the Guard's bound), and
// once Redis answers again the coalesced store decides exactly again. Both ways the Guard
// bounds a call: on the caller's goroutine when the client ends calls by their deadline
// (ContextTimeoutEnabled, as the gateway builds it), else from a goroutine of its own.
func TestCoalescedStall(t *testing.T) {
	for _, byDeadline := range []bool{true, false} {
		t.Run(fmt.Sprintf("ContextTimeoutEnabled=%t", byDeadline), func(t *testing.T) { testCoalescedStall(t, byDeadline) })
	}
}

func testCoalescedStall(t *testing.T, byDeadline bool) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, ReadTimeout: time.Second, PoolSize: 8, ContextTimeoutEnabled: byDeadline})
	t.Cleanup(func() { c.Close() })
	const timeout = 100 * time.Millisecond
	inner := newRedisT(t, c, uniquePrefix(), WithCoalescing())
	g := NewGuard(inner, GuardOptions{Timeout: timeout, FailureThreshold: 1 << 30, Cooldown: time.Millisecond})
	if g.inline != byDeadline {
		t.Fatalf("Guard inline %t with ContextTimeoutEnabled %t", g.inline, byDeadline)
	}
	r := rule(t, "stall", 1_000_000, "hour", Fixed)
	hits := []Hit{{Rule: r, ID: "a"}}
	var d Decision
	// Warm-up outside the Guard's bound: the first call dials and loads the script.
	if err := inner.Take(context.Background(), hits, &d); err != nil {
		t.Fatal(err)
	}
	// CLIENT PAUSE stops the server answering every other client for 1.5 s: the decisions sent
	// meanwhile sit in a batch that gets no reply.
	if err := srv.Client(t).Do(context.Background(), "client", "pause", "1500", "all").Err(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var slowest time.Duration
	failed := 0
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var d Decision
			start := time.Now()
			err := g.Take(context.Background(), hits, &d)
			el := time.Since(start)
			mu.Lock()
			defer mu.Unlock()
			slowest = max(slowest, el)
			if errors.Is(err, context.DeadlineExceeded) {
				failed++
			}
		}()
	}
	wg.Wait()
	if slowest > timeout+margin() {
		t.Fatalf("a decision in a stalled batch took %v, bound %v", slowest, timeout+margin())
	}
	if failed != 64 {
		t.Fatalf("%d of 64 decisions failed during the stall, want all", failed)
	}
	// After the stall (and the client's read timeout on the stuck batch), decisions work again.
	deadline := time.Now().Add(5 * time.Second)
	attempts := 0
	for {
		attempts++
		if err := g.Take(context.Background(), hits, &d); err == nil && d.Allowed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("decisions never recovered after the stall")
		}
		time.Sleep(50 * time.Millisecond)
	}
	u, err := g.Usage(context.Background(), r, "a")
	if err != nil {
		t.Fatal(err)
	}
	// Decisions that timed out may still have run when Redis woke up (counted, never
	// admitted: under-admission, never overshoot), but none ran twice.
	if u.Used < 2 || u.Used > int64(1+64+attempts) {
		t.Fatalf("used %d after the stall", u.Used)
	}
	t.Logf("slowest decision during the stall %v; %d counted", slowest, u.Used)
}

// Coalesced decisions are exact under concurrency: a limit of 300 under 1,200 concurrent
// requests admits exactly 300, and each decision is one script call.
func TestCoalescedExactAndOneScriptEach(t *testing.T) {
	srv := redistest.Start(t)
	s := newRedisT(t, srv.Client(t), uniquePrefix(), WithCoalescing())
	if err := s.Preload(context.Background()); err != nil { // as the gateway does at start
		t.Fatal(err)
	}
	stats := srv.Client(t)
	r := rule(t, "exact", 300, "hour", Fixed)
	before := commandCalls(t, stats, "evalsha") + commandCalls(t, stats, "eval")
	var mu sync.Mutex
	n := 0
	var wg sync.WaitGroup
	for w := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var d Decision
			for i := range 20 {
				hits := []Hit{{Rule: r, ID: "tenant"}, {Rule: rule(t, "other", 1_000_000, "day", Fixed), ID: fmt.Sprintf("w%d-%d", w, i%3)}}
				if err := s.Take(context.Background(), hits, &d); err != nil {
					t.Error(err)
					return
				}
				if d.Allowed {
					mu.Lock()
					n++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if n != 300 {
		t.Fatalf("admitted %d, want exactly 300", n)
	}
	calls := commandCalls(t, stats, "evalsha") + commandCalls(t, stats, "eval") - before
	if calls != 64*20 {
		t.Fatalf("%d script calls for %d decisions", calls, 64*20)
	}
}

// readsProcessed is Redis's count of read events on client sockets: a pipelined batch
// arrives in one read, so fewer reads than script calls means calls were coalesced.
func readsProcessed(t testing.TB, c *redis.Client) int64 {
	return int64(infoValue(t, c, "stats", "total_reads_processed"))
}

// infoValue is the number field of one INFO section.
func infoValue(tb testing.TB, c *redis.Client, section, field string) float64 {
	tb.Helper()
	info, err := c.Info(context.Background(), section).Result()
	if err != nil {
		tb.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && k == field {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				tb.Fatal(err)
			}
			return f
		}
	}
	tb.Fatalf("no %s in INFO %s", field, section)
	return 0
}

// takeConcurrently makes workers×each decisions of rule r, workers at a time, each worker
// on its own id.
func takeConcurrently(t *testing.T, s *Redis, r *Rule, workers, each int) {
	t.Helper()
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var d Decision
			for range each {
				if err := s.Take(context.Background(), []Hit{{Rule: r, ID: fmt.Sprint("w", w)}}, &d); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// Calls that arrive while another is on the wire are batched: under 64-way concurrency
// Redis reads far fewer times than it runs scripts. (A call that finds its node idle goes
// straight out; that path is the one every sequential decision of the other tests takes.)
func TestCoalescedBatchesUnderConcurrency(t *testing.T) {
	srv := redistest.Start(t)
	stats := srv.Client(t)
	for _, tc := range []struct {
		name     string
		opts     []RedisOption
		batching bool
	}{{"coalesce", []RedisOption{WithCoalescing()}, true}, {"plain", nil, false}} {
		t.Run(tc.name, func(t *testing.T) {
			s := newRedisT(t, redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 64}), uniquePrefix(), tc.opts...)
			if err := s.Preload(context.Background()); err != nil {
				t.Fatal(err)
			}
			r := rule(t, "batch", 1_000_000, "hour", Fixed)
			const workers, each = 64, 50
			scripts0, reads0 := commandCalls(t, stats, "evalsha"), readsProcessed(t, stats)
			takeConcurrently(t, s, r, workers, each)
			scripts, reads := commandCalls(t, stats, "evalsha")-scripts0, readsProcessed(t, stats)-reads0
			t.Logf("%d script calls in %d reads", scripts, reads)
			if scripts != workers*each {
				t.Fatalf("%d script calls for %d decisions", scripts, workers*each)
			}
			if tc.batching && reads*2 > scripts {
				t.Errorf("%d reads for %d script calls: not batched", reads, scripts)
			}
			if !tc.batching && reads < scripts {
				t.Errorf("%d reads for %d script calls without coalescing: the measure is broken", reads, scripts)
			}
		})
	}
}

// pathCounter is a go-redis hook that counts limiter calls sent on their own (a Process) and
// in batches (a pipeline).
type pathCounter struct{ direct, batches, batched atomic.Int64 }

func (p *pathCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (p *pathCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); n == "evalsha" || n == "eval" {
			p.direct.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (p *pathCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		n := 0
		for _, cmd := range cmds {
			if name := cmd.Name(); name == "evalsha" || name == "eval" {
				n++
			}
		}
		if n > 0 {
			p.batches.Add(1)
			p.batched.Add(int64(n))
		}
		return next(ctx, cmds)
	}
}

// poolUses counts the connections taken from the client's main pool and its pipeline pool.
func poolUses(c *redis.Client) (main, pipeline uint32) {
	st := c.PoolStats()
	if st.PipelineStats != nil {
		pipeline = st.PipelineStats.Hits + st.PipelineStats.Misses
	}
	return st.Hits + st.Misses, pipeline
}

// No batching window: decisions made one at a time each go out at once, on their own, and
// under concurrency most go in batches.
func TestCoalescedLoneCallsGoAtOnce(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 64})
	t.Cleanup(func() { c.Close() })
	var paths pathCounter
	c.AddHook(&paths)
	s := newRedisT(t, c, uniquePrefix(), WithCoalescing())
	if err := s.Preload(context.Background()); err != nil {
		t.Fatal(err)
	}
	r := rule(t, "lane", 1_000_000, "hour", Fixed)
	paths.batches.Store(0) // Preload's own pipeline
	paths.batched.Store(0)
	// Batches run on the client's pipeline pool, a call on its own on the main pool.
	pool0, pipe0 := poolUses(c)
	var d Decision
	for i := range 100 {
		if err := s.Take(context.Background(), []Hit{{Rule: r, ID: fmt.Sprint("seq", i)}}, &d); err != nil {
			t.Fatal(err)
		}
	}
	pool1, pipe1 := poolUses(c)
	if pool1-pool0 < 100 || pipe1 != pipe0 || paths.batched.Load() != 0 {
		t.Fatalf("100 sequential decisions: %d main-pool and %d pipeline-pool connection uses, %d in batches; want 100, 0 and 0",
			pool1-pool0, pipe1-pipe0, paths.batched.Load())
	}
	paths.direct.Store(0)
	const workers, each = 64, 50
	takeConcurrently(t, s, r, workers, each)
	direct, batches, batched := paths.direct.Load(), paths.batches.Load(), paths.batched.Load()
	t.Logf("%d decisions: %d on their own, %d in %d batches", workers*each, direct, batched, batches)
	if direct+batched != workers*each {
		t.Fatalf("%d + %d calls for %d decisions", direct, batched, workers*each)
	}
	if batched < workers*each/2 || batches >= batched {
		t.Errorf("under 64-way concurrency only %d of %d decisions went in %d batches", batched, workers*each, batches)
	}
}
