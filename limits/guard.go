package limits

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrBreakerOpen is returned by a Guard while its circuit breaker is open.
var ErrBreakerOpen = errors.New("limits: circuit breaker open")

// GuardOptions configures NewGuard. Zero values take the defaults.
type GuardOptions struct {
	Timeout          time.Duration   // bound of each call; default 100ms
	FailureThreshold int             // consecutive failures that open the breaker; default 5
	Cooldown         time.Duration   // how long the breaker stays open before a trial call; default 1s
	OnStateChange    func(open bool) // called (outside locks) when the breaker opens or closes
}

// Guard wraps a Store: every call is bounded by Timeout, and a circuit breaker
// fails fast with ErrBreakerOpen after FailureThreshold consecutive failures of
// the node (Classify: errors and timeouts that are not a reply about one key).
// After Cooldown one trial call goes through (half-open); its success closes
// the breaker, its failure opens it for another Cooldown. So the Guard
// recovers by itself when Redis returns.
//
// The bound does not rely on the store honouring ctx (go-redis ignores
// context deadlines unless Options.ContextTimeoutEnabled is set): the call
// runs in a goroutine into a private Decision, and Guard stops waiting at the
// deadline. The abandoned call finishes in the background within the
// client's own read/write timeouts. A store that ends its calls by their
// deadline itself (DeadlineBound: the Redis store on a client with
// ContextTimeoutEnabled, as the gateway builds it) runs on the caller's
// goroutine instead: no goroutine and no hand-off per call.
type Guard struct {
	s      Store
	o      GuardOptions
	inline bool      // s is DeadlineBound
	pool   sync.Pool // *guardCall

	mu        sync.Mutex
	state     breakerState
	failures  int
	openUntil time.Time
	trial     bool // a half-open trial call is in flight
}

type breakerState uint8

const (
	closed breakerState = iota
	open
	halfOpen
)

// NewGuard wraps s.
func NewGuard(s Store, o GuardOptions) *Guard {
	if o.Timeout <= 0 {
		o.Timeout = 100 * time.Millisecond
	}
	if o.FailureThreshold <= 0 {
		o.FailureThreshold = 5
	}
	if o.Cooldown <= 0 {
		o.Cooldown = time.Second
	}
	g := &Guard{s: s, o: o}
	if b, ok := s.(DeadlineBound); ok && b.BoundByDeadline() {
		g.inline = true
	}
	g.pool.New = func() any { return &guardCall{done: make(chan struct{}, 1)} }
	return g
}

// Open reports whether the breaker is open (or half-open: not yet recovered).
func (g *Guard) Open() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.state != closed
}

// guardCall is one bounded call. It owns copies of its inputs and outputs,
// so an abandoned call never touches the caller's memory; it is pooled again
// only when the inner call has finished.
type guardCall struct {
	hits []Hit
	d    Decision
	u    Usage
	err  error
	done chan struct{}
}

// DeadlineBound is a Store whose calls end by their context's deadline on their own.
type DeadlineBound interface {
	BoundByDeadline() bool
}

// Take implements Store.
func (g *Guard) Take(ctx context.Context, hits []Hit, d *Decision) error {
	if err := g.admit(); err != nil {
		return err
	}
	c := g.pool.Get().(*guardCall)
	c.hits = append(c.hits[:0], hits...)
	cctx, cancel := context.WithTimeout(ctx, g.o.Timeout)
	var err error
	finished := true
	if g.inline {
		err = g.timedOut(ctx, cctx, g.s.Take(cctx, c.hits, &c.d))
	} else {
		go func() {
			c.err = g.s.Take(cctx, c.hits, &c.d)
			c.done <- struct{}{}
		}()
		err, finished = g.wait(ctx, cctx, c)
	}
	cancel()
	if finished {
		if err == nil {
			d.Allowed = c.d.Allowed
			d.Results = append(d.Results[:0], c.d.Results...)
		}
		clear(c.hits)
		c.err = nil
		g.pool.Put(c)
	}
	return g.record(ctx, err)
}

// Usage implements Store.
func (g *Guard) Usage(ctx context.Context, r *Rule, id string) (Usage, error) {
	if err := g.admit(); err != nil {
		return Usage{}, err
	}
	c := g.pool.Get().(*guardCall)
	cctx, cancel := context.WithTimeout(ctx, g.o.Timeout)
	go func() {
		c.u, c.err = g.s.Usage(cctx, r, id)
		c.done <- struct{}{}
	}()
	err, finished := g.wait(ctx, cctx, c)
	cancel()
	var u Usage
	if finished {
		u = c.u
		c.u, c.err = Usage{}, nil
		g.pool.Put(c)
	}
	return u, g.record(ctx, err)
}

// wait returns the call's error once it finished, or a timeout/cancellation
// error when the deadline passes first (finished=false: the goroutine still
// owns c).
func (g *Guard) wait(ctx, cctx context.Context, c *guardCall) (err error, finished bool) {
	select {
	case <-c.done:
		return c.err, true
	case <-cctx.Done():
		if ctx.Err() != nil {
			return fmt.Errorf("limits: guard: %w", ctx.Err()), false
		}
		return fmt.Errorf("limits: guard: store call exceeded %v: %w", g.o.Timeout, context.DeadlineExceeded), false
	}
}

// timedOut is the error of an inline call: past the deadline, whatever the store's error
// says (an i/o timeout, say), the same as wait's.
func (g *Guard) timedOut(ctx, cctx context.Context, err error) error {
	if err == nil {
		return err
	}
	// The connection's deadline (go-redis sets it from cctx's) can fire a moment before
	// cctx's own timer does: the clock decides.
	if dl, _ := cctx.Deadline(); cctx.Err() == nil && time.Now().Before(dl) {
		return err
	}
	if ctx.Err() != nil {
		return fmt.Errorf("limits: guard: %w", ctx.Err())
	}
	return fmt.Errorf("limits: guard: store call exceeded %v: %w", g.o.Timeout, context.DeadlineExceeded)
}

// admit decides whether a call may go to the store.
func (g *Guard) admit() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch g.state {
	case closed:
		return nil
	case open:
		if time.Now().Before(g.openUntil) {
			return ErrBreakerOpen
		}
		g.state = halfOpen
		g.trial = true
		return nil
	default: // half-open: only the one trial call
		if g.trial {
			return ErrBreakerOpen
		}
		g.trial = true
		return nil
	}
}

// record updates the breaker with a call's outcome and returns err.
// Cancellation by the caller's own ctx says nothing about the store and is
// not counted as a failure; nor is a reply about one key's data (Classify):
// the node answered, and the other tenants' keys are fine. Neither moves the
// breaker either way.
func (g *Guard) record(ctx context.Context, err error) error {
	var notify, openNow bool
	g.mu.Lock()
	switch {
	case err == nil:
		g.failures = 0
		if g.state != closed {
			g.state, g.trial = closed, false
			notify, openNow = true, false
		}
	case ctx.Err() != nil || !Classify(err).MovesBreaker():
		if g.state == halfOpen {
			g.trial = false // let another caller try
		}
	default:
		g.failures++
		if g.state == halfOpen || (g.state == closed && g.failures >= g.o.FailureThreshold) {
			notify, openNow = g.state == closed, true
			g.state, g.trial = open, false
			g.openUntil = time.Now().Add(g.o.Cooldown)
		}
	}
	g.mu.Unlock()
	if notify && g.o.OnStateChange != nil {
		g.o.OnStateChange(openNow)
	}
	return err
}
