package limits

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/redis/go-redis/v9"
)

// A refund gives back the units an admitted decision took, when the request turned out not
// to deserve counting (the gateway refunds a request whose credentials the upstream
// refused). It is one store call, made after the answer, off the request path. Giving back
// never admits more than a limit: a fixed window's count is lowered only in the window the
// unit was counted in, never below zero, and that window may have ended: the unit then goes
// back into the window's count kept for history (history.go), so usage history and exports
// never bill it, and is dropped only once that window is no longer kept (or the limit keeps
// none). A GCRA bucket gets one emission interval back, never past full. Between the take
// and the refund the unit is held, so concurrent requests can be denied for it.

// Taken is one unit a decision took, as Refund gives it back.
type Taken struct {
	Hit
	// WindowStart is the Result's WindowStart (fixed windows).
	WindowStart int64
	// base is the Result's base: a GCRA unit is 1/base of the period (0: the rule's limit).
	base int64
}

// Taken appends to dst the units d took for hits (d's results in the same order): none
// when d did not admit; else one per requests limit whose result admitted (a tokens limit
// is only checked, a disabled one stores nothing), but for hits taking other than one unit
// (Hit.Units, Hit.Check: a front door that never refunds).
func (d *Decision) Taken(hits []Hit, dst []Taken) []Taken {
	if !d.Allowed {
		return dst
	}
	for i := range hits {
		r := hits[i].Rule
		if i >= len(d.Results) || !d.Results[i].Allowed || r == nil || r.Limit <= 0 || r.Unit != Requests || hits[i].units() != 1 {
			continue // a hit taking several units at once, or none, is not refunded
		}
		dst = append(dst, Taken{Hit: hits[i], WindowStart: d.Results[i].WindowStart, base: d.Results[i].base})
	}
	return dst
}

// Refunder gives units back. Every store implements it.
type Refunder interface {
	// Refund gives back the units taken, all of them in one call.
	Refund(ctx context.Context, taken []Taken) error
}

var (
	_ Refunder = (*Memory)(nil)
	_ Refunder = (*Redis)(nil)
	_ Refunder = (*Guard)(nil)
)

// Refund implements Refunder: one script call (giveBackLua, the Cluster's compensation
// script); on a Cluster one call per key, all in one pipeline (one round trip per node).
func (r *Redis) Refund(ctx context.Context, taken []Taken) error {
	var keys []string
	var args []any
	for i := range taken {
		cr, err := r.rules.get(taken[i].Rule)
		if err != nil {
			return fmt.Errorf("limits: refund: %w", err)
		}
		if !cr.enabled || taken[i].Rule.Unit != Requests {
			continue
		}
		keys = append(keys, cr.keyPre+taken[i].ID+"}")
		args = append(args, cr.specFor(taken[i].base), taken[i].WindowStart)
	}
	if len(keys) == 0 {
		return nil
	}
	if r.cluster != nil && len(keys) > 1 {
		if err := r.eachKey(ctx, giveBackScript, keys, args, 2, make([]*redis.Cmd, len(keys))); err != nil {
			return r.followTopology(ctx, fmt.Errorf("limits: refund: %w", err))
		}
		return nil
	}
	if err := giveBackScript.Run(ctx, r.client, keys, args...).Err(); err != nil && err != redis.Nil {
		return r.followTopology(ctx, fmt.Errorf("limits: refund: %w", err))
	}
	return nil
}

// Refund implements Refunder, with Take's rules on its own clock.
func (m *Memory) Refund(ctx context.Context, taken []Taken) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("limits: refund: %w", err)
	}
	now := m.now()
	sec, usec := now.Unix(), int64(now.Nanosecond()/1000)
	nowUS := sec*1e6 + usec
	gnow := float64(sec-jan2017) + float64(usec)/1e6
	for i := range taken {
		t := &taken[i]
		cr, err := m.rules.get(t.Rule)
		if err != nil {
			return fmt.Errorf("limits: refund: %w", err)
		}
		if !cr.enabled || t.Rule.Unit != Requests {
			continue
		}
		key := memKey{cr.keyPre, t.ID}
		sh := &m.shards[m.shardOf(key)]
		sh.mu.Lock()
		e := sh.m[key]
		switch {
		case e == nil:
		case cr.snap.Algorithm == Fixed:
			e.giveBack(&cr.snap, t.WindowStart, sec)
		case e.expires > nowUS:
			// One emission interval back; a bucket that would be fuller than full is full.
			base := t.base
			if base <= 0 {
				base = cr.snap.Limit
			}
			e.tat -= cr.period / float64(base)
			if e.tat <= gnow {
				delete(sh.m, key)
			} else {
				e.expires = nowUS + int64(math.Ceil(e.tat-gnow))*1e6
			}
		}
		sh.mu.Unlock()
	}
	return nil
}

// Refund implements Refunder. Like Debit, it goes through the breakers of the nodes it writes
// to: a refund against an open breaker is dropped at once (the caller logs it; the units stay
// taken, which can only deny, never overshoot) rather than waiting on a dead Redis.
func (g *Guard) Refund(ctx context.Context, taken []Taken) error {
	cctx, cancel := g.offPath(ctx)
	defer cancel()
	hits := make([]Hit, len(taken))
	for i := range taken {
		hits[i] = taken[i].Hit
	}
	nodes := g.nodesOf(cctx, hits, nil)
	if err := g.admit(nodes); err != nil {
		return err
	}
	return g.record(ctx, nodes, g.refund(cctx, taken))
}

func (g *Guard) refund(ctx context.Context, taken []Taken) error {
	r, ok := g.s.(Refunder)
	if !ok {
		return fmt.Errorf("limits: refund: the store %T cannot give units back", g.s)
	}
	return r.Refund(ctx, taken)
}

// eachKey runs script once per key of a Cluster, each with its per arguments from args, all
// in one pipeline: the keys may live on different nodes, and go-redis sends each node its
// commands in one round trip, in parallel. Each key's failure names its node (*NodeError). A node that lost the script (restarted) answers
// NOSCRIPT without running anything, so those keys are sent again with EVAL. Refund, Refresh
// and Debit call it. cmds (len(keys) of them) receives each key's command, whose reply the
// caller may read: the caller's slice, which stays on its stack for a few keys.
func (r *Redis) eachKey(ctx context.Context, script *redis.Script, keys []string, args []any, per int, cmds []*redis.Cmd) error {
	pipe := r.cluster.Pipeline()
	for i, k := range keys {
		cmds[i] = pipe.EvalSha(ctx, script.Hash(), []string{k}, args[per*i:per*i+per]...)
	}
	_, _ = pipe.Exec(ctx) // errors are inspected per command
	var errs []error
	for i, c := range cmds {
		if redis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
			cmds[i] = script.Eval(ctx, r.cluster, []string{keys[i]}, args[per*i:per*i+per]...)
		}
		if err := cmds[i].Err(); err != nil && err != redis.Nil {
			errs = append(errs, &NodeError{Node: r.nodeOf(ctx, keys[i]), Err: err})
		}
	}
	return errors.Join(errs...)
}
