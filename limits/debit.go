package limits

import (
	"context"
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
// charge(key, spec, n, sec, now_us, allow) adds n to the window current at sec, first moving
// the ended window's count aside when a new one begins (history_redis.go), and never shortens
// the counter's life (keep_until): it may hold the holds of answers in flight, which outlive a
// window shorter than their ttl (a shadow limit debits the answers it had no room to hold).
// For a spec with marks (thresholds.go), it marks what the charge was the first to reach
// against allow, the allowance the admitting decision applied (cross). It returns those bits
// of Result.Crossed, the window's start, the count after the charge and, when it crossed
// something, what the live holds keep (else 0): chargeReply numbers. It needs holdLua.
const chargeLua = `
local function charge(key, spec, n, sec, now_us, allow)
  -- In the spec's window: the gateway settles an answer with the rule in force when it ends
  -- (a change of window since its admission re-keys the counter here, as a take would).
  local _, _, win = parse(spec)
  local ws, we = bounds(win, sec)
  local _, same = count(key, ws, win)
  local used
  if same then
    used = redis.call('HINCRBY', key, 'n', n)
  else
    local keep = keep_of(spec)
    local carry = keep_past(key, win, keep, ws)
    used = carry + n
    redis.call('HSET', key, 's', ws, 'n', used)
    keep_until(key, kept_until(we, win, keep) * 1000, now_us)
  end
  local mk = allow > 0 and marks(spec)
  if not mk then return 0, ws, used, 0 end
  local bits = cross(key, mk, used, allow, same, ws, we, now_us)
  if bits == 0 then return 0, ws, used, 0 end
  return bits, ws, used, (holds(key, now_us))
end
`

// chargeReply is how many numbers a charge replies with (chargeLua).
const chargeReply = 4

// Debit implements Store: one script call (on a Cluster, one per key, pipelined).
func (r *Redis) Debit(ctx context.Context, hits []Hit, n int64) error {
	if n <= 0 {
		return nil
	}
	var keys []string
	var args []any
	var charged []Hit
	for i := range hits {
		cr, err := r.rules.get(hits[i].Rule)
		if err != nil {
			return fmt.Errorf("limits: debit: %w", err)
		}
		if !cr.enabled || hits[i].Rule.Unit != Tokens {
			continue
		}
		keys = append(keys, cr.keyPre+hits[i].ID+"}")
		args = append(args, cr.spec, strconv.FormatInt(n, 10), strconv.FormatInt(hits[i].Allow, 10))
		charged = append(charged, hits[i])
	}
	if len(keys) == 0 {
		return nil
	}
	vals := make([]int64, chargeReply*len(keys)) // per key: chargeLua's numbers
	if r.cluster != nil && len(keys) > 1 {
		// The keys may live on different nodes: one call per key, in one pipeline.
		cmds := make([]*redis.Cmd, len(keys))
		err := r.eachKey(ctx, debitScript, keys, args, 3, cmds)
		for i, c := range cmds {
			if err := c.Err(); err != nil && err != redis.Nil {
				continue // its node's error is in err
			}
			v := vals[chargeReply*i : chargeReply*(i+1)]
			if reply, _ := c.Val().(string); scanInts(reply, v) != nil {
				clear(v) // unknown: nothing reported
			}
		}
		r.reportCharges(charged, vals)
		if err != nil {
			return withKey(fmt.Errorf("limits: debit: %w", err), keys)
		}
		return nil
	}
	cmd := debitScript.Run(ctx, r.client, keys, args...)
	if err := cmd.Err(); err != nil && err != redis.Nil {
		return withKey(fmt.Errorf("limits: debit: %w", err), keys)
	}
	if reply, _ := cmd.Val().(string); scanInts(reply, vals) == nil {
		r.reportCharges(charged, vals)
	}
	return nil
}

// reportCharges reports what charges crossed (WithCrossings): vals holds, for each of hits,
// chargeLua's numbers: the bits crossed, the window start, the count after the charge and
// the live holds.
func (r *Redis) reportCharges(hits []Hit, vals []int64) {
	if r.onCrossed == nil {
		return
	}
	for i, h := range hits {
		if v := vals[chargeReply*i : chargeReply*(i+1)]; v[0] > 0 && v[0] <= crossedMax {
			r.onCrossed(Crossed{Rule: h.Rule, ID: h.ID, Bits: uint16(v[0]), WindowStart: v[1], Used: v[2], Held: v[3], Allow: h.Allow})
		}
	}
}

// Debit implements Store.
func (m *Memory) Debit(ctx context.Context, hits []Hit, n int64) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("limits: debit: %w", err)
	}
	if n <= 0 {
		return nil
	}
	now := m.clock()
	var crossed []Crossed
	err := m.eachLocked(ctx, "debit", hits, func(r *Rule, cr *compiled) bool { return cr.enabled && r.Unit == Tokens },
		func(h *memHit) { crossed = m.charge(h, n, now, crossed) })
	report(m.onCrossed, crossed)
	return err
}

// charge adds n tokens to h's counter in the window current at now, the one an answer ends
// in, first keeping the ended window for history (roll, which never shortens the entry's
// life), and appends to crossed what it was the first to reach (chargeLua's cross); Debit
// and Settle alike (the caller holds the shard lock).
func (m *Memory) charge(h *memHit, n int64, now memTime, crossed []Crossed) []Crossed {
	e := m.entry(h)
	r := &h.cr.snap
	ws, we := r.Window.boundsUnix(now.sec)
	e.roll(r, ws, we) // in the rule's window, as chargeLua
	e.n += n
	if h.allow <= 0 || !marks(r) {
		return crossed
	}
	if bits := e.cross(r, h.allow, ws, we, now.us); bits != 0 {
		crossed = append(crossed, Crossed{Rule: h.rule, ID: h.key.id, Bits: bits, WindowStart: ws, Used: e.n, Held: e.held(now.us), Allow: h.allow})
	}
	return crossed
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
