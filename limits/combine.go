package limits

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// combiner coalesces the limiter calls bound for one Redis node (auto-pipelining without a
// batching window). A call that finds the node idle goes out at once, on its own goroutine,
// as a plain command. Calls that arrive while one is on the wire queue up, and go out together
// as the next batch, in one pipeline (one write, one read), as soon as the wire is free: the
// node has at most one write of limiter calls in flight, and nothing ever waits for a timer.
// Each call is still its own script call. A call waits no longer than its context allows; a
// call whose context ends before its batch is sent is never sent; a failed batch fails only
// the calls it carried.
//
// It is built on go-redis's pipelines rather than its AutoPipeliner, whose batching holds
// stragglers on timers and hands every call to a flusher goroutine even when it is alone.
type combiner struct {
	node     *redis.Client
	maxBatch int // calls per pipeline
	maxQueue int // calls waiting; past it a call fails at once, as a Redis error does
	calls    sync.Pool

	mu    sync.Mutex
	busy  bool    // a call or batch is on the wire; whoever set it sends the queue after it
	queue []*call // in arrival order
	batch []*call // the flusher's buffer

	wake chan struct{} // hands the queue to the flusher
	quit chan struct{}
	done chan struct{} // closed when the flusher has stopped
}

// call is one queued script call. Its command is built by its caller, so nothing of the
// caller's memory (keys, arguments) is read after the caller may have given up.
type call struct {
	ctx        context.Context
	script     *redis.Script
	cmd        *redis.Cmd
	state      atomic.Int32  // callQueued, callTaken or callAbandoned
	ready      chan struct{} // gets a value once cmd holds the reply
	hasTimeout bool
	deadline   time.Time
}

const (
	callQueued int32 = iota
	callTaken
	callAbandoned
)

func newCombiner(node *redis.Client, maxBatch, maxQueue int) *combiner {
	c := &combiner{node: node, maxBatch: maxBatch, maxQueue: maxQueue,
		wake: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
	c.calls.New = func() any { return &call{ready: make(chan struct{}, 1)} }
	go c.flusher()
	return c
}

// run runs script with keys and args on the node: at once when the node is idle, else in the
// next batch.
func (c *combiner) run(ctx context.Context, script *redis.Script, keys []string, args ...any) *redis.Cmd {
	c.mu.Lock()
	if !c.busy {
		c.busy = true
		c.mu.Unlock()
		cmd := script.Run(ctx, c.node, keys, args...)
		c.release()
		return cmd
	}
	if len(c.queue) >= c.maxQueue {
		c.mu.Unlock()
		return failedCmd(ctx, fmt.Errorf("limits: %d calls already wait for one Redis node", c.maxQueue))
	}
	cl := c.calls.Get().(*call)
	cl.ctx, cl.script, cl.cmd = ctx, script, evalSha(ctx, script, keys, args)
	cl.deadline, cl.hasTimeout = ctx.Deadline()
	cl.state.Store(callQueued)
	c.queue = append(c.queue, cl)
	c.mu.Unlock()

	select {
	case <-cl.ready:
		cmd := cl.cmd
		cl.ctx, cl.script, cl.cmd = nil, nil, nil
		c.calls.Put(cl)
		return cmd
	case <-ctx.Done():
		// Still queued: it is never sent. Already taken: its reply comes too late. Either
		// way the flusher may still hold cl, so it is not pooled again.
		cl.state.CompareAndSwap(callQueued, callAbandoned)
		return failedCmd(ctx, ctx.Err())
	}
}

// release ends a call that went out at once: the calls queued meanwhile go to the flusher,
// which keeps the node busy until the queue is empty.
func (c *combiner) release() {
	c.mu.Lock()
	if len(c.queue) == 0 {
		c.busy = false
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	c.wake <- struct{}{} // never blocks: the flusher is idle while c.busy is held here
}

// flusher sends the queue, a batch at a time, each as soon as the previous one is answered,
// until it is empty.
func (c *combiner) flusher() {
	defer close(c.done)
	for {
		select {
		case <-c.wake:
		case <-c.quit:
			return
		}
		for c.sendNext() {
		}
	}
}

// sendNext sends up to maxBatch queued calls as one pipeline; false once the queue is empty
// (the node is idle again).
func (c *combiner) sendNext() bool {
	c.mu.Lock()
	n := min(len(c.queue), c.maxBatch)
	if n == 0 {
		c.busy = false
		c.mu.Unlock()
		return false
	}
	batch := c.batch[:0]
	for _, cl := range c.queue[:n] {
		if cl.state.CompareAndSwap(callQueued, callTaken) {
			batch = append(batch, cl)
		}
	}
	rest := copy(c.queue, c.queue[n:])
	clear(c.queue[rest:])
	c.queue = c.queue[:rest]
	c.mu.Unlock()

	if len(batch) > 0 {
		c.send(batch)
	}
	clear(batch) // the calls are their callers' again
	c.batch = batch
	return true
}

// send runs a batch in one pipeline, then hands every call its reply. The batch runs until the
// latest deadline among its calls (each caller stops waiting at its own), whatever happens to
// the request that queued first.
func (c *combiner) send(batch []*call) {
	ctx := context.WithoutCancel(batch[0].ctx)
	var latest time.Time
	bounded := true
	for _, cl := range batch {
		bounded = bounded && cl.hasTimeout
		if cl.deadline.After(latest) {
			latest = cl.deadline
		}
	}
	if bounded {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, latest)
		defer cancel()
	}
	c.exec(ctx, batch)
	// NOSCRIPT: the node lost its script cache (a restart, SCRIPT FLUSH). Load the scripts
	// again and resend those calls, once.
	var again []*call
	var loaded []*redis.Script
	for _, cl := range batch {
		if err := cl.cmd.Err(); err == nil || !redis.HasErrorPrefix(err, "NOSCRIPT") {
			continue
		}
		if !slices.Contains(loaded, cl.script) {
			if err := cl.script.Load(ctx, c.node).Err(); err != nil {
				continue // the call keeps its NOSCRIPT error
			}
			loaded = append(loaded, cl.script)
		}
		cl.cmd = redis.NewCmd(cl.ctx, cl.cmd.Args()...)
		again = append(again, cl)
	}
	if len(again) > 0 {
		c.exec(ctx, again)
	}
	for _, cl := range batch {
		cl.ready <- struct{}{}
	}
}

// exec sends the calls' commands in one pipeline; each command gets its own reply or error.
func (c *combiner) exec(ctx context.Context, calls []*call) {
	pipe := c.node.Pipeline()
	for _, cl := range calls {
		_ = pipe.Process(ctx, cl.cmd)
	}
	_, _ = pipe.Exec(ctx)
}

// evalSha is the EVALSHA command of script with keys and args, as Script.EvalSha builds it.
func evalSha(ctx context.Context, script *redis.Script, keys []string, args []any) *redis.Cmd {
	argv := make([]any, 0, 3+len(keys)+len(args))
	argv = append(argv, "evalsha", script.Hash(), len(keys))
	for _, k := range keys {
		argv = append(argv, k)
	}
	return redis.NewCmd(ctx, append(argv, args...)...)
}

// close stops the flusher once the calls under way are answered.
func (c *combiner) close() {
	close(c.quit)
	<-c.done
}

func failedCmd(ctx context.Context, err error) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(err)
	return cmd
}
