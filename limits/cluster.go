package limits

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// On Redis Cluster the keys of one decision can live on different nodes.
// takeCluster groups the keys by the master that serves them and sends one
// script call per node (the node variant of takeLua, which may touch several
// slots of its node), the nodes in parallel, each on its own node's client:
// a decision costs one script call and one round trip per node touched. Not
// through go-redis's cluster pipeline: that one retries the commands of a
// failed node after a backoff, and when the deadline ends the backoff it marks
// every command of the pipeline failed, the healthy nodes' answered ones too
// (their units then were never given back, and their nodes took the blame).
//
// All-or-nothing across nodes needs a second step: each node decides and
// consumes atomically on its own (its enforced limits all-or-nothing, its
// shadow limits with room charged along); if any node denied (or failed), the
// nodes that consumed are given their units back (giveBackLua). Between the two steps
// a concurrent request can see those units as taken and be denied although
// the first request is finally rejected: a transient false deny. It can never
// admit more than the limit, because a unit is only returned after it was
// taken. If the give-back itself fails, the units stay consumed
// (under-admission, never overshoot).

// sameSlot computes the slot of every key and reports whether they all match.
func sameSlot(sc *scratch) bool {
	same := true
	for _, k := range sc.keys {
		s := keySlot(k)
		sc.slots = append(sc.slots, s)
		if s != sc.slots[0] {
			same = false
		}
	}
	return same
}

// byNode replaces each key's slot in sc.slots by the index of the master that serves it,
// from go-redis's cached cluster state, sorts the keys so each node's are contiguous, and
// keeps the nodes in sc.clients and their names in sc.nodes (group i is node i).
func (r *Redis) byNode(ctx context.Context, sc *scratch) error {
	for i, k := range sc.keys {
		c, err := r.cluster.MasterForKey(ctx, k)
		if err != nil {
			return fmt.Errorf("limits: cluster node of %s: %w", k, err)
		}
		n := 0
		for n < len(sc.clients) && sc.clients[n] != c {
			n++
		}
		if n == len(sc.clients) {
			sc.clients = append(sc.clients, c)
			sc.nodes = append(sc.nodes, c.Options().Addr)
		}
		sc.slots[i] = uint16(n)
	}
	// Insertion sort: a decision has a handful of hits, and each group then is a
	// contiguous sub-slice that needs no new buffers.
	for i := 1; i < len(sc.keys); i++ {
		for j := i; j > 0 && sc.slots[j] < sc.slots[j-1]; j-- {
			sc.slots[j], sc.slots[j-1] = sc.slots[j-1], sc.slots[j]
			sc.keys[j], sc.keys[j-1] = sc.keys[j-1], sc.keys[j]
			sc.qkeys[j], sc.qkeys[j-1] = sc.qkeys[j-1], sc.qkeys[j]
			sc.args[j], sc.args[j-1] = sc.args[j-1], sc.args[j]
			sc.idx[j], sc.idx[j-1] = sc.idx[j-1], sc.idx[j]
			sc.units[j], sc.units[j-1] = sc.units[j-1], sc.units[j]
		}
	}
	return nil
}

// nodeArgs is the node script's ARGV: the key count, the keys (then the quota keys a
// decision sends, those of qkeys not ""), then the per-key arguments.
func nodeArgs(keys, qkeys []string, args []any) []any {
	out := make([]any, 1, 1+len(keys)+len(qkeys)+len(args))
	for _, k := range keys {
		out = append(out, k)
	}
	for _, k := range qkeys {
		if k != "" {
			out = append(out, k)
		}
	}
	out[0] = len(out) - 1
	return append(out, args...)
}

// nodeTakeArgs is the node script's ARGV for group g of a decision.
func (sc *scratch) nodeTakeArgs(g group) []any {
	args := nodeArgs(sc.keys[g.lo:g.hi], sc.qkeys[g.lo:g.hi], sc.args[g.lo:g.hi])
	if sc.hold != "" {
		args = append(args, "@"+sc.hold)
	}
	return args
}

// group is the keys sc.keys[lo:hi] of one node.
type group struct{ lo, hi int }

func (r *Redis) takeCluster(ctx context.Context, sc *scratch, d *Decision) error {
	if err := r.byNode(ctx, sc); err != nil {
		return err
	}
	var groupsBuf [8]group
	groups := groupsBuf[:0]
	for i := 0; i < len(sc.keys); {
		j := i + 1
		for j < len(sc.keys) && sc.slots[j] == sc.slots[i] {
			j++
		}
		groups = append(groups, group{i, j})
		i = j
	}

	cmds := make([]*redis.Cmd, len(groups))
	eachNode(len(groups), func(gi int) { cmds[gi] = r.takeOnNode(ctx, sc, groups[gi], gi) })
	sc.cmds = append(sc.cmds, cmds...)
	return r.settleCluster(ctx, sc, d, groups)
}

// takeOnNode runs the node script for the keys of group g, on its node gi: followed by WAIT
// on the same connection (WithWaitReplicas: WAIT has no key), through the node's combiner
// (coalescing), or as a call of its own. A node that lost the script answers NOSCRIPT
// without running anything, and the call is sent again with the script's source.
func (r *Redis) takeOnNode(ctx context.Context, sc *scratch, g group, gi int) *redis.Cmd {
	node, first := sc.clients[gi], sc.keys[g.lo:g.lo+1]
	argv := sc.nodeTakeArgs(g)
	switch {
	case r.waitReplicas > 0:
		return r.runWaited(ctx, node, nodeTakeScript, nodeTakeLua, first, argv...)
	case r.nodeCombs != nil:
		c := r.nodeCombs.of(node)
		if c == nil {
			return failedCmd(ctx, errCombinerClosed)
		}
		return c.run(ctx, nodeTakeScript, first, argv...)
	}
	return nodeTakeScript.Run(ctx, node, first, argv...)
}

// eachNode runs f(0), ..., f(n-1), in parallel when n > 1: one per node of a decision.
func eachNode(n int, f func(i int)) {
	if n == 1 {
		f(0)
		return
	}
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			f(i)
		}()
	}
	wg.Wait()
}

// settleCluster reads the nodes' replies and, unless every node admitted, gives back what the
// admitting nodes took. The error names every node that failed (a *NodeError each), so that
// only their breakers count it.
func (r *Redis) settleCluster(ctx context.Context, sc *scratch, d *Decision, groups []group) error {
	allOK := true
	var errs []error
	var consumedBuf [8]bool
	consumed := consumedBuf[:0]
	for gi, g := range groups {
		ok := false
		reply, err := sc.cmds[gi].Text()
		if err == nil {
			ok, err = parseTake(reply, sc.idx[g.lo:g.hi], sc.qkeys[g.lo:g.hi], sc.ws[g.lo:g.hi], d.Results)
		}
		if err != nil {
			errs = append(errs, &NodeError{Node: sc.nodes[gi], Err: err})
		}
		consumed = append(consumed, err == nil && ok)
		allOK = allOK && err == nil && ok
	}
	if allOK {
		d.Allowed = true
		d.Hold = sc.hold
		return nil
	}
	errs = append(errs, sendGiveBacks(ctx, r.giveBacks(sc, d, groups, consumed))...)
	if len(errs) > 0 {
		return fmt.Errorf("limits: take (cluster): %w", errors.Join(errs...))
	}
	return nil
}

// giveBacks is the second step of a refused decision: what each admitting node gives back,
// every limit of theirs that had room (a shadow limit without room was not charged, a tokens
// limit only checked).
func (r *Redis) giveBacks(sc *scratch, d *Decision, groups []group, consumed []bool) []giveBack {
	var gbs []giveBack
	for gi, g := range groups {
		if !consumed[gi] {
			continue
		}
		var keys []string
		sc.gargs = sc.gargs[:0]
		for k := g.lo; k < g.hi; k++ {
			res := &d.Results[sc.idx[k]]
			if !res.Allowed || res.Rule.Unit == Tokens && !holds(res.Rule) || sc.units[k] == 0 {
				continue
			}
			cr, err := r.rules.get(res.Rule)
			if err != nil {
				continue // it was compiled for the take: cannot happen
			}
			keys = append(keys, sc.keys[k])
			// Report the current state: the unit (a hold: its reserve) is returned.
			if holds(res.Rule) { // its hold or slot (see hold.go)
				sc.gargs = append(sc.gargs, cr.spec, "@"+sc.hold)
				res.Remaining = min(res.Remaining+max(res.Rule.Reserve, 1), res.Limit)
			} else {
				h := Hit{Rule: res.Rule, Units: sc.units[k]}
				sc.gargs = append(sc.gargs, withUnits(cr.specFor(res.base), &h), sc.ws[k])
				res.Remaining = min(res.Remaining+sc.units[k], res.Limit)
			}
		}
		if len(keys) > 0 {
			gbs = append(gbs, giveBack{node: sc.clients[gi], name: sc.nodes[gi], keys: keys, argv: nodeArgs(keys, nil, sc.gargs)})
		}
	}
	return gbs
}

// sendGiveBacks sends the give-backs and returns their errors, each named after its node
// unless the decision's deadline cut it short.
func sendGiveBacks(ctx context.Context, gbs []giveBack) []error {
	if len(gbs) > 0 && ctx.Err() != nil {
		// A failing node used up the decision's deadline: the request is answered now, and
		// its units go back in the background, on a bound of their own (nothing was sent, so
		// nothing can be given back twice). Cut short by the deadline, they would stay taken
		// on the healthy nodes.
		go func(gbs []giveBack) {
			bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), giveBackBound)
			defer cancel()
			giveBackAll(bctx, gbs)
		}(gbs)
		return nil
	}
	giveBackAll(ctx, gbs)
	var errs []error
	for _, b := range gbs {
		switch {
		case b.err == nil || b.err == redis.Nil:
		case ctx.Err() != nil:
			// Cut short by the deadline that a failing node used up: named after no node,
			// as this one answered the decision.
			errs = append(errs, fmt.Errorf("limits: give back: %w", b.err))
		default:
			errs = append(errs, &NodeError{Node: b.name, Err: fmt.Errorf("limits: give back: %w", b.err)})
		}
	}
	return errs
}

// giveBackBound bounds a give-back sent after its decision's deadline.
const giveBackBound = 5 * time.Second

// giveBack is what one node gives back of a decision refused on another node.
type giveBack struct {
	node *redis.Client
	name string
	keys []string
	argv []any
	err  error
}

// giveBackAll sends the give-backs, the nodes in parallel. Eval, not EvalSha: this path is
// rare and must not need a NOSCRIPT retry.
func giveBackAll(ctx context.Context, gbs []giveBack) {
	eachNode(len(gbs), func(i int) {
		b := &gbs[i]
		b.err = b.node.Eval(ctx, nodePrelude+giveBackLua, b.keys[:1], b.argv...).Err()
	})
}

// keySlot is Redis Cluster's HASH_SLOT: CRC16 (XMODEM) of the hash tag (the
// part between the first '{' and the next '}', if non-empty) or of the key.
func keySlot(key string) uint16 {
	for i := 0; i < len(key); i++ {
		if key[i] == '{' {
			for j := i + 1; j < len(key); j++ {
				if key[j] == '}' {
					if j > i+1 {
						key = key[i+1 : j]
					}
					return crc16(key) & 16383
				}
			}
			break
		}
	}
	return crc16(key) & 16383
}

func crc16(s string) uint16 {
	var crc uint16
	for i := 0; i < len(s); i++ {
		crc ^= uint16(s[i]) << 8
		for b := 0; b < 8; b++ {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}
