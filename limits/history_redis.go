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

// historyLua (which ends windowLua, so every script has it) is what the take and debit
// scripts run when a tenant's counter enters a new window (see history.go): keep_past(key,
// spec, ws) moves the ended window's count into the field named by its start and drops the
// window that left the kept range (the spec's " k<n>" word, keep_of, says how many are kept),
// and returns the spec's window and keep; kept_until(we, win, keep) is when the hash may go:
// once its newest window has left the range, and keep_until sets that expiry, never shortening
// it. give_back_kept is a refund's way into a kept window (refund.go).
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

local function keep_past(key, spec, ws)
  local _, _, win = parse(spec)
  local keep = keep_of(spec)
  if keep == 0 then return win, 0 end
  local v = redis.call('HMGET', key, 's', 'n')
  local s, n = tonumber(v[1]), tonumber(v[2])
  if not s then return win, keep end -- a new tenant: nothing to keep or drop
  if n and n > 0 and s < ws then redis.call('HSET', key, v[1], v[2]) end
  -- The window that just left the range goes. Only when more fields remain than the range
  -- holds (the history was shortened by a reload) are they all looked at: fields older than
  -- the range left by windows without use stay, bounded by that count, and no read asks for
  -- them.
  local cut = shift(win, ws, -keep)
  redis.call('HDEL', key, tostring(shift(win, cut, -1)))
  if redis.call('HLEN', key) <= keep + 2 then return win, keep end
  local f = redis.call('HKEYS', key)
  for i = 1, #f do
    local w = tonumber(f[i])
    if w and w < cut then redis.call('HDEL', key, f[i]) end
  end
  return win, keep
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

-- give_back_kept takes one unit off the kept window starting at ws (a refund that arrives once
-- a later window began: the unit goes back where it was counted), never below 0; nothing
-- when the spec keeps no windows or ws has left the range (or is no ended window) at sec.
local function give_back_kept(key, spec, ws, sec)
  local _, _, win = parse(spec)
  local keep = keep_of(spec)
  local cur = bounds(win, sec)
  if keep == 0 or ws >= cur or ws < shift(win, cur, -keep) then return end
  local f = tostring(ws)
  local n = tonumber(redis.call('HGET', key, f))
  if not n or n <= 0 then return end
  if n == 1 then redis.call('HDEL', key, f) else redis.call('HINCRBY', key, f, -1) end
end
`

// historyReadLua answers the store's TIME and the counter's hash (fields and values).
const historyReadLua = `
local t = redis.call('TIME')
local v = redis.pcall('HGETALL', KEYS[1])
if type(v) == 'table' and v.err then return redis.error_reply(v.err .. ' (key ' .. KEYS[1] .. ')') end
return {t[1], v}
`

var historyReadScript = redis.NewScript(historyReadLua)

// History implements HistoryStore: one script call on the tenant's node.
func (r *Redis) History(ctx context.Context, rule *Rule, id string) ([]WindowUse, error) {
	cr, err := checkHistoryRule(&r.rules, rule)
	if err != nil {
		return nil, err
	}
	key := cr.keyPre + id + "}"
	v, err := historyReadScript.Run(ctx, r.client, []string{key}).Slice()
	if err != nil {
		return nil, r.followTopology(ctx, withKey(fmt.Errorf("limits: history %s: %w", rule.Name, err), []string{key}))
	}
	var now int64
	var kv []any
	if len(v) == 2 {
		now, err = strconv.ParseInt(str(v[0]), 10, 64)
		kv, _ = v[1].([]any)
	}
	if len(v) != 2 || err != nil || len(kv)%2 != 0 {
		return nil, withKey(fmt.Errorf("limits: history %s: %w %v", rule.Name, errMalformedReply, v), []string{key})
	}
	fields := make(map[string]int64, len(kv)/2)
	for i := 0; i < len(kv); i += 2 {
		n, err := strconv.ParseInt(str(kv[i+1]), 10, 64)
		if err == nil {
			fields[str(kv[i])] = n
		}
	}
	return historyOf(rule, now, func(ws int64) int64 {
		if s, ok := fields["s"]; ok && s == ws {
			return max(fields["n"], 0)
		}
		return max(fields[strconv.FormatInt(ws, 10)], 0)
	}), nil
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

func exportBatch(ctx context.Context, c redis.Cmdable, cr *compiled, keys []string, field string, found func(string, int64)) error {
	pipe := c.Pipeline()
	cmds := make([]*redis.SliceCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.HMGet(ctx, k, "s", "n", field)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("limits: export: read: %w", err)
	}
	for i, k := range keys {
		id, ok := idOf(cr.keyPre, k)
		v := cmds[i].Val()
		if !ok || len(v) != 3 {
			continue
		}
		var n int64
		if str(v[0]) == field {
			n, _ = strconv.ParseInt(str(v[1]), 10, 64)
		} else {
			n, _ = strconv.ParseInt(str(v[2]), 10, 64)
		}
		if n > 0 {
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
