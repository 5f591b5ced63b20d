package limits

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/docsgate/gateway/internal/redistest"
)

// Tests of the combiner on its own, on a real redis-server, with one call on its own on the
// wire at most (maxDirect 1). Scripts that keep Redis busy hold the node: one sent on its own,
// then one in a batch, so that the calls made meanwhile queue up behind the batch.

// countScript counts one call per key.
var countScript = redis.NewScript(`return redis.call('INCR', KEYS[1])`)

// busyScript keeps Redis busy for ARGV[1] microseconds.
var busyScript = redis.NewScript(`local t0 = redis.call('TIME') local now = t0
while (now[1] - t0[1]) * 1000000 + (now[2] - t0[2]) < tonumber(ARGV[1]) do now = redis.call('TIME') end
return 1`)

// newTestCombiner is a combiner (maxDirect 1) on a fresh redis-server, and that server.
func newTestCombiner(t *testing.T) (*combiner, *redistest.Server) {
	t.Helper()
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	cb := newCombiner(c, 1, coalesceBatch, coalesceQueue)
	t.Cleanup(cb.close)
	return cb, srv
}

// hold keeps the node busy for about 2×d: a busy script for d sent on its own, then one for d
// in a batch, which the flusher is waiting on when hold returns. Their errors arrive on the
// channel.
func hold(t *testing.T, cb *combiner, d time.Duration) <-chan error {
	t.Helper()
	done := make(chan error, 2)
	busy := func() { done <- cb.run(context.Background(), busyScript, []string{"busy"}, d.Microseconds()).Err() }
	go busy()
	waitState(t, cb, "a call on its own on the wire", func() bool { return cb.direct == 1 })
	go busy()
	waitQueued(t, cb, 0)
	return done
}

// waitQueued waits until a batch is on the wire with n calls queued behind it.
func waitQueued(t *testing.T, cb *combiner, n int) {
	t.Helper()
	waitState(t, cb, fmt.Sprintf("%d calls queued behind a batch", n), func() bool { return cb.flushing && len(cb.queue) == n })
}

// waitState waits until cond holds under the combiner's lock.
func waitState(t *testing.T, cb *combiner, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		cb.mu.Lock()
		ok := cond()
		cb.mu.Unlock()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// holdDone waits for both of hold's calls.
func holdDone(t *testing.T, done <-chan error) {
	t.Helper()
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}

// countAll makes n counting calls (keys k0, k1, ...) concurrently and returns their errors.
func countAll(cb *combiner, n int) <-chan error {
	results := make(chan error, n)
	for i := range n {
		go func() {
			v, err := cb.run(context.Background(), countScript, []string{fmt.Sprint("k", i)}).Int()
			if err == nil && v != 1 {
				err = fmt.Errorf("k%d counted %d times", i, v)
			}
			results <- err
		}()
	}
	return results
}

// A decision whose deadline passes while it waits for the wire is never sent: it cannot count
// against the tenant after its request was answered. A call queued behind a 300 ms script
// gives up after 20 ms, and the key it would have counted stays absent.
func TestCombinerAbandonedCallNeverSent(t *testing.T) {
	cb, srv := newTestCombiner(t)
	slow := hold(t, cb, 150*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := cb.run(ctx, countScript, []string{"abandoned"}).Err()
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 20*time.Millisecond+margin() {
		t.Fatalf("queued call: %v after %v, want its deadline's error at about 20ms", err, time.Since(start))
	}
	holdDone(t, slow)
	// The next call shows the node free again, and the flusher past the abandoned call.
	if n, err := cb.run(context.Background(), countScript, []string{"after"}).Int(); err != nil || n != 1 {
		t.Fatalf("call after the stall: %d, %v", n, err)
	}
	waitState(t, cb, "the flusher idle", func() bool { return !cb.flushing })
	if n, err := srv.Client(t).Exists(context.Background(), "abandoned").Result(); err != nil || n != 0 {
		t.Fatalf("the abandoned call ran: EXISTS %d, %v", n, err)
	}
}

// A batch is not cut short by the deadline of the request that queued first: it runs until
// the latest deadline among its calls, and each caller stops waiting at its own. Here the
// first call of a batch is a 100 ms script with a 150 ms deadline; the calls behind it in the
// same pipeline, without a deadline, still get their replies.
func TestCombinerBatchOutlivesFirstDeadline(t *testing.T) {
	cb, _ := newTestCombiner(t)
	// The node is busy until about 200 ms; the next batch then runs from about 200 to 400 ms,
	// its first call with a deadline at 300 ms.
	slow := hold(t, cb, 100*time.Millisecond)
	first := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		first <- cb.run(ctx, busyScript, []string{"first"}, 200_000).Err()
	}()
	waitQueued(t, cb, 1)
	results := countAll(cb, 7)
	waitQueued(t, cb, 8)
	holdDone(t, slow)
	if err := <-first; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("the first call of the batch: %v, want its own deadline's error", err)
	}
	for range 7 {
		if err := <-results; err != nil {
			t.Errorf("a call behind the first in its batch: %v", err)
		}
	}
}

// Calls batched after the node lost its scripts (a restart, SCRIPT FLUSH) load them again and
// run once each.
func TestCombinerBatchAfterScriptFlush(t *testing.T) {
	cb, srv := newTestCombiner(t)
	if err := srv.Client(t).ScriptFlush(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	slow := hold(t, cb, 100*time.Millisecond)
	results := countAll(cb, 5)
	waitQueued(t, cb, 5)
	holdDone(t, slow)
	for range 5 {
		if err := <-results; err != nil {
			t.Error(err)
		}
	}
}

// Closing sends what is queued, then refuses new calls; closing twice does nothing.
func TestCombinerClose(t *testing.T) {
	cb, _ := newTestCombiner(t)
	slow := hold(t, cb, 100*time.Millisecond)
	results := countAll(cb, 3)
	waitQueued(t, cb, 3)
	closed := make(chan struct{})
	go func() { cb.close(); close(closed) }()
	for range 3 {
		if err := <-results; err != nil {
			t.Errorf("a call queued before close: %v", err)
		}
	}
	holdDone(t, slow)
	<-closed
	if err := cb.run(context.Background(), countScript, []string{"late"}).Err(); !errors.Is(err, errCombinerClosed) {
		t.Fatalf("a call after close: %v", err)
	}
}

// While fewer than maxDirect calls are on the wire a call goes out on its own at once, even
// while a batch is on the wire; past maxDirect, calls queue.
func TestCombinerDirectLane(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	cb := newCombiner(c, 3, coalesceBatch, coalesceQueue)
	t.Cleanup(cb.close)
	done := make(chan error, 4)
	for i := range 3 {
		go func() { done <- cb.run(context.Background(), busyScript, []string{"busy"}, 100_000).Err() }()
		waitState(t, cb, fmt.Sprintf("%d calls on their own", i+1), func() bool { return cb.direct == i+1 })
	}
	go func() { done <- cb.run(context.Background(), countScript, []string{"fourth"}).Err() }()
	waitState(t, cb, "the fourth call in a batch", func() bool { return cb.flushing })
	for range 4 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
}
