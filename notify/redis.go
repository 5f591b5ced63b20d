package notify

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis is an Outbox in Redis, shared by every replica: a delivery written there survives the
// replica that detected it (SIGKILL included), and any live replica claims it once due. Its
// keys share one hash slot ({notify}), so it works on a Cluster too:
//
//	<prefix>:notify:{notify}:items      hash: key -> the delivery as JSON
//	<prefix>:notify:{notify}:due        sorted set: the pending keys of the tenants' share of
//	                                    no limit by when due (ms; a claim moves a key to when
//	                                    its lease runs out)
//	<prefix>:notify:{notify}:due:<s>    the same for each other share s: "t:<limit>" (a
//	                                    limit's tenants) or "v:<limit>" (its visitors)
//	<prefix>:notify:{notify}:shares     set: the shares s that have a due set
//	<prefix>:notify:{notify}:dead       sorted set: the tenants' dead letters by when they
//	                                    died (ms)
//	<prefix>:notify:{notify}:dead:v     sorted set: the visitors' dead letters, likewise
//	<prefix>:notify:{notify}:lease      hash: key -> the token of its current claim
//	<prefix>:notify:{notify}:seq        counter of claim tokens
//	<prefix>:notify:{notify}:seen       sorted set: keys of Once deliveries by when added (ms),
//	                                    for SeenFor
//
// A pending delivery is one hash field and one sorted-set member. Earlier releases also kept
// every key in <prefix>:notify:{notify}:age and knew only due and dead: what they wrote
// is the tenants' share of no limit here, and each key leaves age with its delivery.
type Redis struct {
	c   redis.UniversalClient
	max int
	k   []string // items, due, dead, age, lease, seq, seen, dead:v, shares (the scripts' KEYS)
}

// NewRedis returns the outbox under prefix (redis.key_prefix), holding at most max
// deliveries (at least 1).
func NewRedis(c redis.UniversalClient, prefix string, max int) *Redis {
	if max < 1 {
		max = 1
	}
	base := prefix + ":notify:{notify}:"
	return &Redis{c: c, max: max, k: []string{base + "items", base + "due", base + "dead", base + "age", base + "lease",
		base + "seq", base + "seen", base + "dead:v", base + "shares"}}
}

func ms(t time.Time) int64 { return t.UnixMilli() }

// shareName is how the scripts name a share: "t:" or "v:", then the limit.
func shareName(s Share) string {
	if s.Visitor {
		return "v:" + s.Limit
	}
	return "t:" + s.Limit
}

// sharesLua is what the scripts share: the key of a share's due set and of a kind's dead
// letters, the shares that have a due set, and a delivery's removal from everywhere but
// those sets. The due sets' keys are derived from KEYS[2], in its hash slot.
const sharesLua = `
local function duekey(sh)
  if sh == 't:' then return KEYS[2] end
  return KEYS[2] .. ':' .. sh
end
local function deadkey(sh)
  if string.sub(sh, 1, 1) == 'v' then return KEYS[8] end
  return KEYS[3]
end
local function shares()
  local all = {'t:'}
  for _, sh in ipairs(redis.call('SMEMBERS', KEYS[9])) do
    if sh ~= 't:' then table.insert(all, sh) end
  end
  return all
end
local aged = redis.call('EXISTS', KEYS[4]) == 1
local function forget(k)
  redis.call('HDEL', KEYS[1], k)
  redis.call('HDEL', KEYS[5], k)
  if aged then redis.call('ZREM', KEYS[4], k) end
end
`

// addScript: ARGV[1] is the bound, ARGV[2] now (ms), ARGV[3] SeenFor (ms); then per
// delivery its key, record, due (ms), once (1 or 0) and share. It returns what it dropped:
// "e" and the record of a delivery dropped to make room, "r" and the key of one refused.
var addScript = redis.NewScript(sharesLua + `
local max = tonumber(ARGV[1])
local now = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[7], '-inf', now - tonumber(ARGV[3]))
-- The pending deliveries of each share and the dead letters of each kind, read once, kept
-- up to date below.
local size = {}
for _, sh in ipairs(shares()) do size[sh] = redis.call('ZCARD', duekey(sh)) end
local dead = {v = redis.call('ZCARD', KEYS[8]), t = redis.call('ZCARD', KEYS[3])}
-- The share of a kind ('t' or 'v') holding the most; ties to sh, then by name.
local function largest(kind, sh)
  local best, most = nil, 0
  for s, n in pairs(size) do
    if string.sub(s, 1, 1) == kind and n > 0 and
       (n > most or (n == most and (s == sh or (best ~= sh and s < best)))) then
      best, most = s, n
    end
  end
  return best
end
-- Makes room for a delivery of share sh (notify.Outbox's rule): the key of what goes, or
-- nil when only tenants' deliveries are held and sh is a visitor's.
local function victim(sh)
  for _, kind in ipairs({'v', 't'}) do
    if kind == 't' and string.sub(sh, 1, 1) == 'v' then return nil end
    while dead[kind] > 0 do
      dead[kind] = dead[kind] - 1
      local d = redis.call('ZPOPMIN', deadkey(kind .. ':'))
      if #d > 0 then return d[1] end
    end
    local s = largest(kind, sh)
    while s do
      local p = redis.call('ZPOPMIN', duekey(s))
      if #p > 0 then
        size[s] = size[s] - 1
        return p[1]
      end
      size[s] = 0
      s = largest(kind, sh)
    end
  end
  return nil
end
local dropped = {}
for i = 4, #ARGV, 5 do
  local k, sh = ARGV[i], ARGV[i+4]
  local fresh = redis.call('HEXISTS', KEYS[1], k) == 0
  if fresh and ARGV[i+3] == '1' then
    fresh = redis.call('ZADD', KEYS[7], 'NX', now, k) == 1
  end
  while fresh and redis.call('HLEN', KEYS[1]) >= max do
    local o = victim(sh)
    if not o then
      if string.sub(sh, 1, 1) == 'v' then
        table.insert(dropped, 'r')
        table.insert(dropped, k)
        fresh = false
      end
      break -- a tenant's with nothing indexed to drop (never expected): taken all the same
    end
    local v = redis.call('HGET', KEYS[1], o)
    if v then
      table.insert(dropped, 'e')
      table.insert(dropped, v)
    end
    forget(o)
  end
  if fresh then
    redis.call('HSET', KEYS[1], k, ARGV[i+1])
    redis.call('ZADD', duekey(sh), ARGV[i+2], k)
    if not size[sh] then
      redis.call('SADD', KEYS[9], sh)
      size[sh] = 0
    end
    size[sh] = size[sh] + 1
  end
end
return dropped
`)

func (r *Redis) Add(ctx context.Context, ds []Delivery) ([]Delivery, error) {
	if len(ds) == 0 {
		return nil, nil
	}
	args := make([]any, 0, 3+5*len(ds))
	args = append(args, r.max, ms(time.Now()), SeenFor.Milliseconds())
	for _, d := range ds {
		if !validDelivery(d) {
			return nil, ErrInvalid
		}
		d.Dead, d.lease = false, 0
		v, err := json.Marshal(d)
		if err != nil {
			return nil, err
		}
		once := 0
		if d.Once {
			once = 1
		}
		args = append(args, d.Key, v, ms(d.Next), once, shareName(d.Share()))
	}
	res, err := addScript.Run(ctx, r.c, r.k, args...).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("notify: outbox add: %w", err)
	}
	var dropped []Delivery
	for i := 0; i+1 < len(res); i += 2 {
		if res[i] == "r" {
			if j := slices.IndexFunc(ds, func(d Delivery) bool { return d.Key == res[i+1] }); j >= 0 {
				dropped = append(dropped, ds[j])
			}
			continue
		}
		d, err := decode(res[i+1])
		if err != nil {
			return nil, err
		}
		dropped = append(dropped, d)
	}
	return dropped, nil
}

func decode(v string) (Delivery, error) {
	var d Delivery
	if err := json.Unmarshal([]byte(v), &d); err != nil {
		return d, fmt.Errorf("notify: outbox holds a malformed delivery: %w", err)
	}
	return d, nil
}

// claimScript: ARGV[1] is now (ms), ARGV[2] how many, ARGV[3] the lease (ms). It leases the
// tenants' due deliveries first, then the visitors', each by when due, and returns each
// one's token and record.
var claimScript = redis.NewScript(sharesLua + `
local now, n = tonumber(ARGV[1]), tonumber(ARGV[2])
local due_at = now + tonumber(ARGV[3])
local out = {}
local all = shares()
for _, kind in ipairs({'t', 'v'}) do
  local cand = {}
  for _, sh in ipairs(all) do
    if string.sub(sh, 1, 1) == kind then
      local r = redis.call('ZRANGEBYSCORE', duekey(sh), '-inf', now, 'WITHSCORES', 'LIMIT', 0, n - #out / 2)
      for j = 1, #r, 2 do table.insert(cand, {tonumber(r[j+1]), r[j], sh}) end
    end
  end
  table.sort(cand, function(a, b)
    if a[1] ~= b[1] then return a[1] < b[1] end
    return a[2] < b[2]
  end)
  for _, c in ipairs(cand) do
    if #out / 2 >= n then break end
    local v = redis.call('HGET', KEYS[1], c[2])
    if v then
      local tok = redis.call('INCR', KEYS[6])
      redis.call('ZADD', duekey(c[3]), due_at, c[2])
      redis.call('HSET', KEYS[5], c[2], tok)
      table.insert(out, tostring(tok))
      table.insert(out, v)
    else
      redis.call('ZREM', duekey(c[3]), c[2])
    end
  end
end
return out
`)

func (r *Redis) Claim(ctx context.Context, now time.Time, n int, lease time.Duration) ([]Delivery, error) {
	if n <= 0 {
		return nil, nil
	}
	res, err := claimScript.Run(ctx, r.c, r.k, ms(now), n, lease.Milliseconds()).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("notify: outbox claim: %w", err)
	}
	out := make([]Delivery, 0, len(res)/2)
	for i := 0; i+1 < len(res); i += 2 {
		d, err := decode(res[i+1])
		if err != nil {
			return nil, err
		}
		if d.lease, err = strconv.ParseInt(res[i], 10, 64); err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

// settleScript ends a claim if it still holds: ARGV[3] is done (remove), retry (pending again
// at ARGV[5] with the record ARGV[4]) or kill (dead at ARGV[5] with the record ARGV[4]);
// ARGV[6] is the delivery's share.
var settleScript = redis.NewScript(sharesLua + `
local k, sh = ARGV[1], ARGV[6]
if redis.call('HGET', KEYS[5], k) ~= ARGV[2] or redis.call('HEXISTS', KEYS[1], k) == 0 then
  return 0
end
redis.call('HDEL', KEYS[5], k)
if ARGV[3] == 'done' then
  forget(k)
  redis.call('ZREM', duekey(sh), k)
elseif ARGV[3] == 'retry' then
  redis.call('HSET', KEYS[1], k, ARGV[4])
  redis.call('ZADD', duekey(sh), ARGV[5], k)
else
  redis.call('HSET', KEYS[1], k, ARGV[4])
  redis.call('ZREM', duekey(sh), k)
  redis.call('ZADD', deadkey(sh), ARGV[5], k)
end
return 1
`)

func (r *Redis) settle(ctx context.Context, d Delivery, op string, at time.Time) (bool, error) {
	if d.lease == 0 {
		return false, nil
	}
	rec := []byte{}
	if op != "done" {
		var err error
		if rec, err = json.Marshal(d); err != nil {
			return false, err
		}
	}
	n, err := settleScript.Run(ctx, r.c, r.k, d.Key, strconv.FormatInt(d.lease, 10), op, rec, ms(at), shareName(d.Share())).Int()
	if err != nil {
		return false, fmt.Errorf("notify: outbox %s: %w", op, err)
	}
	return n == 1, nil
}

func (r *Redis) Done(ctx context.Context, d Delivery) (bool, error) {
	return r.settle(ctx, d, "done", time.Time{})
}

func (r *Redis) Retry(ctx context.Context, d Delivery) (bool, error) {
	d.Dead = false
	return r.settle(ctx, d, "retry", d.Next)
}

func (r *Redis) Kill(ctx context.Context, d Delivery, now time.Time) (bool, error) {
	d.Dead, d.Next = true, now
	return r.settle(ctx, d, "kill", now)
}

// listScript: ARGV[1] is 1 for the dead letters, 0 for the pending; ARGV[2] how many. It
// returns their records in order (by when they died, or are due; then by key).
var listScript = redis.NewScript(sharesLua + `
local n = tonumber(ARGV[2])
local sets = {KEYS[3], KEYS[8]}
if ARGV[1] == '0' then
  sets = {}
  for _, sh in ipairs(shares()) do table.insert(sets, duekey(sh)) end
end
local cand = {}
for _, set in ipairs(sets) do
  local r = redis.call('ZRANGE', set, 0, n - 1, 'WITHSCORES')
  for j = 1, #r, 2 do table.insert(cand, {tonumber(r[j+1]), r[j]}) end
end
table.sort(cand, function(a, b)
  if a[1] ~= b[1] then return a[1] < b[1] end
  return a[2] < b[2]
end)
local out = {}
for _, c in ipairs(cand) do
  if #out >= n then break end
  local v = redis.call('HGET', KEYS[1], c[2])
  if v then table.insert(out, v) end
end
return out
`)

func (r *Redis) List(ctx context.Context, dead bool, n int) ([]Delivery, error) {
	if n <= 0 {
		return nil, nil
	}
	which := 0
	if dead {
		which = 1
	}
	res, err := listScript.Run(ctx, r.c, r.k, which, n).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("notify: outbox list: %w", err)
	}
	var out []Delivery
	for _, v := range res {
		d, err := decode(v)
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

// requeueScript: ARGV[1] is the key, ARGV[2] its record as read, ARGV[3] the new one,
// ARGV[4] now (ms), ARGV[5] its share.
var requeueScript = redis.NewScript(sharesLua + `
local k, sh = ARGV[1], ARGV[5]
if not redis.call('ZSCORE', deadkey(sh), k) or redis.call('HGET', KEYS[1], k) ~= ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[1], k, ARGV[3])
redis.call('ZREM', deadkey(sh), k)
redis.call('ZADD', duekey(sh), ARGV[4], k)
if sh ~= 't:' then redis.call('SADD', KEYS[9], sh) end
return 1
`)

func (r *Redis) Requeue(ctx context.Context, key string, now time.Time) (bool, error) {
	old, err := r.c.HGet(ctx, r.k[0], key).Result()
	if errors.Is(err, redis.Nil) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	d, err := decode(old)
	if err != nil {
		return false, err
	}
	d.Dead, d.Next, d.Attempts, d.Created = false, now, 0, now
	rec, err := json.Marshal(d)
	if err != nil {
		return false, err
	}
	// The record is replaced only if unchanged since read (compared whole).
	n, err := requeueScript.Run(ctx, r.c, r.k, key, old, rec, ms(now), shareName(d.Share())).Int()
	return n == 1, err
}

// dropScript removes ARGV[1] wherever it is; its share is read from its record.
var dropScript = redis.NewScript(sharesLua + `
local k = ARGV[1]
local v = redis.call('HGET', KEYS[1], k)
if not v then return 0 end
local rec = cjson.decode(v)
local sh = 't:'
if rec.visitor == true then sh = 'v:' end
if type(rec.limit) == 'string' then sh = sh .. rec.limit end
forget(k)
redis.call('ZREM', duekey(sh), k)
redis.call('ZREM', deadkey(sh), k)
return 1
`)

func (r *Redis) Drop(ctx context.Context, key string) (bool, error) {
	n, err := dropScript.Run(ctx, r.c, r.k, key).Int()
	return n == 1, err
}

func (r *Redis) Count(ctx context.Context) (pending, dead int, err error) {
	cmds, err := r.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.HLen(ctx, r.k[0])
		p.ZCard(ctx, r.k[2])
		p.ZCard(ctx, r.k[7])
		return nil
	})
	if err != nil {
		return 0, 0, err
	}
	total, tenants, visitors := cmds[0].(*redis.IntCmd).Val(), cmds[1].(*redis.IntCmd).Val(), cmds[2].(*redis.IntCmd).Val()
	return int(total - tenants - visitors), int(tenants + visitors), nil
}
