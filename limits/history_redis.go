package limits

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// historyLua (which ends windowLua, so every script has it) is what the scripts run when a
// tenant's counter enters a new window (see history.go): keep_past(key, win, keep, ws) moves
// the ended window's count into the field named by its start, drops the window that left the
// kept range (the spec's " k<n>" word, keep_of, says how many are kept) and carries the count
// over when the limit's window changed; kept_until(we, win, keep) is when the
// hash may go: once its newest window has left the range, and keep_until sets that expiry,
// never shortening it. give_back_kept is a refund's way into a kept window (refund.go).
const historyLua = `
local function shift(win, ws, k)
  if win ~= 'm' then return ws + k * period_of(win) end
  local s = ws
  for _ = 1, math.abs(k) do
    if k < 0 then s = bounds(win, s - 1) else local _, e = bounds(win, s); s = e end
  end
  return s
end

-- keep_of reads the last word of a spec, " k<n>": the number of ended windows kept (0
-- without it).
local function keep_of(spec)
  return tonumber(string.match(spec, ' k(%d+)$')) or 0
end

-- win_keep reads a spec's window and the number of ended windows it keeps.
local function win_keep(spec)
  local _, _, win = parse(spec)
  return win, keep_of(spec)
end

-- keep_past ends the window a hash counts in, as window ws of win begins: the ended count
-- moves into the field named by its start (added to it: a change of window and a change back
-- can end two windows of one start), the window that left the kept range goes, and the hash is
-- marked as counting in win. It returns the count the new window carries over: 0, but for a
-- hash that counted in another window (the limit's window changed) whose window began inside
-- ws's (those units were used in it; count agrees), with the kept windows that began inside it
-- (kept_in: a change back), which it deletes. Kept windows of another length otherwise keep
-- their starts (readers bill each to the window containing its start, byWindow), and m marks
-- the hash as holding some, so an export reads it whole.
local function keep_past(key, win, keep, ws)
  local v = redis.call('HMGET', key, 's', 'n', 'w', 'x', 'e', 'f')
  local s, n = tonumber(v[1]), tonumber(v[2]) or 0
  if v[3] ~= win then redis.call('HSET', key, 'w', win) end
  -- The marks belong to the window that ended (cross); read with the rest, so that a counter
  -- without (notifications off) costs no command more.
  if v[4] or v[5] or v[6] then redis.call('HDEL', key, 'x', 'e', 'f') end
  if not s then return 0 end -- a new tenant (or a reset one): nothing to keep or drop
  local carry = 0
  if v[3] and v[3] ~= win then
    if keep > 0 then redis.call('HSET', key, 'm', 1) end
    if bounds(win, s) == ws then
      carry = n + kept_in(key, win, ws, true)
    elseif keep > 0 and n > 0 then
      redis.call('HINCRBY', key, v[1], n)
    end
  elseif keep > 0 and n > 0 and s < ws then
    redis.call('HINCRBY', key, v[1], n)
  end
  if keep == 0 then return carry end
  -- The window that just left the range goes. Only when more fields remain than the range
  -- holds (the history was shortened by a reload) are they all looked at: fields older than
  -- the range left by windows without use stay, bounded by that count, and no read asks for
  -- them.
  local cut = shift(win, ws, -keep)
  redis.call('HDEL', key, tostring(shift(win, cut, -1)))
  if redis.call('HLEN', key) <= keep + 3 then return carry end
  local f = redis.call('HKEYS', key)
  for i = 1, #f do
    local w = tonumber(f[i])
    if w and w < cut then redis.call('HDEL', key, f[i]) end
  end
  return carry
end

local function kept_until(we, win, keep)
  if keep == 0 then return we end
  return shift(win, we, keep)
end

-- keep_until makes key live at least until keep_ms (PTTL rather than Redis 7's PEXPIRETIME),
-- never shorter: a counter with holds (hold.go) lives as long as its last live hold, which may
-- outlast the window and its kept range (a reserve_ttl longer than those).
local function keep_until(key, keep_ms, now_us)
  local pttl = redis.call('PTTL', key)
  if pttl < 0 or math.floor(now_us / 1000) + pttl < keep_ms then
    redis.call('PEXPIREAT', key, keep_ms)
  end
end

-- give_back_kept takes u units off the kept window starting at ws (a refund that arrives once
-- a later window began: the units go back where they were counted), never below 0; nothing
-- when the spec keeps no windows or ws has left the range (or is no ended window) at sec.
local function give_back_kept(key, win, keep, ws, sec, u)
  local cur = bounds(win, sec)
  if keep == 0 or ws >= cur or ws < shift(win, cur, -keep) then return end
  local f = tostring(ws)
  local n = tonumber(redis.call('HGET', key, f))
  if not n or n <= 0 then return end
  if n <= u then redis.call('HDEL', key, f) else redis.call('HINCRBY', key, f, -u) end
end
`

// historyReadLua answers the store's TIME (seconds and µs), the counter KEYS[1]'s hash (fields
// and values) and the tenant's quota KEYS[2] (its fields ov, ox, g and ge).
const historyReadLua = `
local t = redis.call('TIME')
local v = redis.pcall('HGETALL', KEYS[1])
if type(v) == 'table' and v.err then return redis.error_reply(v.err .. ' (key ' .. KEYS[1] .. ')') end
local q = redis.pcall('HMGET', KEYS[2], 'ov', 'ox', 'g', 'ge')
if type(q) == 'table' and q.err then return redis.error_reply(q.err .. ' (key ' .. KEYS[2] .. ')') end
return {t[1], v, q, t[2]}
`

var historyReadScript = redis.NewScript(historyReadLua)

// History implements HistoryStore: one script call on the tenant's node.
func (r *Redis) History(ctx context.Context, rule *Rule, id string) ([]WindowUse, error) {
	cr, err := checkHistoryRule(&r.rules, rule)
	if err != nil {
		return nil, err
	}
	keys := []string{cr.keyPre + id + "}", cr.quotaPre + id + "}"} // one slot: the id's
	v, err := historyReadScript.Run(ctx, r.client, keys).Slice()
	if err != nil {
		return nil, r.followTopology(ctx, withKey(fmt.Errorf("limits: history %s: %w", rule.Name, err), keys))
	}
	var sec, usec int64
	var kv, q []any
	if len(v) == 4 {
		sec, err = strconv.ParseInt(str(v[0]), 10, 64)
		kv, _ = v[1].([]any)
		q, _ = v[2].([]any)
		if err == nil {
			usec, err = strconv.ParseInt(str(v[3]), 10, 64)
		}
	}
	if len(v) != 4 || err != nil || len(kv)%2 != 0 {
		return nil, withKey(fmt.Errorf("limits: history %s: %w %v", rule.Name, errMalformedReply, v), keys)
	}
	by := byWindow(rule.Window, usesOf(kv))
	return historyOf(rule, quotaOfFields(q), sec*1e6+usec, func(ws int64) int64 { return by[ws] }), nil
}

// usesOf reads the windows of a counter hash's fields and values (HGETALL): the current one
// (s, n) and the kept ones (fields named by their start).
func usesOf(kv []any) []pastUse {
	uses := make([]pastUse, 0, len(kv)/2)
	var cur pastUse
	for i := 0; i+1 < len(kv); i += 2 {
		f := str(kv[i])
		n, err := strconv.ParseInt(str(kv[i+1]), 10, 64)
		if err != nil {
			continue
		}
		switch f {
		case "s":
			cur.ws = n
		case "n":
			cur.n = n
		default:
			if ws, err := strconv.ParseInt(f, 10, 64); err == nil {
				uses = append(uses, pastUse{ws, n})
			}
		}
	}
	return append(uses, cur)
}

// Export implements HistoryStore. Like Scan it walks every master's keyspace with SCAN MATCH
// (never KEYS) and reads each batch in one pipeline: one HMGET of the current window's fields
// and the kept one's per tenant.
func (r *Redis) Export(ctx context.Context, rule *Rule, start int64, visit func(id string, used int64)) error {
	cr, err := checkHistoryRule(&r.rules, rule)
	if err != nil {
		return err
	}
	if !cr.enabled {
		return nil
	}
	var mu sync.Mutex
	field := strconv.FormatInt(start, 10)
	node := func(ctx context.Context, c redis.Cmdable) error {
		match := globEscape(cr.keyPre) + "*"
		var cursor uint64
		for {
			keys, next, err := c.ScanType(ctx, cursor, match, scanCount, "hash").Result()
			if err != nil {
				return fmt.Errorf("limits: export: %w", err)
			}
			if len(keys) > 0 {
				if err := exportBatch(ctx, c, cr, keys, field, func(id string, n int64) {
					mu.Lock()
					defer mu.Unlock()
					visit(id, n)
				}); err != nil {
					return err
				}
			}
			if next == 0 {
				return nil
			}
			cursor = next
		}
	}
	if r.cluster != nil {
		return r.cluster.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return node(ctx, c) })
	}
	return node(ctx, r.client)
}

// exportBatch reads one SCAN batch: one HMGET per counter of the export's window, and the
// whole hash of the few counting in another window (a plan with another window) or keeping
// windows of another length (m: the limit's window changed), whose windows are summed by
// byWindow.
func exportBatch(ctx context.Context, c redis.Cmdable, cr *compiled, keys []string, field string, found func(string, int64)) error {
	pipe := c.Pipeline()
	cmds := make([]*redis.SliceCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.HMGet(ctx, k, "s", "n", "w", "m", field)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("limits: export: read: %w", err)
	}
	w := cr.snap.Window
	start, _ := strconv.ParseInt(field, 10, 64)
	var other []string
	for i, k := range keys {
		id, ok := idOf(cr.keyPre, k)
		v := cmds[i].Val()
		if !ok || len(v) != 5 {
			continue
		}
		if kw, ok := windowOfSpec(str(v[2])); ok && kw != w || v[3] != nil {
			other = append(other, k)
			continue
		}
		var n int64
		if str(v[0]) == field {
			n, _ = strconv.ParseInt(str(v[1]), 10, 64)
		} else {
			n, _ = strconv.ParseInt(str(v[4]), 10, 64)
		}
		if n > 0 {
			found(id, n)
		}
	}
	if len(other) == 0 {
		return nil
	}
	pipe = c.Pipeline()
	all := make([]*redis.MapStringStringCmd, len(other))
	for i, k := range other {
		all[i] = pipe.HGetAll(ctx, k)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("limits: export: read: %w", err)
	}
	for i, k := range other {
		id, _ := idOf(cr.keyPre, k)
		if n := byWindow(w, usesOf(flatten(all[i].Val())))[start]; n > 0 {
			found(id, n)
		}
	}
	return nil
}

// Clock implements HistoryStore: Redis' TIME (on a Cluster, one master's).
func (r *Redis) Clock(ctx context.Context) (time.Time, error) {
	t, err := r.client.Time(ctx).Result()
	if err != nil {
		return time.Time{}, r.followTopology(ctx, fmt.Errorf("limits: time: %w", err))
	}
	return t, nil
}
