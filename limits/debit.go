package limits

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// Tokens limits are debited after the answer: the tokens are spent upstream by then, so a
// debit never denies; it only makes the next Take of that tenant see them.
//
// An answer is billed to the window in which it ends, with a reserve (Settle) or without
// (Debit): its tokens are known then, and a tokens limit's window, once ended, never changes
// (its history and export are final at its end, whatever is still in flight). A hold counts
// against every window in which it is live, the one it was taken in and those it lives into
// (it is a field of the counter beside the window's count, not of the window), so in each
// window used + live holds ≤ limit, and the window an answer will be billed to has kept room
// for it. For example, on a monthly limit of 1,000 with a reserve of 100, an answer admitted on
// the 31st at 23:59:50 holds 100 in both months; when it ends at 00:00:20 having cost 70, the
// new month is charged 70 and the old one keeps what it had.

// chargeLua is how the scripts count an answer's tokens (debitLua, settleLua):
// charge(key, spec, n, sec, now_us) adds n to the window current at sec, first moving the
// ended window's count aside when a new one begins (history_redis.go), and never shortens the
// counter's life (keep_until): it may hold the holds of answers in flight, which outlive a
// window shorter than their ttl (a shadow limit debits the answers it had no room to hold).
const chargeLua = `
local function charge(key, spec, n, sec, now_us)
  -- In the spec's window: the gateway settles an answer with the rule in force when it ends
  -- (a change of window since its admission re-keys the counter here, as a take would).
  local _, _, win = parse(spec)
  local ws, we = bounds(win, sec)
  local _, same = count(key, ws, win)
  if same then
    redis.call('HINCRBY', key, 'n', n)
    return
  end
  local keep = keep_of(spec)
  local carry = keep_past(key, win, keep, ws)
  redis.call('HSET', key, 's', ws, 'n', carry + n)
  keep_until(key, kept_until(we, win, keep) * 1000, now_us)
end
`

// Debit implements Store: one script call (on a Cluster, one per key, pipelined).
func (r *Redis) Debit(ctx context.Context, hits []Hit, n int64) error {
	if n <= 0 {
		return nil
	}
	var keys []string
	var args []any
	for i := range hits {
		cr, err := r.rules.get(hits[i].Rule)
		if err != nil {
			return fmt.Errorf("limits: debit: %w", err)
		}
		if !cr.enabled || hits[i].Rule.Unit != Tokens {
			continue
		}
		keys = append(keys, cr.keyPre+hits[i].ID+"}")
		args = append(args, cr.spec, strconv.FormatInt(n, 10))
	}
	if len(keys) == 0 {
		return nil
	}
	if r.cluster != nil && len(keys) > 1 {
		// The keys may live on different nodes: one call per key, in one pipeline.
		pipe := r.cluster.Pipeline()
		cmds := make([]*redis.Cmd, len(keys))
		for i, k := range keys {
			cmds[i] = pipe.EvalSha(ctx, debitScript.Hash(), []string{k}, args[2*i:2*i+2]...)
		}
		_, _ = pipe.Exec(ctx) // errors are inspected per command
		var errs []error
		for i, c := range cmds {
			err := c.Err()
			if redis.HasErrorPrefix(err, "NOSCRIPT") { // a restarted node: nothing ran there
				err = r.cluster.Eval(ctx, debitLua, []string{keys[i]}, args[2*i:2*i+2]...).Err()
			}
			if err != nil && err != redis.Nil {
				errs = append(errs, &NodeError{Node: r.nodeOf(ctx, keys[i]), Err: err})
			}
		}
		if len(errs) > 0 {
			return withKey(fmt.Errorf("limits: debit: %w", errors.Join(errs...)), keys)
		}
		return nil
	}
	if err := debitScript.Run(ctx, r.client, keys, args...).Err(); err != nil && err != redis.Nil {
		return withKey(fmt.Errorf("limits: debit: %w", err), keys)
	}
	return nil
}

// Debit implements Store.
func (m *Memory) Debit(ctx context.Context, hits []Hit, n int64) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("limits: debit: %w", err)
	}
	if n <= 0 {
		return nil
	}
	sec := m.now().Unix()
	return m.eachLocked(ctx, "debit", hits, func(r *Rule, cr *compiled) bool { return cr.enabled && r.Unit == Tokens },
		func(h *memHit) { m.charge(h, n, sec) })
}

// charge adds n tokens to h's counter in the window current at Unix second sec, the one an
// answer ends in, first keeping the ended window for history (roll, which never shortens the
// entry's life); Debit and Settle alike (the caller holds the shard lock).
func (m *Memory) charge(h *memHit, n, sec int64) {
	e := m.entry(h)
	ws, we := h.cr.snap.Window.boundsUnix(sec)
	e.roll(&h.cr.snap, ws, we) // in the rule's window, as chargeLua
	e.n += n
}

// Debit implements Store. Like Take, it goes through the breakers of the nodes its tokens
// limits live on: a debit against an open breaker is dropped at once (the caller logs it)
// rather than waiting on a dead Redis.
func (g *Guard) Debit(ctx context.Context, hits []Hit, n int64) error {
	cctx, cancel := g.offPath(ctx)
	defer cancel()
	var tokens []Hit
	for _, h := range hits {
		if h.Rule != nil && h.Rule.Unit == Tokens {
			tokens = append(tokens, h)
		}
	}
	nodes := g.nodesOf(cctx, tokens, nil)
	if err := g.admit(nodes); err != nil {
		return err
	}
	return g.record(ctx, nodes, g.s.Debit(cctx, hits, n))
}

// offPath bounds a write made after the answer (a debit, a refund) by the caller's deadline
// rather than by redis.timeout: that is the request path's budget, and a write cut short by
// it on a loaded Redis is lost (tokens never charged, units never given back) while nobody
// waits for it. Without a deadline from the caller, redis.timeout still bounds it.
func (g *Guard) offPath(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, g.o.Timeout)
}
