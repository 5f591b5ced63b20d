package limits

import (
	"errors"
	"slices"
	"sync"
	"time"
)

// A circuit breaker per Redis node (a Cluster master; the one master of a standalone or
// Sentinel client). One breaker for a whole Cluster turned the death of one master into an
// outage for every tenant: a few timeouts on the dead master opened it for the healthy ones
// too. Per node, an open breaker refuses only the calls bound for its node; a call that spans
// a healthy and a failing node is refused as a whole (a decision is all-or-nothing).

// BreakerEvent is what happened to a node's breaker (GuardOptions.OnBreaker).
type BreakerEvent uint8

const (
	// NodeSeen: the first call bound for the node; its breaker starts closed.
	NodeSeen BreakerEvent = iota
	// BreakerOpened: the node failed FailureThreshold calls in a row (or its half-open trial).
	BreakerOpened
	// BreakerClosed: a call to the node succeeded again.
	BreakerClosed
	// NodeGone: the node left the layout (a failover or a resharding moved its slots to
	// another master); its breaker is dropped.
	NodeGone
)

// NodeError is the failure of one node in a call that went to several: it names the node, so
// that only that node's breaker counts it.
type NodeError struct {
	Node string // host:port
	Err  error
}

func (e *NodeError) Error() string { return e.Node + ": " + e.Err.Error() }
func (e *NodeError) Unwrap() error { return e.Err }

// nodeErrors calls f for each NodeError in err's tree.
func nodeErrors(err error, f func(*NodeError)) {
	switch e := err.(type) {
	case nil:
		return
	case *NodeError:
		f(e)
		return
	case interface{ Unwrap() []error }:
		for _, x := range e.Unwrap() {
			nodeErrors(x, f)
		}
		return
	}
	nodeErrors(errors.Unwrap(err), f)
}

type breaker struct {
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

// outcome is what one call says about one node.
type outcome uint8

const (
	neutral outcome = iota // nothing: the caller went away, or a reply about one key's data
	success
	failure
)

// breakers holds the breaker of every node in use. One mutex guards them all: a call bound
// for several nodes is admitted by all of them at once or by none.
type breakers struct {
	threshold int
	cooldown  time.Duration
	on        func(node string, e BreakerEvent)

	mu sync.Mutex
	m  map[string]*breaker
}

// The events are delivered under the lock, in the order they happen, so that a gauge set from
// them never ends on a stale value; on must therefore not call back into the breakers.

// admit decides whether a call bound for nodes may go out: every node's breaker must be
// closed, or half-open with its one trial free (the call then is that trial). The error of a
// refusal is a *NodeError wrapping ErrBreakerOpen that names the first refusing node. seen is
// true when a node had no breaker yet: the layout may have changed.
func (b *breakers) admit(nodes []string) (seen bool, err error) {
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, n := range nodes {
		br := b.m[n]
		if br == nil {
			continue // a new node starts closed
		}
		switch {
		case br.state == open && now.Before(br.openUntil), br.state == halfOpen && br.trial:
			return false, &NodeError{Node: n, Err: ErrBreakerOpen}
		}
	}
	// Every node lets the call through: take the trials of the nodes whose cooldown is over.
	for _, n := range nodes {
		br := b.m[n]
		if br == nil {
			if b.m == nil {
				b.m = map[string]*breaker{}
			}
			b.m[n] = &breaker{}
			b.notify(n, NodeSeen)
			seen = true
			continue
		}
		if br.state == open {
			br.state = halfOpen
		}
		if br.state == halfOpen {
			br.trial = true
		}
	}
	return seen, nil
}

// verdict is what one call says about one node.
type verdict struct {
	node string
	o    outcome
}

// record updates the breakers with what a call admitted by admit says about its nodes. A node
// without a breaker (dropped meanwhile by forget) is not brought back.
func (b *breakers) record(vs []verdict) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, v := range vs {
		n := v.node
		br := b.m[n]
		if br == nil {
			continue
		}
		switch v.o {
		case success:
			br.failures = 0
			if br.state != closed {
				br.state, br.trial = closed, false
				b.notify(n, BreakerClosed)
			}
		case neutral:
			if br.state == halfOpen {
				br.trial = false // let another call try
			}
		case failure:
			br.failures++
			if br.state == halfOpen || (br.state == closed && br.failures >= b.threshold) {
				if br.state == closed {
					b.notify(n, BreakerOpened)
				}
				br.state, br.trial = open, false
				br.openUntil = time.Now().Add(b.cooldown)
			}
		}
	}
}

// forget drops the breakers of the nodes not in current.
func (b *breakers) forget(current []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for n := range b.m {
		if !slices.Contains(current, n) {
			delete(b.m, n)
			b.notify(n, NodeGone)
		}
	}
}

// openNodes returns the nodes whose breaker is open or half-open (not yet recovered), sorted.
func (b *breakers) openNodes() []string {
	var out []string
	b.mu.Lock()
	for n, br := range b.m {
		if br.state != closed {
			out = append(out, n)
		}
	}
	b.mu.Unlock()
	slices.Sort(out)
	return out
}

// count returns how many nodes have a breaker.
func (b *breakers) count() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.m)
}

func (b *breakers) notify(node string, e BreakerEvent) {
	if b.on != nil {
		b.on(node, e)
	}
}
