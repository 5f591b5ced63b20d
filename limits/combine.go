package limits

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// combiner coalesces the limiter calls bound for one Redis node (auto-pipelining without a
// batching window). While fewer than maxDirect calls are on the wire, a call goes out at once,
// on its own goroutine and connection, as a plain command: at moderate load every call does,
// with the latency of no coalescing at all. Past that, calls queue, and a flusher sends the
// queue as one pipeline (one write, one read) at once, or as soon as its previous batch is
// answered: batches form only from the calls that arrive while a batch is on the wire, and
// nothing ever waits for a timer. Each call is still its own script call. A call waits no
// longer than its context allows; a call whose context ends before its batch is sent is never
// sent; a failed batch fails only the calls it carried.
//
// It is built on go-redis's pipelines rather than its AutoPipeliner, whose batching holds
// stragglers on timers.
type combiner struct {
	node      *redis.Client
	maxDirect int // calls on the wire on their own before calls queue
	maxBatch  int // calls per pipeline
	maxQueue  int // calls waiting; past it a call fails at once, as a Redis error does
	calls     sync.Pool

	mu       sync.Mutex
	direct   int     // calls on the wire on their own
	flushing bool    // the flusher has the queue (a batch is on the wire or about to be)
	closed   bool    // no calls from now on
	queue    []*call // in arrival order
	batch    []*call // the flusher's buffer

	wake chan struct{} // hands the queue to the flusher
	quit chan struct{}
	done chan struct{} // closed when the flusher has stopped
}

// call is one queued script call. Its command is built by its caller, so nothing of the
// caller's memory (keys, arguments) is read after the caller may have given up.
type call struct {
	ctx    context.Context
	script *redis.Script
	cmd    *redis.Cmd
	state  atomic.Int32  // callQueued, callTaken or callAbandoned
	ready  chan struct{} // gets a value once cmd holds the reply
}

const (
	callQueued int32 = iota
	callTaken
	callAbandoned
)

func newCombiner(node *redis.Client, maxDirect, maxBatch, maxQueue int) *combiner {
	c := &combiner{node: node, maxDirect: maxDirect, maxBatch: maxBatch, maxQueue: maxQueue,
		wake: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
	c.calls.New = func() any { return &call{ready: make(chan struct{}, 1)} }
	go c.flusher()
	return c
}

// run runs script with keys and args on the node: at once while few calls are on the wire,
// else in the next batch.
func (c *combiner) run(ctx context.Context, script *redis.Script, keys []string, args ...any) *redis.Cmd {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return failedCmd(ctx, errCombinerClosed)
	}
	if c.direct < c.maxDirect && len(c.queue) == 0 {
		c.direct++
		c.mu.Unlock()
		cmd := script.Run(ctx, c.node, keys, args...)
		c.mu.Lock()
		c.direct--
		c.mu.Unlock()
		return cmd
	}
	if len(c.queue) >= c.maxQueue {
		c.mu.Unlock()
		return failedCmd(ctx, fmt.Errorf("limits: %d calls already wait for one Redis node", c.maxQueue))
	}
	cl := c.calls.Get().(*call)
	cl.ctx, cl.script, cl.cmd = ctx, script, evalSha(ctx, script, keys, args)
	cl.state.Store(callQueued)
	c.queue = append(c.queue, cl)
	wake := !c.flushing
	c.flushing = true
	c.mu.Unlock()
	if wake {
		// Never blocks: a wake is sent only when flushing turns true, and the flusher turns
		// it false only once it has taken the last wake and is about to wait for the next.
		c.wake <- struct{}{}
	}

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

// flusher sends the queue, a batch at a time, each as soon as the previous one is answered,
// until it is empty. Once closed, it sends what is still queued and stops.
func (c *combiner) flusher() {
	defer close(c.done)
	for {
		select {
		case <-c.wake:
		case <-c.quit:
			for c.sendNext() {
			}
			return
		}
		for c.sendNext() {
		}
	}
}

// sendNext sends up to maxBatch queued calls as one pipeline; false once the queue is empty.
func (c *combiner) sendNext() bool {
	c.mu.Lock()
	n := min(len(c.queue), c.maxBatch)
	if n == 0 {
		c.flushing = false
		c.mu.Unlock()
		return false
	}
	batch := c.batch[:0]
	for _, cl := range c.queue[:n] {
		// A call whose deadline has passed is not sent even if its caller has not run yet
		// to say so: its request is answered with an error, so it must not count.
		if cl.ctx.Err() == nil && cl.state.CompareAndSwap(callQueued, callTaken) {
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
// any one request of it.
func (c *combiner) send(batch []*call) {
	ctx := context.Background()
	var latest time.Time
	bounded := true
	for _, cl := range batch {
		deadline, ok := cl.ctx.Deadline()
		bounded = bounded && ok
		if deadline.After(latest) {
			latest = deadline
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
		if err := cl.cmd.Err(); err == nil || !redis.HasErrorPrefix(err, "NOSCRIPT") || cl.ctx.Err() != nil {
			continue // answered, or its caller has given up (the script never ran for it)
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

// errCombinerClosed fails the calls made after close.
var errCombinerClosed = errors.New("limits: Redis store closed")

// close refuses calls from now on and returns once the calls already queued are sent and
// answered. Calling it again does nothing.
func (c *combiner) close() {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	c.mu.Unlock()
	close(c.quit)
	<-c.done
}

func failedCmd(ctx context.Context, err error) *redis.Cmd {
	cmd := redis.NewCmd(ctx)
	cmd.SetErr(err)
	return cmd
}
