package limits

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// A tokens hold may grow while its answer is in flight: a limit that ends answers when the
// tenant's budget runs out (the gateway's cutoff) keeps each answer's running count under
// its hold, and asks for more, a step at a time, as the answer runs past it. The step is
// granted as far as the tenant's allowance has room net of the tokens used in the window and
// the other live holds, in one atomic script call: so at every instant used + live holds
// stays within the allowance across replicas, and an answer that is refused more is ended by
// its gateway. Settle replaces the grown hold by the answer's tokens as for any hold.

// Grower grows the token holds of answers in flight. Every store implements it.
type Grower interface {
	// Grow raises the hold that decision hold took on the tokens limit of h (a tokens rule
	// with a Reserve) to want tokens, as far as the tenant's allowance (the limit or its
	// override, plus grants) has room net of the window's used tokens and the other live
	// holds; a hold never shrinks. A hold that expired or is gone is taken again, at what
	// there is room for. It returns the hold's amount now: less than want when the allowance
	// has no room for more.
	Grow(ctx context.Context, hold string, h Hit, want int64) (int64, error)
}

var (
	_ Grower = (*Memory)(nil)
	_ Grower = (*Redis)(nil)
	_ Grower = (*Guard)(nil)
)

// growLua grows hold ARGV[2] of the tokens counter KEYS[1] (spec ARGV[1], the tenant's quota
// KEYS[2]) to ARGV[3] tokens as far as the allowance has room (see Grower). Reply: the hold's
// amount now.
const growLua = windowLua + quotaLua + quotaStateLua + `
local t = redis.call('TIME')
local sec, usec = tonumber(t[1]), tonumber(t[2])
local now_us = sec * 1000000 + usec
local algo, limit, win = parse(ARGV[1])
local _, ttl = hold_terms(ARGV[1])
local _, _, st = holds(KEYS[1], now_us)
if (st.owed or 0) > 0 then -- what expired holds passed is used
  local rk, rspec, rst = KEYS[1], ARGV[1], st
` + reapBlock + `
end
local allow, used = state(KEYS[1], KEYS[2], algo, limit, win, sec, usec)
local field = 'h:' .. ARGV[2]
local want = tonumber(ARGV[3])
local old, exp = 0, nil
local v = read('HGET', KEYS[1], field)
if v then
  local a, x = string.match(v, '^(%d+) (%d+)$')
  if a and tonumber(x) > now_us then old, exp = tonumber(a), tonumber(x) end
end
local room = allow - used - (st.sum - old)
local amount = math.max(math.min(want, room), old)
if exp then
  if amount ~= old then
    redis.call('HSET', KEYS[1], field, string.format('%d %d', amount, exp))
    st.sum = st.sum + amount - old
    store(KEYS[1], st)
  elseif st.dead then
    store(KEYS[1], st)
  end
else
  -- Expired (read among the dead) or gone: taken again, at what there is room for.
  if st.dead then
    for j = #st.dead, 1, -1 do
      if st.dead[j] == field then table.remove(st.dead, j) end
    end
  end
  amount = math.max(amount, 0)
  hold(KEYS[1], ARGV[2], amount, ttl, now_us, st, 0)
end
return string.format('%d', amount)
`

// growScript is immutable after construction, so sharing it is not mutable package state.
var growScript = redis.NewScript(growLua)

// Grow implements Grower: one script call (the counter and the tenant's quota share a slot).
func (r *Redis) Grow(ctx context.Context, hold string, h Hit, want int64) (int64, error) {
	cr, err := r.rules.get(h.Rule)
	if err != nil {
		return 0, fmt.Errorf("limits: grow: %w", err)
	}
	if hold == "" || !holds(h.Rule) || h.Rule.Unit != Tokens {
		return 0, fmt.Errorf("limits: grow: %w: rule %q holds no tokens", ErrInvalidRule, h.Rule.Name)
	}
	keys := []string{cr.keyPre + h.ID + "}", cr.quotaPre + h.ID + "}"}
	reply, err := growScript.Run(ctx, r.client, keys, cr.spec, hold, strconv.FormatInt(max(want, 0), 10)).Text()
	if err != nil {
		return 0, r.followTopology(ctx, withKey(fmt.Errorf("limits: grow %s: %w", h.Rule.Name, err), keys))
	}
	n, err := strconv.ParseInt(reply, 10, 64)
	if err != nil {
		return 0, withKey(fmt.Errorf("limits: grow %s: %w %q", h.Rule.Name, errMalformedReply, reply), keys)
	}
	return n, nil
}

// Grow implements Grower, on the store's own clock.
func (m *Memory) Grow(ctx context.Context, hold string, hit Hit, want int64) (int64, error) {
	if hold == "" || !holds(hit.Rule) || hit.Rule.Unit != Tokens {
		return 0, fmt.Errorf("limits: grow: %w: rule %q holds no tokens", ErrInvalidRule, hit.Rule.Name)
	}
	q, _ := m.quotas.get(hit.Rule, hit.ID)
	now := m.clock()
	var amount int64
	err := m.eachHeld(ctx, "grow", hold, []Hit{hit}, func(h *memHit) {
		r := &h.cr.snap
		h.ws, h.we = r.Window.boundsUnix(now.sec)
		base, g, _ := q.terms(r.Limit, now.us, h.we)
		allow := allowance(base, g)
		e := m.entry(h)
		m.reapHolds(h, now) // expired holds first: what they passed is used, as growLua
		var used int64
		if e.expires > now.us {
			used, _ = e.current(r.Window, h.ws)
		}
		sum, _ := e.liveHolds(now.us) // drops the expired ones, this one's included
		old, live := e.holds[hold]
		if !live {
			old = memHold{}
		}
		amount = max(min(want, allow-used-(sum-old.amount)), old.amount)
		if !live {
			amount = max(amount, 0)
			m.addHold(h, hold, amount, now)
			return
		}
		old.amount = amount
		e.holds[hold] = old
	})
	return amount, err
}

// Grow implements Grower. Like Refresh, it goes through the breakers of the node it writes
// to, bounded by the caller's deadline.
func (g *Guard) Grow(ctx context.Context, hold string, h Hit, want int64) (int64, error) {
	gr, ok := g.s.(Grower)
	if !ok {
		return 0, fmt.Errorf("limits: grow: the store %T cannot grow holds", g.s)
	}
	var amount int64
	err := g.onHeld(ctx, hold, []Hit{h}, func(ctx context.Context, held []Hit) (err error) {
		amount, err = gr.Grow(ctx, hold, held[0], want)
		return err
	})
	return amount, err
}
