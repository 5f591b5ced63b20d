package limits

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// On Redis Cluster the keys of one decision can live on different nodes.
// takeCluster groups the keys by the node that serves them and sends one
// script call per node (the node variant of takeLua, which may touch several
// slots of its node) in a single ClusterClient pipeline: go-redis maps
// pipelined commands by node and runs each node's batch in its own goroutine
// (ClusterClient.processPipeline), so a decision costs one script call and one
// round trip per node touched, in parallel.
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
// from go-redis's cached cluster state, and sorts the keys so each node's are contiguous.
func (r *Redis) byNode(ctx context.Context, sc *scratch) error {
	var nodesBuf [8]*redis.Client
	nodes := nodesBuf[:0]
	for i, k := range sc.keys {
		c, err := r.cluster.MasterForKey(ctx, k)
		if err != nil {
			return fmt.Errorf("limits: cluster node of %s: %w", k, err)
		}
		n := 0
		for n < len(nodes) && nodes[n] != c {
			n++
		}
		if n == len(nodes) {
			nodes = append(nodes, c)
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
	return nodeArgs(sc.keys[g.lo:g.hi], sc.qkeys[g.lo:g.hi], sc.args[g.lo:g.hi])
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

	if r.waitReplicas > 0 {
		if err := r.takeClusterWaited(ctx, sc, groups); err != nil {
			return err
		}
		return r.settleCluster(ctx, sc, d, groups)
	}
	if r.coalescing() {
		r.takeGroupsCoalesced(ctx, sc, groups)
		return r.settleCluster(ctx, sc, d, groups)
	}
	pipe := r.cluster.Pipeline()
	for _, g := range groups {
		argv := sc.nodeTakeArgs(g)
		sc.cmds = append(sc.cmds, pipe.EvalSha(ctx, nodeTakeScript.Hash(), sc.keys[g.lo:g.lo+1], argv...))
	}
	_, _ = pipe.Exec(ctx) // errors are inspected per command
	// A node that has not seen the script yet answers NOSCRIPT without running
	// anything, so re-sending those groups with EVAL is safe.
	var retry redis.Pipeliner
	for gi, g := range groups {
		if redis.HasErrorPrefix(sc.cmds[gi].Err(), "NOSCRIPT") {
			if retry == nil {
				retry = r.cluster.Pipeline()
			}
			argv := sc.nodeTakeArgs(g)
			sc.cmds[gi] = retry.Eval(ctx, nodeTakeLua, sc.keys[g.lo:g.lo+1], argv...)
		}
	}
	if retry != nil {
		_, _ = retry.Exec(ctx)
	}
	return r.settleCluster(ctx, sc, d, groups)
}

// takeClusterWaited is takeCluster's first step with WithWaitReplicas: each node's call is
// followed by WAIT on that node's connection.
func (r *Redis) takeClusterWaited(ctx context.Context, sc *scratch, groups []group) error {
	nodes := make([]*redis.Client, len(groups))
	argv := make([][]any, len(groups))
	first := make([][]string, len(groups))
	for gi, g := range groups {
		node, err := r.cluster.MasterForKey(ctx, sc.keys[g.lo])
		if err != nil {
			return fmt.Errorf("limits: cluster node of %s: %w", sc.keys[g.lo], err)
		}
		nodes[gi], argv[gi], first[gi] = node, sc.nodeTakeArgs(g), sc.keys[g.lo:g.lo+1]
	}
	sc.cmds = append(sc.cmds, r.clusterWaited(ctx, nodes, argv, first)...)
	return nil
}

// settleCluster reads the nodes' replies and, unless every node admitted, gives back what the
// admitting nodes took.
func (r *Redis) settleCluster(ctx context.Context, sc *scratch, d *Decision, groups []group) error {
	allOK := true
	var firstErr error
	var consumedBuf [8]bool
	consumed := consumedBuf[:0]
	for gi, g := range groups {
		ok := false
		reply, err := sc.cmds[gi].Text()
		if err == nil {
			ok, err = parseTake(reply, sc.idx[g.lo:g.hi], sc.qkeys[g.lo:g.hi], sc.ws[g.lo:g.hi], d.Results)
		}
		if err != nil && firstErr == nil {
			firstErr = err
		}
		consumed = append(consumed, err == nil && ok)
		allOK = allOK && err == nil && ok
	}
	if allOK {
		d.Allowed = true
		return nil
	}

	// Second step: give back what the admitting nodes took: every limit of theirs that had
	// room (a shadow limit without room was not charged, a tokens limit only checked).
	gb := r.cluster.Pipeline()
	n := 0
	for gi, g := range groups {
		if !consumed[gi] {
			continue
		}
		var keys []string
		sc.gargs = sc.gargs[:0]
		for k := g.lo; k < g.hi; k++ {
			res := &d.Results[sc.idx[k]]
			if !res.Allowed || res.Rule.Unit == Tokens {
				continue
			}
			cr, err := r.rules.get(res.Rule)
			if err != nil {
				continue // it was compiled for the take: cannot happen
			}
			keys = append(keys, sc.keys[k])
			sc.gargs = append(sc.gargs, cr.specFor(res.base), sc.ws[k])
			// Report the current state: the unit is returned.
			res.Remaining = min(res.Remaining+1, res.Limit)
		}
		if len(keys) == 0 {
			continue
		}
		// Eval, not EvalSha: this path is rare and must not need a NOSCRIPT retry. The first
		// key routes the call to the node; all keys are the node's.
		gb.Eval(ctx, nodePrelude+giveBackLua, keys[:1], nodeArgs(keys, nil, sc.gargs)...)
		n++
	}
	if n > 0 {
		if _, err := gb.Exec(ctx); err != nil {
			firstErr = errors.Join(firstErr, fmt.Errorf("limits: give back: %w", err))
		}
	}
	if firstErr != nil {
		return fmt.Errorf("limits: take (cluster): %w", firstErr)
	}
	return nil
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
