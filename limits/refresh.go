package limits

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// A hold or a slot expires ReserveTTL after it was taken, so that those of a gateway that died
// come back by themselves (hold.go). An answer that lives longer than that must not drop out
// of its limits: while it lives, its gateway refreshes its holds, each refresh making them live
// another ReserveTTL from then. So ReserveTTL bounds how long a dead gateway's holds linger, not
// how long an answer may run.

// Refresher keeps the holds and slots of answers in flight from expiring. Every store
// implements it.
type Refresher interface {
	// Refresh makes the holds and slots that decision hold took for hits (Decision.Held) live
	// another ReserveTTL (each its rule's) from now. A hold already expired, or gone (dropped
	// after it expired, or lost with a Redis master), or reaped (hold.go), is taken again as
	// it was taken, without a check: its answer is still in flight, so the limit must count
	// it, even past the limit. It returns the names of the limits whose hold was expired or
	// gone. Refresh must not run after the same hold's Settle: it would take the settled hold
	// again.
	//
	// passed (nil: nothing passed) says what the answer has passed so far of each tokens
	// limit's hold: the tokens its settle would charge had it ended now. Each tokens hold
	// carries it until the next refresh, and is charged it if it expires unsettled (its
	// gateway died: see hold.go), so that such an answer loses only what passed since its
	// last refresh.
	Refresh(ctx context.Context, hold string, hits []Hit, passed func(r *Rule) int64) ([]string, error)
}

// passedOf is what passed says of a tokens rule r, 0 for any other rule or without passed.
func passedOf(passed func(r *Rule) int64, r *Rule) int64 {
	if passed == nil || r.Unit != Tokens {
		return 0
	}
	return max(passed(r), 0)
}

var (
	_ Refresher = (*Memory)(nil)
	_ Refresher = (*Redis)(nil)
	_ Refresher = (*Guard)(nil)
)

// RefreshEvery is how often an answer in flight refreshes the holds and slots its decision took
// for hits (Decision.Held), so that none expires under it: a quarter of the shortest
// ReserveTTL among them, with each refresh bounded by half of that, so that one refresh may
// fail and the next still lands before the holds expire. 0 when hits hold nothing.
//
// For example, with the default ReserveTTL of 10 minutes, every 2.5 minutes.
func RefreshEvery(hits []Hit) time.Duration {
	var every time.Duration
	for i := range hits {
		if !holds(hits[i].Rule) {
			continue
		}
		if d := reserveTTL(hits[i].Rule) / 4; every == 0 || d < every {
			every = d
		}
	}
	return every
}

// refreshLua makes hold ARGV[1] on KEYS live another ttl from now; ARGV[1+i] is the spec of
// KEYS[i] (its reserve and ttl: hold_terms), ARGV[1+#KEYS+i] what the answer has passed of a
// tokens limit (0: nothing), which its p: field keeps with what reaping charged of it (the
// hash then lives a ttl past the hold, for a reaper). A hold that is gone, or reaped (of 0), is
// taken again: the reserve of a tokens limit, one slot of a streams limit ('c'). Expired holds
// of other answers found on the way are reaped (hold.go). An extended hold may have been the
// earliest (hx): the next decision then reads the holds whole once and finds the new earliest.
// Reply: per key, 1 when the hold was expired, reaped or gone, else 0.
const refreshLua = windowLua + holdLua + passedLua + `
local t = redis.call('TIME')
local sec = tonumber(t[1])
local now_us = sec * 1000000 + tonumber(t[2])
local field, pfield = 'h:' .. ARGV[1], 'p:' .. ARGV[1]
local out = {}
for i = 1, #KEYS do
  local key, spec = KEYS[i], ARGV[i + 1]
  local passed = tonumber(ARGV[1 + #KEYS + i]) or 0
  local reserve, ttl = hold_terms(spec)
  local exp = now_us + ttl * 1000
  local lapsed = 1
  local tokens = string.sub(spec, 1, 1) == 't'
  local v
  if tokens then v = read('HMGET', key, field, pfield, 'hx') else v = {read('HGET', key, field)} end
  if tokens and (tonumber(v[3]) or now_us + 1) <= now_us then -- hx: only while the hash has holds
    local _, _, st = holds(key, now_us) -- some hold expired: reaped first, this one's too
    if (st.owed or 0) > 0 then
      local rk, rspec, rst = key, spec, st
` + reapBlock + `
    else
      store(key, st)
    end
    v = read('HMGET', key, field, pfield)
  end
  local _, charged = passed_of(v[2])
  local keep, pv = math.ceil(exp / 1000), nil
  if passed > 0 or charged > 0 then
    pv, keep = string.format('%d %d', math.max(passed, charged), charged), keep + ttl
  end
  local amt, was = string.match(v[1] or '', '^(%d+) (%d+)$')
  if amt and tonumber(amt) > 0 then
    if tonumber(was) > now_us then lapsed = 0 end
    local hv = string.format('%d %d', tonumber(amt), exp)
    if pv then redis.call('HSET', key, field, hv, pfield, pv) else redis.call('HSET', key, field, hv) end
  else
    unhold(key, field, v[1], now_us) -- a reaped hold's 0
    local amount = reserve
    if string.sub(spec, 1, 1) == 'c' then amount = 1 end
    local _, _, st = holds(key, now_us)
    hold(key, ARGV[1], amount, ttl, now_us, st, 0)
    if pv then redis.call('HSET', key, pfield, pv) end
  end
  keep_until(key, keep, now_us)
  out[i] = tostring(lapsed)
end
return table.concat(out, ' ')
`

// refreshScript is immutable after construction, so sharing it is not mutable package state.
var refreshScript = redis.NewScript(refreshLua)

// Refresh implements Refresher: one script call; on a Cluster one per key, all in one
// pipeline (one round trip per node).
func (r *Redis) Refresh(ctx context.Context, hold string, hits []Hit, passed func(r *Rule) int64) ([]string, error) {
	if hold == "" {
		return nil, nil
	}
	keys, names, specs, err := r.heldKeys(hits)
	if err != nil || len(keys) == 0 {
		return nil, wrapRefresh(err)
	}
	amounts := make([]any, len(keys))
	for i, h := range heldHits(hits) {
		amounts[i] = strconv.FormatInt(passedOf(passed, h.Rule), 10)
	}
	var reply []string
	if r.cluster != nil && len(keys) > 1 {
		args := make([]any, 0, 3*len(keys))
		for i, s := range specs {
			args = append(args, hold, s, amounts[i])
		}
		cmds := make([]*redis.Cmd, len(keys))
		if err := r.eachKey(ctx, refreshScript, keys, args, 3, cmds); err != nil {
			return nil, r.followTopology(ctx, wrapRefresh(err))
		}
		for _, c := range cmds {
			s, _ := c.Val().(string)
			reply = append(reply, s)
		}
	} else {
		cmd := refreshScript.Run(ctx, r.client, keys, append(append([]any{hold}, specs...), amounts...)...)
		if err := cmd.Err(); err != nil {
			return nil, r.followTopology(ctx, withKey(wrapRefresh(err), keys))
		}
		s, _ := cmd.Val().(string)
		reply = append(reply, s)
	}
	flags := make([]int64, len(keys))
	if err := scanInts(strings.Join(reply, " "), flags); err != nil {
		return nil, withKey(wrapRefresh(err), keys)
	}
	var lapsed []string
	for i, f := range flags {
		if f == 1 {
			lapsed = append(lapsed, names[i])
		}
	}
	return lapsed, nil
}

func wrapRefresh(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("limits: refresh: %w", err)
}

// heldKeys returns the Redis keys, limit names and specs of the hits that hold something.
func (r *Redis) heldKeys(hits []Hit) (keys, names []string, specs []any, err error) {
	for i := range hits {
		cr, err := r.rules.get(hits[i].Rule)
		if err != nil {
			return nil, nil, nil, err
		}
		if !holds(hits[i].Rule) {
			continue
		}
		keys = append(keys, cr.keyPre+hits[i].ID+"}")
		names = append(names, hits[i].Rule.Name)
		specs = append(specs, cr.spec)
	}
	return keys, names, specs, nil
}

// Refresh implements Refresher, on the store's own clock.
func (m *Memory) Refresh(ctx context.Context, hold string, hits []Hit, passed func(r *Rule) int64) ([]string, error) {
	now := m.clock()
	var lapsed []string
	err := m.eachHeld(ctx, "refresh", hold, hits, func(h *memHit) {
		r := &h.cr.snap
		ttl := reserveTTL(r).Microseconds()
		exp := now.us + ttl
		e := m.entry(h)
		if r.Unit == Tokens {
			m.reapHolds(h, now) // refreshLua's, this one's too
		}
		hd, ok := e.holds[hold]
		if !ok || hd.expires <= now.us || hd.amount == 0 {
			lapsed = append(lapsed, r.Name)
		}
		if !ok || hd.amount == 0 { // gone, or reaped: taken again
			hd.amount = 1
			if r.Unit == Tokens {
				hd.amount = r.Reserve
			}
		}
		if e.holds == nil {
			e.holds = map[string]memHold{}
		}
		hd.expires = exp
		if p := passedOf(passed, h.rule); p > 0 || hd.charged > 0 {
			hd.passed = max(p, hd.charged)
			exp += ttl // a reaper's ttl past the hold
		}
		e.holds[hold] = hd
		e.expires = max(e.expires, exp)
	})
	return lapsed, err
}

// eachHeld calls f, under its shard's lock, for each hit that holds something under decision
// hold (h.e: its entry, nil when there is none); op names the operation in errors.
func (m *Memory) eachHeld(ctx context.Context, op, hold string, hits []Hit, f func(h *memHit)) error {
	if hold == "" {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("limits: %s: %w", op, err)
		}
		return nil
	}
	return m.eachLocked(ctx, op, hits, func(r *Rule, _ *compiled) bool { return holds(r) }, f)
}

// eachLocked calls f, under its shard's lock, with the entry of each hit whose rule want
// accepts (op names the caller in errors).
func (m *Memory) eachLocked(ctx context.Context, op string, hits []Hit, want func(r *Rule, cr *compiled) bool, f func(h *memHit)) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("limits: %s: %w", op, err)
	}
	for i := range hits {
		cr, err := m.rules.get(hits[i].Rule)
		if err != nil {
			return fmt.Errorf("limits: %s: %w", op, err)
		}
		if !want(hits[i].Rule, cr) {
			continue
		}
		h := memHit{cr: cr, key: memKey{cr.keyPre, hits[i].ID}, allow: hits[i].Allow, rule: hits[i].Rule}
		h.shard = m.shardOf(h.key)
		sh := &m.shards[h.shard]
		sh.mu.Lock()
		h.e = sh.m[h.key]
		f(&h)
		sh.mu.Unlock()
	}
	return nil
}

// Refresh implements Refresher. Like Settle, it goes through the breakers of the nodes it
// writes to, bounded by the caller's deadline: a refresh against an open breaker is dropped
// (the caller logs it) and the next one takes again what expired meanwhile.
func (g *Guard) Refresh(ctx context.Context, hold string, hits []Hit, passed func(r *Rule) int64) ([]string, error) {
	r, ok := g.s.(Refresher)
	if !ok {
		return nil, fmt.Errorf("limits: refresh: the store %T cannot refresh holds", g.s)
	}
	var lapsed []string
	err := g.onHeld(ctx, hold, hits, func(ctx context.Context, held []Hit) (err error) {
		lapsed, err = r.Refresh(ctx, hold, held, passed)
		return err
	})
	return lapsed, err
}

// onHeld runs call with the hits that hold something, when there are any, through the breakers
// of the nodes it writes to, bounded by the caller's deadline (offPath).
func (g *Guard) onHeld(ctx context.Context, hold string, hits []Hit, call func(ctx context.Context, held []Hit) error) error {
	cctx, cancel := g.offPath(ctx)
	defer cancel()
	var held []Hit
	for _, h := range hits {
		if holds(h.Rule) {
			held = append(held, h)
		}
	}
	if hold == "" || len(held) == 0 {
		return nil
	}
	nodes := g.nodesOf(cctx, held, nil)
	if err := g.admit(nodes); err != nil {
		return err
	}
	return g.record(ctx, nodes, call(cctx, held))
}
