package limits

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// On Redis, an action is one script call on the tenant's slot (the counter and the quota
// hash, so before, change and after are one atomic step on Redis' clock), then one MULTI on
// the slot of the trail ("<prefix>:{quota}:audit", a list, newest first, trimmed to the
// store's audit maximum) and of the index of overrides ("<prefix>:{quota}:overrides", a sorted
// set by end, which the listing checks against each tenant's hash). An override is indexed
// before it is set, so the listing never misses one; what the index holds beyond the hashes
// (an override ended or lapsed) is skipped and swept.

// WithReadsOnly makes a store that only reads (usage history, exports): it does not watch
// which limits have run-time quotas, which only its Takes would need.
func WithReadsOnly() RedisOption {
	return func(r *Redis) { r.readsOnly = true }
}

// WithRedisAuditMax makes the store keep the newest n audit entries (default DefaultAuditMax).
func WithRedisAuditMax(n int) RedisOption {
	return func(r *Redis) {
		if n > 0 {
			r.auditMax = n
		}
	}
}

func (r *Redis) auditKey() string       { return r.rules.prefix + "{quota}:audit" }
func (r *Redis) overridesKey() string   { return r.rules.prefix + "{quota}:overrides" }
func (r *Redis) quotaLimitsKey() string { return r.rules.prefix + "{quota}:limits" }

// Which limits have run-time quotas: a decision sends a tenant's quota key, and its script
// reads it, only for the limits some tenant may have a quota of, so that the limits nobody
// adjusted cost nothing more than before quotas existed. "<prefix>:{quota}:limits" is a
// sorted set of limit names, scored by when their last quota may end (Unix seconds); an
// action adds its limit before it takes effect, and every store reads the set every
// quotaPoll, so a replica applies another's action within quotaPoll (and its own at once).
// Until its first read succeeds, and while reads fail, a store keeps what it knew (at
// first: every limit, which is always right, only dearer).

// quotaPoll is how often a store reads which limits have quotas: what a change on one replica
// may take to reach the others (the issue allows a second).
const quotaPoll = 250 * time.Millisecond

// quotaSkew is how long past its score a limit stays flagged: replicas' clocks may be behind.
const quotaSkew = 60

type quotaFlags struct {
	limits atomic.Pointer[map[string]bool] // nil: not read yet, every limit is on
	mu     sync.Mutex                      // serialises writers of limits and own
	// own are the limits this store flagged itself, until when (Unix seconds): a read that
	// began before the flag reached Redis must not turn them off again.
	own  map[string]int64
	stop chan struct{}
	done chan struct{}
}

// on says whether a decision must read its tenants' quotas of limit.
func (f *quotaFlags) on(limit string) bool {
	m := f.limits.Load()
	return m == nil || (*m)[limit]
}

// read replaces the limits that are on by those read from Redis, and this store's own.
func (f *quotaFlags) read(names []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := make(map[string]bool, len(names)+len(f.own))
	for _, n := range names {
		m[n] = true
	}
	now := time.Now().Unix()
	for n, until := range f.own {
		if until < now-quotaSkew {
			delete(f.own, n)
			continue
		}
		m[n] = true
	}
	f.limits.Store(&m)
}

// add turns limit on here at once, until until (Unix seconds).
func (f *quotaFlags) add(limit string, until int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.own == nil {
		f.own = map[string]int64{}
	}
	f.own[limit] = max(f.own[limit], until)
	old := f.limits.Load()
	if old == nil {
		return // every limit is on already
	}
	m := make(map[string]bool, len(*old)+1)
	for k := range *old {
		m[k] = true
	}
	m[limit] = true
	f.limits.Store(&m)
}

func (f *quotaFlags) start(r *Redis) {
	f.stop, f.done = make(chan struct{}), make(chan struct{})
	go func() {
		defer close(f.done)
		t := time.NewTicker(quotaPoll)
		defer t.Stop()
		for {
			ctx, cancel := context.WithTimeout(context.Background(), quotaPoll*4)
			names, err := r.client.ZRangeByScore(ctx, r.quotaLimitsKey(), &redis.ZRangeBy{
				Min: strconv.FormatInt(time.Now().Unix()-quotaSkew, 10), Max: "+inf"}).Result()
			cancel()
			if err == nil {
				f.read(names)
			}
			select {
			case <-f.stop:
				return
			case <-t.C:
			}
		}
	}()
}

func (f *quotaFlags) close() {
	if f.stop != nil {
		close(f.stop)
		<-f.done
		f.stop = nil
	}
}

// flag turns limit on in every store until until (Unix seconds), before an action on it takes
// effect, and in this one at once.
func (r *Redis) flag(ctx context.Context, limit string, until int64) error {
	err := r.client.ZAddGT(ctx, r.quotaLimitsKey(), redis.Z{Score: float64(until), Member: limit}).Err()
	if err != nil {
		return r.followTopology(ctx, fmt.Errorf("limits: quota flag: %w", err))
	}
	r.flags.add(limit, until)
	return nil
}

// indexMember names (limit, id) in the index: ids never hold a space (see the gateway's
// checks), limit names neither.
// indexMember names a tenant's override in the index: "<unit part><limit> <id>" (unitKeyPart:
// "" for requests, "tokens:" ...), so the listing finds the hash of the limit's unit. A limit
// name holds no ':'.
func indexMember(r *Rule, id string) string { return unitKeyPart(r.Unit) + r.Name + " " + id }

// ofIndexMember reads indexMember: the limit's name, its quota hash's name, the tenant.
func (r *Redis) ofIndexMember(m string) (limit, key, id string) {
	limit, id, _ = strings.Cut(m, " ")
	unit := ""
	if i := strings.IndexByte(limit, ':'); i >= 0 {
		unit, limit = limit[:i+1], limit[i+1:]
	}
	return limit, r.rules.prefix + limit + ":" + unit + "quota:{" + id + "}", id
}

// quotaOp is the reply of one action's script.
type quotaOp struct {
	now, windowEnd int64 // µs; s
	before, after  QuotaState
	base, ends     int64 // before: the limit or override, the override's end (µs, 0: none)
}

// run runs action on (r, id) with args, failing on the script's refusals.
func (r *Redis) quotaRun(ctx context.Context, cr *compiled, id, action string, args ...any) (quotaOp, error) {
	keys := []string{cr.keyPre + id + "}", cr.quotaPre + id + "}"}
	argv := append([]any{cr.spec, action}, args...)
	reply, err := quotaScript.Run(ctx, r.client, keys, argv...).Text()
	if err != nil {
		return quotaOp{}, r.followTopology(ctx, withKey(fmt.Errorf("limits: quota %s: %w", action, err), keys))
	}
	switch reply {
	case "none":
		return quotaOp{}, ErrNoOverride
	case "too_much_amount":
		return quotaOp{}, errTooMuch("amount")
	case "too_much_limit":
		return quotaOp{}, errTooMuch("limit")
	}
	var v [10]int64
	if err := scanInts(reply, v[:]); err != nil {
		return quotaOp{}, fmt.Errorf("limits: quota %s: %w", action, err)
	}
	return quotaOp{now: v[0], windowEnd: v[1],
		before: QuotaState{Limit: v[2], Used: v[3], Granted: v[4]},
		after:  QuotaState{Limit: v[5], Used: v[6], Granted: v[7]},
		base:   v[8], ends: v[9]}, nil
}

// change runs one action and records it; index, when set, updates the index of overrides in
// the same MULTI as the trail.
func (r *Redis) change(ctx context.Context, rule *Rule, id string, who Who, e *AuditEntry, args []any, index func(redis.Pipeliner, quotaOp)) (quotaOp, error) {
	cr, err := r.enabledRule(rule)
	if err != nil {
		return quotaOp{}, err
	}
	op, err := r.quotaRun(ctx, cr, id, e.Action, args...)
	if err != nil {
		return quotaOp{}, err
	}
	e.Time, e.Actor, e.Limit, e.ID, e.Reason = time.UnixMicro(op.now).UTC(), who.Actor, rule.Name, id, who.Reason
	e.Before, e.After = op.before, op.after
	if e.Action == ActionOverrideEnd { // the terms it ended
		e.Override = &OverrideTerms{Value: op.base, Expires: time.UnixMicro(op.ends).UTC()}
	}
	data, err := json.Marshal(e)
	if err != nil {
		return quotaOp{}, fmt.Errorf("limits: audit entry: %w", err)
	}
	_, err = r.client.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.LPush(ctx, r.auditKey(), data)
		p.LTrim(ctx, r.auditKey(), 0, int64(r.auditMaxOr()-1))
		if index != nil {
			index(p, op)
		}
		p.ZRemRangeByScore(ctx, r.overridesKey(), "-inf", strconv.FormatInt(op.now, 10))
		p.ZRemRangeByScore(ctx, r.quotaLimitsKey(), "-inf", strconv.FormatInt(op.now/1e6-3600, 10))
		return nil
	})
	if err != nil {
		// The action took effect; only its record is missing. Say so, naming the action: the
		// caller logs it, so it is not lost.
		return op, &AuditError{Entry: *e, Err: err}
	}
	return op, nil
}

// AuditError is an action that took effect but whose audit entry could not be written.
type AuditError struct {
	Entry AuditEntry
	Err   error
}

func (e *AuditError) Error() string {
	return "limits: the " + e.Entry.Action + " took effect but its audit entry was not written: " + e.Err.Error()
}
func (e *AuditError) Unwrap() error { return e.Err }

func (r *Redis) auditMaxOr() int {
	if r.auditMax > 0 {
		return r.auditMax
	}
	return DefaultAuditMax
}

func (r *Redis) enabledRule(rule *Rule) (*compiled, error) {
	cr, err := r.rules.get(rule)
	if err != nil {
		return nil, fmt.Errorf("limits: quota: %w", err)
	}
	if !cr.enabled {
		return nil, fmt.Errorf("%w: %q is disabled", ErrUnknownLimit, rule.Name)
	}
	return cr, nil
}

// Grant implements QuotaStore.
func (r *Redis) Grant(ctx context.Context, rule *Rule, id string, amount int64, who Who) (Grant, AuditEntry, error) {
	if err := checkGrant(rule, amount); err != nil {
		return Grant{}, AuditEntry{}, err
	}
	cr, err := r.enabledRule(rule)
	if err != nil {
		return Grant{}, AuditEntry{}, err
	}
	// Until the end of the window, as this replica sees it (quotaSkew covers the others).
	_, we := cr.snap.Window.boundsUnix(time.Now().Unix())
	if err := r.flag(ctx, rule.Name, we); err != nil {
		return Grant{}, AuditEntry{}, err
	}
	e := AuditEntry{Action: ActionGrant, Amount: amount}
	op, err := r.change(ctx, rule, id, who, &e, []any{amount}, nil)
	if err != nil && !errors.As(err, new(*AuditError)) {
		return Grant{}, AuditEntry{}, err
	}
	return Grant{Granted: op.after.Granted, WindowEnd: time.Unix(op.windowEnd, 0).UTC()}, e, err
}

// SetOverride implements QuotaStore.
func (r *Redis) SetOverride(ctx context.Context, rule *Rule, id string, value int64, expires time.Time, who Who) (Override, AuditEntry, error) {
	cr, err := r.enabledRule(rule)
	if err != nil {
		return Override{}, AuditEntry{}, err
	}
	// Checked against this replica's clock here, and against Redis' in the script.
	if err := checkOverride(cr, value, expires, time.Now()); err != nil {
		return Override{}, AuditEntry{}, err
	}
	ends := expires.UnixMicro()
	if err := r.flag(ctx, rule.Name, expires.Unix()+1); err != nil {
		return Override{}, AuditEntry{}, err
	}
	member := indexMember(rule, id)
	// Indexed first: the listing then never misses an override that is in force.
	if err := r.client.ZAdd(ctx, r.overridesKey(), redis.Z{Score: float64(ends), Member: member}).Err(); err != nil {
		return Override{}, AuditEntry{}, r.followTopology(ctx, fmt.Errorf("limits: override index: %w", err))
	}
	e := AuditEntry{Action: ActionOverride, Override: &OverrideTerms{Value: value, Expires: time.UnixMicro(ends).UTC()}}
	op, err := r.change(ctx, rule, id, who, &e, []any{value, ends, who.Reason, who.Actor}, nil)
	if err != nil && !errors.As(err, new(*AuditError)) {
		return Override{}, AuditEntry{}, err
	}
	o := Override{Limit: rule.Name, ID: id, Value: value, Expires: time.UnixMicro(ends).UTC(),
		Reason: who.Reason, Actor: who.Actor, Created: time.UnixMicro(op.now).UTC()}
	return o, e, err
}

// EndOverride implements QuotaStore.
func (r *Redis) EndOverride(ctx context.Context, rule *Rule, id string, who Who) (AuditEntry, error) {
	e := AuditEntry{Action: ActionOverrideEnd}
	_, err := r.change(ctx, rule, id, who, &e, nil, func(p redis.Pipeliner, _ quotaOp) {
		p.ZRem(ctx, r.overridesKey(), indexMember(rule, id))
	})
	if err != nil && !errors.As(err, new(*AuditError)) {
		return AuditEntry{}, err
	}
	return e, err
}

// Reset implements QuotaStore.
func (r *Redis) Reset(ctx context.Context, rule *Rule, id string, who Who) (AuditEntry, error) {
	e := AuditEntry{Action: ActionReset}
	_, err := r.change(ctx, rule, id, who, &e, nil, nil)
	if err != nil && !errors.As(err, new(*AuditError)) {
		return AuditEntry{}, err
	}
	return e, err
}

// Overrides implements QuotaStore: the index's members still to end, each checked against
// its tenant's hash (one pipeline; on a Cluster one round trip per node).
func (r *Redis) Overrides(ctx context.Context) ([]Override, error) {
	now, err := r.client.Time(ctx).Result()
	if err != nil {
		return nil, r.followTopology(ctx, fmt.Errorf("limits: overrides: time: %w", err))
	}
	members, err := r.client.ZRangeByScore(ctx, r.overridesKey(), &redis.ZRangeBy{
		Min: "(" + strconv.FormatInt(now.UnixMicro(), 10), Max: "+inf"}).Result()
	if err != nil {
		return nil, r.followTopology(ctx, fmt.Errorf("limits: overrides: %w", err))
	}
	out := []Override{}
	if len(members) == 0 {
		return out, nil
	}
	pipe := r.client.Pipeline()
	cmds := make([]*redis.SliceCmd, len(members))
	for i, m := range members {
		_, key, _ := r.ofIndexMember(m)
		cmds[i] = pipe.HMGet(ctx, key, "ov", "ox", "or", "oa", "oc")
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, r.followTopology(ctx, fmt.Errorf("limits: overrides: %w", err))
	}
	for i, m := range members {
		limit, _, id := r.ofIndexMember(m)
		if o, ok := overrideOf(limit, id, cmds[i].Val(), now.UnixMicro()); ok {
			out = append(out, o)
		}
	}
	sortOverrides(out)
	return out, nil
}

// overrideOf reads an override from its hash fields (ov, ox, or, oa, oc); false when none
// is in force.
func overrideOf(limit, id string, v []any, nowUS int64) (Override, bool) {
	if len(v) != 5 {
		return Override{}, false
	}
	ov, err1 := strconv.ParseInt(str(v[0]), 10, 64)
	ox, err2 := strconv.ParseInt(str(v[1]), 10, 64)
	if err1 != nil || err2 != nil || ox <= nowUS {
		return Override{}, false
	}
	created, _ := strconv.ParseInt(str(v[4]), 10, 64)
	return Override{Limit: limit, ID: id, Value: ov, Expires: time.UnixMicro(ox).UTC(),
		Reason: str(v[2]), Actor: str(v[3]), Created: time.UnixMicro(created).UTC()}, true
}

// Audit implements QuotaStore. An entry that does not decode (written by hand) is skipped.
func (r *Redis) Audit(ctx context.Context, n int) ([]AuditEntry, error) {
	if n <= 0 {
		return []AuditEntry{}, nil
	}
	raw, err := r.client.LRange(ctx, r.auditKey(), 0, int64(n-1)).Result()
	if err != nil {
		return nil, r.followTopology(ctx, fmt.Errorf("limits: audit: %w", err))
	}
	out := make([]AuditEntry, 0, len(raw))
	for _, s := range raw {
		var e AuditEntry
		if json.Unmarshal([]byte(s), &e) == nil {
			out = append(out, e)
		}
	}
	return out, nil
}

// quotaOpLua runs one action on a tenant's quota: KEYS[1] is its counter, KEYS[2] its quota
// hash; ARGV[1] the rule's spec, ARGV[2] the action, then its arguments (grant: amount;
// override: value, end µs, reason, actor). It answers "none" (no override to end),
// "too_much_amount" or "too_much_limit" (past 2^53 - 1), else "<now µs> <window end s>",
// the tenant's allowance, use and grants before and after, and the base and override end
// (µs, 0: none) before.
const quotaOpLua = windowLua + quotaLua + quotaStateLua + `
local t = redis.call('TIME')
local sec, usec = tonumber(t[1]), tonumber(t[2])
local now_us = sec * 1000000 + usec
local algo, limit, win = parse(ARGV[1])
local action = ARGV[2]
local ckey, qkey = KEYS[1], KEYS[2]
local max_limit = 9007199254740991
-- A counter whose window has ended holds that window's count in s and n until the tenant's
-- next unit moves it into history (keep_past): every action moves it first, exactly as that
-- unit would, so a reset forgets the current window only and no action loses an ended one.
if algo == 'f' or algo == 't' then
  local ws, we = bounds(win, sec)
  local _, same = count(ckey, ws, win)
  if not same and redis.call('EXISTS', ckey) == 1 then
    local keep = keep_of(ARGV[1])
    local carry = keep_past(ckey, win, keep, ws)
    redis.call('HSET', ckey, 's', ws, 'n', carry)
    keep_until(ckey, kept_until(we, win, keep) * 1000, now_us)
  end
end
local b_allow, b_used, b_g, base, ends = state(ckey, qkey, algo, limit, win, sec, usec)
local _, we = bounds(win, sec)
if action == 'grant' then
  local amount = tonumber(ARGV[3])
  if b_g + amount > max_limit - math.max(base, limit) then return 'too_much_amount' end
  redis.call('HSET', qkey, 'g', b_g + amount, 'ge', we)
elseif action == 'override' then
  if tonumber(ARGV[4]) <= now_us then return redis.error_reply('ERR limits: the override ends in the past') end
  if tonumber(ARGV[3]) > max_limit - b_g then return 'too_much_limit' end
  redis.call('HSET', qkey, 'ov', ARGV[3], 'ox', ARGV[4], 'or', ARGV[5], 'oa', ARGV[6], 'oc', now_us)
elseif action == 'override_end' then
  if ends == 0 then return 'none' end
  redis.call('HDEL', qkey, 'ov', 'ox', 'or', 'oa', 'oc')
elseif action == 'reset' then
  -- A fixed window's kept windows (history.go, the ended one just moved there) stay, and a
  -- tokens limit's holds belong to the answers in flight, not to the window's use: only the
  -- current count goes. A streams limit's slots do go (an operator's way out before
  -- reserve_ttl).
  if algo == 'g' or algo == 'c' or redis.call('HLEN', ckey) <= 2 then redis.call('DEL', ckey) else redis.call('HDEL', ckey, 's', 'n', 'x', 'e', 'f') end -- a reset window is crossed anew
else
  return redis.error_reply('ERR limits: unknown quota action ' .. tostring(action))
end
-- The hash lives as long as what it holds: the override, the window's grants.
local q = redis.call('HMGET', qkey, 'ov', 'ox', 'g', 'ge')
local keep = 0
local ox, ge = tonumber(q[2]), tonumber(q[4])
if q[1] and ox and ox > now_us then keep = math.ceil(ox / 1000) end
if q[3] and ge and ge * 1000000 > now_us then keep = math.max(keep, ge * 1000) end
if keep == 0 then redis.call('DEL', qkey) else redis.call('PEXPIREAT', qkey, keep) end
local a_allow, a_used, a_g = state(ckey, qkey, algo, limit, win, sec, usec)
return string.format('%d %d %d %d %d %d %d %d %d %d', now_us, we, b_allow, b_used, b_g, a_allow, a_used, a_g, base, ends)
`
