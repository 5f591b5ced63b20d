package limits

import (
	"context"
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/docsgate/gateway/internal/redistest"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// stateLog records the breakers' events (OnBreaker).
type stateLog struct {
	mu     sync.Mutex
	s      []bool   // opened (true) and closed (false), of every node
	events []string // every event, "node event"
}

func (l *stateLog) add(node string, e BreakerEvent) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.events = append(l.events, node+" "+[...]string{"seen", "opened", "closed", "gone"}[e])
	if e == BreakerOpened || e == BreakerClosed {
		l.s = append(l.s, e == BreakerOpened)
	}
}

func (l *stateLog) get() []bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]bool(nil), l.s...)
}

func (l *stateLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.events...)
}

// timedTake runs one Take and fails the test if it took longer than max.
func timedTake(t *testing.T, g *Guard, hits []Hit, d *Decision, max time.Duration) error {
	t.Helper()
	start := time.Now()
	err := g.Take(context.Background(), hits, d)
	if el := time.Since(start); el > max {
		t.Fatalf("Take took %v, bound %v (err %v)", el, max, err)
	}
	return err
}

// margin is what a bound on a call adds to the Guard's timeout for scheduling noise: 150 ms,
// widened on a machine whose scheduler already runs late (a loaded 2-core machine under -race):
// five times the latest wake-up of twenty 1 ms sleeps, measured once per test binary. A bound
// measured this way holds beside busy neighbours without hiding a Guard that waits for the
// client's own, longer timeouts (hundreds of milliseconds more).
var margin = sync.OnceValue(func() time.Duration { return 150*time.Millisecond + 5*schedulerLateness() })

// fastBound is the bound of a call the Guard refuses without asking the store (an open
// breaker): 10 ms, plus the machine's lateness as margin measures it.
func fastBound() time.Duration { return 10*time.Millisecond + 5*schedulerLateness() }

var schedulerLateness = sync.OnceValue(func() time.Duration {
	var worst time.Duration
	for range 20 {
		start := time.Now()
		time.Sleep(time.Millisecond)
		worst = max(worst, time.Since(start)-time.Millisecond)
	}
	return worst
})

// TestGuardStalledRedis: a server that accepts connections and never answers.
// Every Take returns within Timeout + margin although the client itself
// (ContextTimeoutEnabled false, the go-redis default) would wait its full
// ReadTimeout; the breaker opens after the threshold and then fails fast.
func TestGuardStalledRedis(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns sync.WaitGroup
	var mu sync.Mutex
	var open []net.Conn
	conns.Add(1)
	go func() {
		defer conns.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			open = append(open, c) // hold it, never answer
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		conns.Wait()
		mu.Lock()
		for _, c := range open {
			c.Close()
		}
		mu.Unlock()
	})
	c := redis.NewClient(&redis.Options{Addr: l.Addr().String(), ReadTimeout: 700 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })

	var log stateLog
	const timeout = 100 * time.Millisecond
	g := NewGuard(newRedisT(t, c, "gw"), GuardOptions{Timeout: timeout, FailureThreshold: 3, Cooldown: time.Hour, OnBreaker: log.add})
	hits := []Hit{{Rule: rule(t, "r", 10, "hour", Fixed), ID: "a"}}
	var d Decision
	for i := 0; i < 3; i++ {
		err := timedTake(t, g, hits, &d, timeout+margin())
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("take %d: err %v, want deadline exceeded", i, err)
		}
		if open := g.OpenNodes(); (len(open) == 1) != (i == 2) {
			t.Fatalf("after %d failures OpenNodes() = %v", i+1, open)
		}
	}
	for i := 0; i < 3; i++ {
		if err := timedTake(t, g, hits, &d, fastBound()); !errors.Is(err, ErrBreakerOpen) {
			t.Fatalf("open breaker: err %v", err)
		}
	}
	if _, err := g.Usage(context.Background(), hits[0].Rule, "a"); !errors.Is(err, ErrBreakerOpen) {
		t.Fatalf("Usage with open breaker: %v", err)
	}
	if got := log.get(); len(got) != 1 || !got[0] {
		t.Fatalf("state changes %v, want [true]", got)
	}
	// Let the abandoned calls end (client ReadTimeout) before the cleanup.
	time.Sleep(800 * time.Millisecond)
}

// TestGuardRedisDownAndBack kills a real redis-server by PID, checks the
// bound and the breaker (including a failed half-open trial), restarts it and
// checks that the Guard recovers by itself.
func TestGuardRedisDownAndBack(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	var log stateLog
	const timeout, cooldown = 200 * time.Millisecond, 300 * time.Millisecond
	inner := newRedisT(t, c, "gw")
	g := NewGuard(inner, GuardOptions{Timeout: timeout, FailureThreshold: 3, Cooldown: cooldown, OnBreaker: log.add})
	r := rule(t, "r", 1000, "hour", Fixed)
	hits := []Hit{{Rule: r, ID: "a"}}
	var d Decision
	// The connection is dialled and the script loaded outside the Guard, unbounded: a first call
	// over a new connection is no measure of the Guard.
	if err := inner.Take(context.Background(), []Hit{{Rule: r, ID: "warm"}}, &d); err != nil {
		t.Fatal(err)
	}
	if err := timedTake(t, g, hits, &d, timeout+margin()); err != nil || !d.Allowed || d.Results[0].Remaining != 999 {
		t.Fatalf("healthy take: %+v %v", d, err)
	}
	srv.Stop(t)
	for i := 0; i < 3; i++ {
		if err := timedTake(t, g, hits, &d, timeout+margin()); err == nil || errors.Is(err, ErrBreakerOpen) {
			t.Fatalf("take %d with redis down: %v", i, err)
		}
	}
	if open := g.OpenNodes(); len(open) != 1 || open[0] != srv.Addr {
		t.Fatalf("after 3 failures the open breakers are %v, want [%s]", open, srv.Addr)
	}
	if err := timedTake(t, g, hits, &d, fastBound()); !errors.Is(err, ErrBreakerOpen) {
		t.Fatalf("want ErrBreakerOpen, got %v", err)
	}
	// Cool-down over, Redis still down: the one trial fails, the breaker
	// opens again at once.
	time.Sleep(cooldown + 20*time.Millisecond)
	if err := timedTake(t, g, hits, &d, timeout+margin()); err == nil || errors.Is(err, ErrBreakerOpen) {
		t.Fatalf("half-open trial: %v", err)
	}
	if err := timedTake(t, g, hits, &d, fastBound()); !errors.Is(err, ErrBreakerOpen) {
		t.Fatalf("after failed trial: %v", err)
	}

	srv.Restart(t)
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := timedTake(t, g, hits, &d, timeout+margin())
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("guard did not recover after restart: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if open := g.OpenNodes(); len(open) != 0 || !d.Allowed {
		t.Fatalf("after recovery: open %v, decision %+v", open, d)
	}
	if got := log.get(); len(got) != 2 || !got[0] || got[1] {
		t.Fatalf("state changes %v, want [true false]", got)
	}
	if u, err := g.Usage(context.Background(), r, "a"); err != nil || u.Used != 1 { // data lost with the restart
		t.Fatalf("usage after restart: %+v %v", u, err)
	}
}

// TestGuardPassThrough: results are copied into the caller's Decision and a
// caller's own cancellation does not count against the store.
func TestGuardPassThrough(t *testing.T) {
	// Every call's goroutine has finished when the call returned.
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	g := NewGuard(NewMemory(), GuardOptions{FailureThreshold: 1})
	r := rule(t, "r", 2, "hour", Fixed)
	var d Decision
	for i := 0; i < 3; i++ {
		if err := g.Take(context.Background(), []Hit{{Rule: r, ID: "a"}, {Rule: r, ID: "b"}}, &d); err != nil {
			t.Fatal(err)
		}
		if d.Allowed != (i < 2) || len(d.Results) != 2 || d.Results[0].Rule != r {
			t.Fatalf("take %d: %+v", i, d)
		}
	}
	if u, err := g.Usage(context.Background(), r, "a"); err != nil || u.Used != 2 {
		t.Fatalf("usage %+v %v", u, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := g.Take(ctx, []Hit{{Rule: r, ID: "a"}}, &d); err == nil {
		t.Fatal("cancelled ctx: no error")
	}
	if open := g.OpenNodes(); len(open) != 0 {
		t.Fatalf("caller cancellation opened the breaker: %v", open)
	}
}

// A debit or a refund runs after the answer: a Redis slower than redis.timeout (paused for
// 300 ms here, against a 50 ms timeout) delays it but does not lose it, as long as the
// caller's own deadline allows; a Take in the same pause still fails within the timeout.
func TestGuardOffPathWritesOutlastTimeout(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	const timeout = 50 * time.Millisecond
	inner := newRedisT(t, c, uniquePrefix())
	g := NewGuard(inner, GuardOptions{Timeout: timeout, FailureThreshold: 1 << 30, Cooldown: time.Millisecond})
	tokens := rule(t, "tok", 1000, "hour", Fixed)
	tokens.Unit = Tokens
	reqs := rule(t, "req", 10, "hour", Fixed)
	var d Decision
	// The first call dials and loads the script: made outside the Guard, without its 50 ms
	// bound, which a new connection on a busy machine can miss.
	if err := inner.Take(context.Background(), []Hit{{Rule: reqs, ID: "a"}}, &d); err != nil {
		t.Fatal(err)
	}
	taken := d.Taken([]Hit{{Rule: reqs, ID: "a"}}, nil)
	if len(taken) != 1 {
		t.Fatalf("taken %v", taken)
	}
	pause := func() {
		if err := srv.Client(t).Do(context.Background(), "client", "pause", "300", "all").Err(); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()

	pause()
	start := time.Now()
	if err := g.Take(context.Background(), []Hit{{Rule: reqs, ID: "b"}}, &d); err == nil || time.Since(start) > timeout+margin() {
		t.Fatalf("a Take during the pause: %v after %v, want an error within %v", err, time.Since(start), timeout)
	}
	if err := g.Debit(ctx, []Hit{{Rule: tokens, ID: "a"}}, 7); err != nil {
		t.Fatalf("a debit during the pause: %v", err)
	}
	pause()
	if err := g.Refund(ctx, taken); err != nil {
		t.Fatalf("a refund during the pause: %v", err)
	}
	if u, err := g.Usage(context.Background(), tokens, "a"); err != nil || u.Used != 7 {
		t.Fatalf("tokens used %+v %v, want 7", u, err)
	}
	if u, err := g.Usage(context.Background(), reqs, "a"); err != nil || u.Used != 0 {
		t.Fatalf("requests used %+v %v, want 0 after the refund", u, err)
	}
}
