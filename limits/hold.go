package limits

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Holds make token budgets exact under concurrency, and count answers in flight.
//
// A tokens limit with a Reserve of N takes N tokens at admission, in the decision's own
// script call and all-or-nothing with its other limits: the request is admitted only while
// at least N tokens remain net of the tokens used and the holds of the answers in flight.
// When the answer ends, Settle replaces the hold by the answer's tokens (a refund when it
// cost less, a charge when more) or releases it (the upstream failed or refused). So at
// every instant used + live holds ≤ limit, across replicas: for example, a limit of 1,000
// with a reserve of 100 admits 10 concurrent answers and denies the 11th; when one of them
// ends having cost 50, used is 50, 900 are held, and one more is admitted.
//
// A Streams limit counts answers in flight: a slot is taken at admission and given back by
// Settle when the answer ends.
//
// Holds and slots are crash-safe: each expires ReserveTTL after it was taken or last
// refreshed (its answer's gateway refreshes it while the answer lives: refresh.go), so those
// of a gateway that died come back by themselves. A hold settled after it expired is charged the
// answer's tokens all the same (never lost; possibly past the limit), and Settle names its
// limit so that it can be counted.
//
// An answer's tokens are not lost with its gateway either, but for what passed since its last
// refresh: each refresh leaves in the hold what the answer has passed so far (Refresher), and
// the first write on the tenant's counter (a decision, a refresh, a growth) that finds the hold
// expired charges those tokens in the window current then (reaping). The reaped hold stays as a
// hold of 0 for another ReserveTTL, which says its tokens are charged: were its answer alive
// after all (its gateway cut off from the store for a whole ReserveTTL), its refresh takes the
// hold again and its settle charges only the rest.
//
// In Redis a hold is a field "h:<hold>" = "<amount> <expiry, Unix µs>" of the limit's
// counter hash (a tokens limit: beside its window's s and n) or of the limit's own hash
// "<prefix>:<name>:streams:{<id>}" (a streams limit), which lives as long as its last hold
// and its window; a refreshed tokens hold has a field "p:<hold>" = "<passed> <charged>" beside
// it: what its answer had passed at its last refresh, and what reaping charged of it. The
// hash also keeps the sum, number and earliest expiry of its holds, so a decision reads three
// fields; the first decision after a hold expired reads the holds whole, reaps what expired
// holds had passed and drops the rest (holdLua, reapLua).

// DefaultReserveTTL is how long a hold or a slot lives when its rule sets no ReserveTTL. An
// answer in flight refreshes its holds (Refresh, refresh.go), so it may run longer: this is
// how long the holds of a gateway that died linger.
const DefaultReserveTTL = 10 * time.Minute

// holdSpec is what the spec of a rule with holds adds: " <reserve> <ttl ms>" ("" without).
func holdSpec(r *Rule) string {
	if r.Unit != Streams && (r.Unit != Tokens || r.Reserve <= 0) {
		return ""
	}
	return " " + strconv.FormatInt(r.Reserve, 10) + " " + strconv.FormatInt(reserveTTL(r).Milliseconds(), 10)
}

func reserveTTL(r *Rule) time.Duration {
	if r.ReserveTTL > 0 {
		return r.ReserveTTL
	}
	return DefaultReserveTTL
}

// holds says whether a Take charged to r holds something that Settle must end.
func holds(r *Rule) bool {
	return r != nil && r.Limit > 0 && (r.Unit == Streams || r.Unit == Tokens && r.Reserve > 0)
}

// compileStreams compiles a Streams rule: no window, one hash of slots per id.
func (c *ruleCache) compileStreams(cr *compiled) (*compiled, error) {
	r := &cr.snap
	switch {
	case !r.Window.IsZero():
		return nil, fmt.Errorf("%w: rule %q: a streams limit has no window", ErrInvalidRule, r.Name)
	case r.Algorithm != Fixed || r.Reserve != 0 || r.ReserveTTL < 0:
		return nil, fmt.Errorf("%w: rule %q: a streams limit has no algorithm and no reserve", ErrInvalidRule, r.Name)
	case r.Limit > MaxLimit:
		return nil, fmt.Errorf("%w: rule %q: limit %d is above %d", ErrInvalidRule, r.Name, r.Limit, int64(MaxLimit))
	}
	cr.keyPre = c.prefix + r.Name + ":streams:{"
	cr.plainPre = !strings.ContainsAny(cr.keyPre[:len(cr.keyPre)-1], "{}")
	cr.quotaPre = c.prefix + r.Name + ":" + unitKeyPart(Streams) + "quota:{"
	cr.algo = "c"
	if r.Shadow {
		cr.algo += "s"
	}
	// The window "1" is never used for counting; it keeps a run-time quota's grants readable.
	lim := strconv.FormatInt(r.Limit, 10)
	cr.spec = cr.algo + " " + lim + " 1" + holdSpec(r)
	cr.specQ = cr.algo + "q " + lim + " 1" + holdSpec(r)
	cr.period = 1
	return cr, nil
}

// newHold names the holds of one decision: 96 random bits.
func newHold() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Go >= 1.24
	return hex.EncodeToString(b[:])
}

// needsHold says whether a decision over hits may take holds.
func needsHold(hits []Hit) bool {
	for i := range hits {
		if holds(hits[i].Rule) {
			return true
		}
	}
	return false
}

// Held appends to dst the hits whose holds or slots d took (d's results in the same order):
// none when d did not admit; else every tokens limit with a reserve and every streams limit
// whose result admitted. Settle ends them.
func (d *Decision) Held(hits []Hit, dst []Hit) []Hit {
	if !d.Allowed || d.Hold == "" {
		return dst
	}
	for i := range hits {
		if i < len(d.Results) && d.Results[i].Allowed && holds(hits[i].Rule) {
			dst = append(dst, hits[i])
		}
	}
	return dst
}

// holdLua reads and writes holds (see hold.go). Beside the fields "h:<hold>", a hash keeps
// hs (the sum of their amounts), hc (their number) and hx (the earliest expiry, µs, possibly
// of a hold settled since): a decision reads those three, and reads the holds whole only once
// one may have expired, to drop the expired ones. holds(key, now_us) returns the live sum and
// number and the state st that store(key, st) writes back (the expired holds dropped) and
// hold(key, hid, amount, ttl, now_us, st, keep_ms) adds a hold to, keeping the hash until its
// last hold and at least until keep_ms (its window's end). An expired hold whose answer had
// passed tokens not charged yet (its "p:<hold>") is not dropped but listed in st.reaped, its
// tokens in st.owed, for a writer's reap (reapLua); a read alone leaves them. Numbers past
// 10^14 (µs) are formatted: Lua would write them in exponent notation.
const holdLua = `
-- hold_terms reads a hold's words of a spec, after the window: reserve and ttl (ms); 0, 0
-- for a spec without.
local function hold_terms(spec)
  local reserve, ttl = string.match(spec, '^%a+ %d+ %w+ (%d+) (%d+)')
  return tonumber(reserve) or 0, tonumber(ttl) or 0
end

local function holds(key, now_us)
  local v = read('HMGET', key, 'hs', 'hc', 'hx')
  local st = {sum = tonumber(v[1]) or 0, cnt = tonumber(v[2]) or 0, x = tonumber(v[3])}
  if st.cnt > 0 and st.x and st.x <= now_us then
    local all = read('HGETALL', key)
    st = {sum = 0, cnt = 0, dead = {}, reaped = {}, owed = 0}
    local passed, held = {}, {}
    for j = 1, #all, 2 do
      local kind, id = string.sub(all[j], 1, 2), string.sub(all[j], 3)
      if kind == 'p:' then passed[id] = all[j + 1] elseif kind == 'h:' then held[id] = true end
    end
    for j = 1, #all, 2 do
      local f = all[j]
      local kind, id = string.sub(f, 1, 2), string.sub(f, 3)
      if kind == 'h:' then
        local amt, exp = string.match(all[j + 1], '^(%d+) (%d+)$')
        amt, exp = tonumber(amt), tonumber(exp)
        local p, c = string.match(passed[id] or '', '^(%d+) (%d+)$')
        p, c = tonumber(p) or 0, tonumber(c) or 0
        if amt and exp > now_us then
          st.sum, st.cnt = st.sum + amt, st.cnt + 1
          if not st.x or exp < st.x then st.x = exp end
        elseif amt and amt > 0 and p > c then
          st.reaped[#st.reaped + 1] = {id, p}
          st.owed = st.owed + p - c
        else
          st.dead[#st.dead + 1] = f
          if passed[id] then st.dead[#st.dead + 1] = 'p:' .. id end
        end
      elseif kind == 'p:' and not held[id] then
        st.dead[#st.dead + 1] = f -- its hold was ended by a gateway that knew no p:
      end
    end
  end
  return st.sum, st.cnt, st
end

local function store(key, st)
  if st.dead and #st.dead > 0 then redis.call('HDEL', key, unpack(st.dead)) end
  if st.cnt > 0 then
    redis.call('HSET', key, 'hs', string.format('%d', st.sum), 'hc', st.cnt, 'hx', string.format('%d', st.x))
  else
    redis.call('HDEL', key, 'hs', 'hc', 'hx')
  end
end

local function hold(key, hid, amount, ttl, now_us, st, keep_ms)
  local exp = now_us + ttl * 1000
  redis.call('HSET', key, 'h:' .. hid, string.format('%d %d', amount, exp))
  st.sum, st.cnt = st.sum + amount, st.cnt + 1
  if not st.x or exp < st.x then st.x = exp end
  store(key, st)
  keep_until(key, math.max(math.ceil(exp / 1000), keep_ms), now_us)
end

-- unhold removes the hold field, whose value v the caller read (nil: gone); it returns whether
-- it was there and still live (a reaped hold, of 0, is not).
local function unhold(key, field, v, now_us)
  if not v then return false end
  local amt, exp = string.match(v, '^(%d+) (%d+)$')
  redis.call('HDEL', key, field)
  local a = tonumber(amt) or 0
  if redis.call('HINCRBY', key, 'hc', -1) <= 0 then
    redis.call('HDEL', key, 'hs', 'hc', 'hx')
  elseif a > 0 then -- (Redis takes no "-0")
    redis.call('HINCRBY', key, 'hs', -a)
  end
  return tonumber(exp) ~= nil and tonumber(exp) > now_us and a > 0
end
`

// passedLua reads a "p:<hold>" value: passed_of(v) is what the answer had passed, and what
// of it reaping charged (0 0 for nil).
const passedLua = `
local function passed_of(v)
  local p, c = string.match(v or '', '^(%d+) (%d+)$')
  return tonumber(p) or 0, tonumber(c) or 0
end
`

// reapLua (after holdLua and chargeLua) is how a writer charges what expired holds had passed
// (holds' st.reaped and st.owed): reap(key, spec, st, sec, now_us) charges st.owed in the
// current window (charge, reporting no crossing: the next charge reports what it passed),
// leaves each reaped hold as a hold of 0 for another ttl whose p: says its tokens are charged,
// and stores st (the dead fields dropped).
const reapLua = `
local function reap(key, spec, st, sec, now_us)
  if st.reaped and #st.reaped > 0 then
    local _, ttl = hold_terms(spec)
    local exp = now_us + ttl * 1000
    for _, r in ipairs(st.reaped) do
      redis.call('HSET', key, 'h:' .. r[1], string.format('0 %d', exp), 'p:' .. r[1], string.format('%d %d', r[2], r[2]))
      st.cnt = st.cnt + 1
      if not st.x or exp < st.x then st.x = exp end
    end
    charge(key, spec, st.owed, sec, now_us, 0)
    keep_until(key, math.ceil(exp / 1000), now_us)
  end
  store(key, st)
  st.reaped, st.owed, st.dead = nil, 0, nil
end
`

// reapBlock reaps the holds of key rk (spec rspec) with the state rst that holds read
// (reapLua, which needs chargeLua; sec and now_us in scope), in a block that runs only when
// rst.owed says there is something to reap: the definitions are made there, so the scripts
// that may reap but seldom do (the take, which runs for every request) do not pay for them on
// each call.
const reapBlock = chargeLua + reapLua + `
reap(rk, rspec, rst, sec, now_us)
`

// settleLua ends the holds of decision ARGV[1] on KEYS: a tokens limit ('t') is charged
// ARGV[2] tokens in its current window, the one the answer ends in (chargeLua; -1: released,
// nothing charged), less what reaping charged of its hold already (its p:), a streams slot
// ('c') is given back. ARGV[2+i] is the spec of KEYS[i], ARGV[2+#KEYS+i] the allowance its
// admitting decision applied (0 or absent: unknown). Reply: per key, "<expired> <bits crossed>
// <window start> <count> <held>": expired is 1 when a tokens hold that is charged had expired
// (or was gone); the rest is chargeLua's (0 0 0 0 when nothing was charged).
const settleLua = windowLua + holdLua + passedLua + chargeLua + `
local t = redis.call('TIME')
local sec = tonumber(t[1])
local now_us = sec * 1000000 + tonumber(t[2])
local field, pfield = 'h:' .. ARGV[1], 'p:' .. ARGV[1]
local n = tonumber(ARGV[2])
local out = {}
for i = 1, #KEYS do
  local spec = ARGV[i + 2]
  local algo = parse(spec)
  local v = {}
  if algo == 't' then v = read('HMGET', KEYS[i], field, pfield) else v[1] = read('HGET', KEYS[i], field) end
  local live = unhold(KEYS[i], field, v[1], now_us)
  local _, charged = passed_of(v[2])
  if v[2] then redis.call('HDEL', KEYS[i], pfield) end
  local expired, bits, ws, used, held = 0, 0, 0, 0, 0
  if algo == 't' and n >= 0 then
    if not live then expired = 1 end
    if n > charged then bits, ws, used, held = charge(KEYS[i], spec, n - charged, sec, now_us, tonumber(ARGV[2 + #KEYS + i]) or 0) end
  end
  out[i] = string.format('%d %d %d %d %d', expired, bits, ws, used, held)
end
return table.concat(out, ' ')
`

// settleScript is immutable after construction, so sharing it is not mutable package state.
var settleScript = redis.NewScript(settleLua)

// Settle implements Store: one script call; on a Cluster, one per key whose slot differs
// from the first key's (a request's limits by one tenant share a slot).
func (r *Redis) Settle(ctx context.Context, hold string, hits []Hit, n int64) ([]string, error) {
	if hold == "" {
		return nil, nil
	}
	keys, names, specs, err := r.heldKeys(hits)
	if err != nil {
		return nil, fmt.Errorf("limits: settle: %w", err)
	}
	if len(keys) == 0 {
		return nil, nil
	}
	st := settlement{hold: hold, amount: strconv.FormatInt(max(n, -1), 10), keys: keys, names: names, specs: specs, held: heldHits(hits)}
	all := make([]int, len(keys))
	for i := range all {
		all[i] = i
	}
	if r.cluster == nil {
		err := r.settleSlot(ctx, &st, all)
		return st.expired, r.followTopology(ctx, err)
	}
	// Cluster: one call per slot (rarely more than one). Grouped here, not in a function of
	// its own: returned, same and rest would be allocated, where here they stay on the stack.
	for len(all) > 0 {
		slot := keySlot(keys[all[0]])
		var same, rest []int
		for _, i := range all {
			if keySlot(keys[i]) == slot {
				same = append(same, i)
			} else {
				rest = append(rest, i)
			}
		}
		if err := r.settleSlot(ctx, &st, same); err != nil {
			return st.expired, r.followTopology(ctx, &NodeError{Node: r.nodeOf(ctx, keys[same[0]]), Err: err})
		}
		all = rest
	}
	return st.expired, nil
}

// settlement is one Settle: the held keys of a decision (heldKeys' order), what they are
// settled with, and the limits whose hold had expired, as the slots' calls report them.
type settlement struct {
	hold, amount string
	keys, names  []string
	specs        []any
	held         []Hit // keys[i]'s hit
	expired      []string
}

// heldHits are the hits that hold something (holds), in their order: heldKeys' keys.
func heldHits(hits []Hit) []Hit {
	var held []Hit
	for _, h := range hits {
		if holds(h.Rule) {
			held = append(held, h)
		}
	}
	return held
}

// settleSlot settles the keys of idx, which share a slot, in one script call, and reports
// their charges (WithCrossings) and expired holds.
func (r *Redis) settleSlot(ctx context.Context, st *settlement, idx []int) error {
	ks := make([]string, len(idx))
	args := make([]any, 2, 2+2*len(idx))
	args[0], args[1] = st.hold, st.amount
	for j, i := range idx {
		ks[j] = st.keys[i]
		args = append(args, st.specs[i])
	}
	for _, i := range idx {
		args = append(args, strconv.FormatInt(st.held[i].Allow, 10))
	}
	cmd, err := r.runSettle(ctx, ks, args)
	if err != nil {
		return withKey(fmt.Errorf("limits: settle: %w", err), ks)
	}
	// Not replicated in time (WithWaitReplicas): the master settled all the same.
	replErr := cmd.Err()
	if replErr != nil && !errors.Is(replErr, ErrNotReplicated) {
		return withKey(fmt.Errorf("limits: settle: %w", replErr), ks)
	}
	reply, _ := cmd.Val().(string)
	if err := r.settled(st, idx, reply); err != nil {
		return withKey(fmt.Errorf("limits: settle: %w", err), ks)
	}
	if replErr != nil {
		return withKey(fmt.Errorf("limits: settle: %w", replErr), ks)
	}
	return nil
}

// settled reads a settleLua reply for the keys of idx: per key, whether its hold had expired,
// then chargeLua's numbers.
func (r *Redis) settled(st *settlement, idx []int, reply string) error {
	const per = 1 + chargeReply
	vals := make([]int64, per*len(idx))
	if err := scanInts(reply, vals); err != nil {
		return err
	}
	charged := make([]Hit, len(idx))
	charges := make([]int64, 0, chargeReply*len(idx))
	for j, i := range idx {
		if vals[per*j] == 1 {
			st.expired = append(st.expired, st.names[i])
		}
		charged[j] = st.held[i]
		charges = append(charges, vals[per*j+1:per*(j+1)]...)
	}
	r.reportCharges(charged, charges)
	return nil
}

// runSettle runs settleScript on keys (one slot), followed by WAIT when WithWaitReplicas asks
// for it: a hold ended on a master that a failover loses would otherwise stay held until
// reserve_ttl on its promoted replica.
func (r *Redis) runSettle(ctx context.Context, keys []string, args []any) (*redis.Cmd, error) {
	switch {
	case r.waitReplicas == 0:
		return settleScript.Run(ctx, r.client, keys, args...), nil
	case r.cluster != nil: // WAIT must reach the node that ran the script
		node, err := r.cluster.MasterForKey(ctx, keys[0])
		if err != nil {
			return nil, err
		}
		return r.runWaited(ctx, node, settleScript, settleLua, keys, args...), nil
	}
	return r.runWaited(ctx, r.client, settleScript, settleLua, keys, args...), nil
}

// Settle implements Store. Like Debit, it goes through the breakers of the nodes it writes
// to, bounded by the caller's deadline (offPath): a settle against an open breaker is
// dropped (the caller logs it) and its holds come back when they expire.
func (g *Guard) Settle(ctx context.Context, hold string, hits []Hit, n int64) ([]string, error) {
	var expired []string
	err := g.onHeld(ctx, hold, hits, func(ctx context.Context, held []Hit) (err error) {
		expired, err = g.s.Settle(ctx, hold, held, n)
		return err
	})
	return expired, err
}

// releaseLost releases, in the background, the holds of a decision whose reply was lost (a
// timeout, a broken connection, a node that failed): the script may have run and taken them
// although the caller was told the limiter failed, and nobody would settle them before
// reserve_ttl, keeping a tenant who spent nothing out (the failure holds are known for). A
// release of a hold that was never taken changes nothing, so it is sent at once and twice more:
// a script still queued behind a busy Redis when the first release ran is caught by a later
// one (one still queued after that is left to reserve_ttl).
func (r *Redis) releaseLost(hold string, hits []Hit) {
	if hold == "" {
		return
	}
	held := heldHits(hits)
	go func() {
		for _, wait := range [...]time.Duration{0, time.Second, 3 * time.Second} {
			time.Sleep(wait)
			ctx, cancel := context.WithTimeout(context.Background(), giveBackBound)
			_, _ = r.Settle(ctx, hold, held, -1) // a failure here is what reserve_ttl is for
			cancel()
		}
	}()
}

// releaseAbandoned waits for a decision the Guard stopped waiting for and releases the holds
// it took: its caller was told the limiter failed, so nobody settles them.
func (g *Guard) releaseAbandoned(c *guardCall) {
	<-c.done
	if c.err != nil || !c.d.Allowed || c.d.Hold == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), giveBackBound)
	defer cancel()
	_, _ = g.s.Settle(ctx, c.d.Hold, c.hits, -1)
}
