package limits

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// ErrBreakerOpen is returned by a Guard, wrapped in a *NodeError naming the node, while the
// breaker of a node the call is bound for is open.
var ErrBreakerOpen = errors.New("limits: circuit breaker open")

// GuardOptions configures NewGuard. Zero values take the defaults.
type GuardOptions struct {
	Timeout          time.Duration // bound of each call; default 100ms
	FailureThreshold int           // consecutive failures of a node that open its breaker; default 5
	Cooldown         time.Duration // how long a breaker stays open before a trial call; default 1s
	// OnBreaker is told when a node is first called, when its breaker opens or closes, and when
	// the node leaves the layout. It is called in the order of the events, under the Guard's
	// lock: it must not call the Guard.
	OnBreaker func(node string, e BreakerEvent)
}

// Guard wraps a Store: every call is bounded by Timeout, and a circuit breaker per Redis node
// fails fast with ErrBreakerOpen after FailureThreshold consecutive failures of that node
// (Classify: errors and timeouts that are not a reply about one key). After Cooldown one
// trial call goes through (half-open); its success closes the breaker, its failure opens it
// for another Cooldown. So the Guard recovers by itself when the node returns.
//
// The nodes come from the store (NodeRouter: a Cluster master per hash slot, the one master
// otherwise): a call is refused only when a node it is bound for is open, and a failure counts
// against the node that failed (a *NodeError in the error names it; a call bound for one node
// fails that node). A store that names no nodes is one node, "store".
//
// The bound does not rely on the store honouring ctx (go-redis ignores
// context deadlines unless Options.ContextTimeoutEnabled is set): the call
// runs in a goroutine into a private Decision, and Guard stops waiting at the
// deadline. The abandoned call finishes in the background within the
// client's own read/write timeouts. A store that ends its calls by their
// deadline itself (DeadlineBound: the Redis store on a client with
// ContextTimeoutEnabled, as the gateway builds it) runs on the caller's
// goroutine instead: no goroutine and no hand-off per call, and its errors
// still say which node failed when the deadline passed.
type Guard struct {
	s      Store
	o      GuardOptions
	router NodeRouter // nil: the store is one node
	inline bool       // s is DeadlineBound
	pool   sync.Pool  // *guardCall

	b       breakers
	pruning atomic.Bool // a check of the layout is under way
}

// NodeRouter is a Store whose calls go to named nodes (host:port): the Guard keeps a breaker
// per node.
type NodeRouter interface {
	// NodesOf appends to dst, once each, the nodes a call on hits goes to.
	NodesOf(ctx context.Context, hits []Hit, dst []string) []string
	// Nodes returns every node calls can go to now (the masters of the layout).
	Nodes(ctx context.Context) ([]string, error)
	// Refused is told that a call bound for node was refused, its breaker being open.
	Refused(node string)
}

// storeNode names the one node of a store that is no NodeRouter.
const storeNode = "store"

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
	g := &Guard{s: s, o: o, b: breakers{threshold: o.FailureThreshold, cooldown: o.Cooldown, on: o.OnBreaker}}
	if b, ok := s.(DeadlineBound); ok && b.BoundByDeadline() {
		g.inline = true
	}
	g.router, _ = s.(NodeRouter)
	g.pool.New = func() any { return &guardCall{done: make(chan struct{}, 1)} }
	return g
}

// OpenNodes returns the nodes whose breaker is open (or half-open: not yet recovered), sorted.
func (g *Guard) OpenNodes() []string { return g.b.openNodes() }

// guardCall is one bounded call. It owns copies of its inputs and outputs,
// so an abandoned call never touches the caller's memory; it is pooled again
// only when the inner call has finished.
type guardCall struct {
	hits  []Hit
	nodes []string
	d     Decision
	u     Usage
	err   error
	done  chan struct{}
}

// DeadlineBound is a Store whose calls end by their context's deadline on their own.
type DeadlineBound interface {
	BoundByDeadline() bool
}

// Take implements Store.
func (g *Guard) Take(ctx context.Context, hits []Hit, d *Decision) error {
	c := g.pool.Get().(*guardCall)
	cctx, cancel := context.WithTimeout(ctx, g.o.Timeout)
	c.nodes = g.nodesOf(cctx, hits, c.nodes[:0])
	if err := g.admit(c.nodes); err != nil {
		cancel()
		g.pool.Put(c)
		return err
	}
	c.hits = append(c.hits[:0], hits...)
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
		if !finished {
			go g.releaseAbandoned(c)
		}
	}
	cancel()
	err = g.record(ctx, c.nodes, err)
	if finished {
		if err == nil {
			d.Allowed = c.d.Allowed
			d.Hold = c.d.Hold
			d.Results = append(d.Results[:0], c.d.Results...)
		}
		clear(c.hits)
		c.err = nil
		g.pool.Put(c)
	}
	return err
}

// Usage implements Store.
func (g *Guard) Usage(ctx context.Context, r *Rule, id string) (Usage, error) {
	c := g.pool.Get().(*guardCall)
	cctx, cancel := context.WithTimeout(ctx, g.o.Timeout)
	defer cancel()
	c.hits = append(c.hits[:0], Hit{Rule: r, ID: id})
	c.nodes = g.nodesOf(cctx, c.hits, c.nodes[:0])
	clear(c.hits)
	if err := g.admit(c.nodes); err != nil {
		g.pool.Put(c)
		return Usage{}, err
	}
	go func() {
		c.u, c.err = g.s.Usage(cctx, r, id)
		c.done <- struct{}{}
	}()
	err, finished := g.wait(ctx, cctx, c)
	err = g.record(ctx, c.nodes, err)
	var u Usage
	if finished {
		u = c.u
		c.u, c.err = Usage{}, nil
		g.pool.Put(c)
	}
	return u, err
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

// timedOut is the error of an inline call: past the deadline, a timeout whatever the store's
// error says (an i/o timeout, say), as wait's is. The store's error stays wrapped: its
// NodeErrors say which nodes failed.
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
		return fmt.Errorf("limits: guard: %w", errors.Join(ctx.Err(), err))
	}
	return fmt.Errorf("limits: guard: store call exceeded %v: %w", g.o.Timeout, errors.Join(context.DeadlineExceeded, err))
}

// nodesOf appends to dst the nodes a call on hits goes to.
func (g *Guard) nodesOf(ctx context.Context, hits []Hit, dst []string) []string {
	if g.router == nil {
		return append(dst, storeNode)
	}
	return g.router.NodesOf(ctx, hits, dst)
}

// admit decides whether a call bound for nodes may go to the store. A node never called
// before may mean a new layout (a replica promoted in a failover): the breakers of nodes that
// left it are then dropped, in the background.
func (g *Guard) admit(nodes []string) error {
	seen, err := g.b.admit(nodes)
	if ne, ok := err.(*NodeError); ok && g.router != nil {
		g.router.Refused(ne.Node)
	}
	if seen && g.router != nil && g.b.count() > 1 && g.pruning.CompareAndSwap(false, true) {
		go func() {
			defer g.pruning.Store(false)
			ctx, cancel := context.WithTimeout(context.Background(), 10*g.o.Timeout)
			defer cancel()
			if current, err := g.router.Nodes(ctx); err == nil {
				g.b.forget(current)
			}
		}()
	}
	return err
}

// record updates the breakers of nodes with a call's outcome and returns err. Cancellation by
// the caller's own ctx says nothing about the store and is not counted as a failure; nor is a
// reply about one key's data (Classify): the node answered, and the other tenants' keys are
// fine. Neither moves a breaker either way. A failure counts against the nodes its NodeErrors
// name (the other nodes of the call answered); without any, against every node of the call.
func (g *Guard) record(ctx context.Context, nodes []string, err error) error {
	var buf [8]verdict
	vs := buf[:0]
	switch {
	case err == nil:
		for _, n := range nodes {
			vs = append(vs, verdict{n, success})
		}
	case ctx.Err() != nil || !Classify(err).MovesBreaker():
		for _, n := range nodes {
			vs = append(vs, verdict{n, neutral})
		}
	default:
		named := false
		nodeErrors(err, func(e *NodeError) {
			named = true
			o := neutral
			if Classify(e.Err).MovesBreaker() {
				o = failure
			}
			vs = addVerdict(vs, e.Node, o)
		})
		for _, n := range nodes {
			if named {
				vs = addVerdict(vs, n, success) // answered: no NodeError names it
			} else {
				vs = append(vs, verdict{n, failure})
			}
		}
	}
	g.b.record(vs)
	return err
}

// addVerdict adds node's outcome o to vs. A node already there keeps its outcome, unless o is
// a failure: the NodeErrors come first, and a node named by one never counts as answered.
func addVerdict(vs []verdict, node string, o outcome) []verdict {
	for i := range vs {
		if vs[i].node == node {
			if o == failure {
				vs[i].o = failure
			}
			return vs
		}
	}
	return append(vs, verdict{node, o})
}
