package notify

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis is an Outbox in Redis, shared by every replica: a delivery written there survives the
// replica that detected it (SIGKILL included), and any live replica claims it once due. Its
// keys share one hash slot ({notify}), so it works on a Cluster too:
//
//	<prefix>:notify:{notify}:items  hash: key -> the delivery as JSON
//	<prefix>:notify:{notify}:due    sorted set: pending keys by when due (ms; a claim moves a
//	                                key to when its lease runs out)
//	<prefix>:notify:{notify}:dead   sorted set: dead letters by when they died (ms)
//	<prefix>:notify:{notify}:age    sorted set: every key by when it entered (ms), for
//	                                dropping the oldest when full
//	<prefix>:notify:{notify}:lease  hash: key -> the token of its current claim
//	<prefix>:notify:{notify}:seq    counter of claim tokens
//	<prefix>:notify:{notify}:seen   sorted set: keys of Once deliveries by when added (ms),
//	                                for SeenFor
type Redis struct {
	c   redis.UniversalClient
	max int
	k   []string // items, due, dead, age, lease, seq, seen
}

// NewRedis returns the outbox under prefix (redis.key_prefix), holding at most max
// deliveries (at least 1).
func NewRedis(c redis.UniversalClient, prefix string, max int) *Redis {
	if max < 1 {
		max = 1
	}
	base := prefix + ":notify:{notify}:"
	return &Redis{c: c, max: max, k: []string{base + "items", base + "due", base + "dead", base + "age", base + "lease", base + "seq", base + "seen"}}
}

func ms(t time.Time) int64 { return t.UnixMilli() }

// addScript: ARGV[1] is the bound, ARGV[2] now (ms), ARGV[3] SeenFor (ms); then per
// delivery its key, record, due, created (ms) and once (1 or 0).
var addScript = redis.NewScript(`
local max = tonumber(ARGV[1])
local now = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[7], '-inf', now - tonumber(ARGV[3]))
local dropped = {}
for i = 4, #ARGV, 5 do
  local k = ARGV[i]
  local fresh = redis.call('HEXISTS', KEYS[1], k) == 0
  if fresh and ARGV[i+4] == '1' then
    fresh = redis.call('ZADD', KEYS[7], 'NX', now, k) == 1
  end
  if fresh then
    while redis.call('HLEN', KEYS[1]) >= max do
      local o = redis.call('ZRANGE', KEYS[4], 0, 0)
      if #o == 0 then break end
      local v = redis.call('HGET', KEYS[1], o[1])
      if v then table.insert(dropped, v) end
      redis.call('HDEL', KEYS[1], o[1])
      redis.call('ZREM', KEYS[2], o[1])
      redis.call('ZREM', KEYS[3], o[1])
      redis.call('ZREM', KEYS[4], o[1])
      redis.call('HDEL', KEYS[5], o[1])
    end
    redis.call('HSET', KEYS[1], k, ARGV[i+1])
    redis.call('ZADD', KEYS[2], ARGV[i+2], k)
    redis.call('ZADD', KEYS[4], ARGV[i+3], k)
  end
end
return dropped
`)

func (r *Redis) Add(ctx context.Context, ds []Delivery) ([]Delivery, error) {
	if len(ds) == 0 {
		return nil, nil
	}
	args := []any{r.max, ms(time.Now()), SeenFor.Milliseconds()}
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
		args = append(args, d.Key, v, ms(d.Next), ms(d.Created), once)
	}
	res, err := addScript.Run(ctx, r.c, r.k, args...).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("notify: outbox add: %w", err)
	}
	return decodeAll(res)
}

func decodeAll(vs []string) ([]Delivery, error) {
	out := make([]Delivery, 0, len(vs))
	for _, v := range vs {
		var d Delivery
		if err := json.Unmarshal([]byte(v), &d); err != nil {
			return nil, fmt.Errorf("notify: outbox holds a malformed delivery: %w", err)
		}
		out = append(out, d)
	}
	return out, nil
}

var claimScript = redis.NewScript(`
local ks = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local out = {}
local due_at = tonumber(ARGV[1]) + tonumber(ARGV[3])
for _, k in ipairs(ks) do
  local v = redis.call('HGET', KEYS[1], k)
  if v then
    local tok = redis.call('INCR', KEYS[6])
    redis.call('ZADD', KEYS[2], due_at, k)
    redis.call('HSET', KEYS[5], k, tok)
    table.insert(out, tostring(tok))
    table.insert(out, v)
  else
    redis.call('ZREM', KEYS[2], k)
  end
end
return out
`)

func (r *Redis) Claim(ctx context.Context, now time.Time, n int, lease time.Duration) ([]Delivery, error) {
	res, err := claimScript.Run(ctx, r.c, r.k, ms(now), n, lease.Milliseconds()).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("notify: outbox claim: %w", err)
	}
	out := make([]Delivery, 0, len(res)/2)
	for i := 0; i+1 < len(res); i += 2 {
		var d Delivery
		if err := json.Unmarshal([]byte(res[i+1]), &d); err != nil {
			return nil, fmt.Errorf("notify: outbox holds a malformed delivery: %w", err)
		}
		if d.lease, err = strconv.ParseInt(res[i], 10, 64); err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}

// settleScript ends a claim if it still holds: ARGV[3] is done (remove), retry (pending again
// at ARGV[5] with the record ARGV[4]) or kill (dead at ARGV[5] with the record ARGV[4]).
var settleScript = redis.NewScript(`
if redis.call('HGET', KEYS[5], ARGV[1]) ~= ARGV[2] or redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  return 0
end
redis.call('HDEL', KEYS[5], ARGV[1])
if ARGV[3] == 'done' then
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('ZREM', KEYS[4], ARGV[1])
elseif ARGV[3] == 'retry' then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[4])
  redis.call('ZADD', KEYS[2], ARGV[5], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[4])
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('ZADD', KEYS[3], ARGV[5], ARGV[1])
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
	n, err := settleScript.Run(ctx, r.c, r.k, d.Key, strconv.FormatInt(d.lease, 10), op, rec, ms(at)).Int()
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

func (r *Redis) List(ctx context.Context, dead bool, n int) ([]Delivery, error) {
	if n <= 0 {
		return nil, nil
	}
	set := r.k[1]
	if dead {
		set = r.k[2]
	}
	keys, err := r.c.ZRange(ctx, set, 0, int64(n-1)).Result()
	if err != nil || len(keys) == 0 {
		return nil, err
	}
	vals, err := r.c.HMGet(ctx, r.k[0], keys...).Result()
	if err != nil {
		return nil, err
	}
	var out []Delivery
	for _, v := range vals {
		s, ok := v.(string)
		if !ok {
			continue // removed between the two reads
		}
		var d Delivery
		if err := json.Unmarshal([]byte(s), &d); err != nil {
			return nil, fmt.Errorf("notify: outbox holds a malformed delivery: %w", err)
		}
		out = append(out, d)
	}
	return out, nil
}

var requeueScript = redis.NewScript(`
if not redis.call('ZSCORE', KEYS[3], ARGV[1]) or redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1])
redis.call('ZADD', KEYS[4], ARGV[4], ARGV[1])
return 1
`)

func (r *Redis) Requeue(ctx context.Context, key string, now time.Time) (bool, error) {
	old, err := r.c.HGet(ctx, r.k[0], key).Result()
	if errors.Is(err, redis.Nil) {
		return false, nil
	} else if err != nil {
		return false, err
	}
	var d Delivery
	if err := json.Unmarshal([]byte(old), &d); err != nil {
		return false, fmt.Errorf("notify: outbox holds a malformed delivery: %w", err)
	}
	d.Dead, d.Next, d.Attempts, d.Created = false, now, 0, now
	rec, err := json.Marshal(d)
	if err != nil {
		return false, err
	}
	// The record is replaced only if unchanged since read (compared whole).
	n, err := requeueScript.Run(ctx, r.c, r.k, key, old, rec, ms(now)).Int()
	return n == 1, err
}

var dropScript = redis.NewScript(`
local n = redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('HDEL', KEYS[5], ARGV[1])
return n
`)

func (r *Redis) Drop(ctx context.Context, key string) (bool, error) {
	n, err := dropScript.Run(ctx, r.c, r.k, key).Int()
	return n == 1, err
}

func (r *Redis) Count(ctx context.Context) (pending, dead int, err error) {
	cmds, err := r.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.ZCard(ctx, r.k[1])
		p.ZCard(ctx, r.k[2])
		return nil
	})
	if err != nil {
		return 0, 0, err
	}
	return int(cmds[0].(*redis.IntCmd).Val()), int(cmds[1].(*redis.IntCmd).Val()), nil
}
