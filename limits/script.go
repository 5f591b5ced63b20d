package limits

import "github.com/redis/go-redis/v9"

// windowLua computes window bounds from Unix seconds, mirroring
// Window.boundsUnix. Calendar months use Howard Hinnant's days-from-civil
// arithmetic because Redis' Lua has no os.date. Lua's % floors, like floorTo.
const windowLua = `
local function days_from_civil(y, m, d)
  if m <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local mp = (m + 9) % 12
  local doy = math.floor((153 * mp + 2) / 5) + d - 1
  local doe = yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy
  return era * 146097 + doe - 719468
end

local function civil_from_days(z)
  z = z + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524) - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local m = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400
  if m <= 2 then y = y + 1 end
  return y, m
end

local function bounds(win, sec)
  local n
  if win == 'h' then n = 3600
  elseif win == 'd' then n = 86400
  elseif win == 'm' then
    local y, m = civil_from_days(math.floor(sec / 86400))
    local s = days_from_civil(y, m, 1) * 86400
    if m == 12 then y = y + 1; m = 1 else m = m + 1 end
    return s, days_from_civil(y, m, 1) * 86400
  else n = tonumber(win) end
  local s = sec - sec % n
  return s, s + n
end

-- GCRA time base of redis_rate/v10: float seconds since 2017-01-01, so the
-- numbers keep sub-microsecond precision in a double.
local jan_1_2017 = 1483228800

-- A spec is "<algo>[s][q][u<n>] <limit> <window>"; the s marks a shadow limit, the q a limit
-- whose tenants' run-time quotas are to be read (see takeLua), u<n> a hit of a requests limit
-- taking n units at once (0: a check that takes none; without it, one: Hit.Units). More words
-- may follow (hold_terms).
local function parse(spec)
  local algo, shadow, q, u, limit, win = string.match(spec, '^(%a)(s?)(q?)u?(%d*) (%d+) (%w+)')
  if not algo then error('limits: bad rule spec ' .. tostring(spec)) end
  return algo, tonumber(limit), win, shadow == 's', q == 'q', tonumber(u) or 1
end

-- GCRA in units of the emission interval em: a bucket whose TAT is t holds (t - gnow) / em
-- units. Every time that enters it is a whole microsecond, so a difference below gcra_slack
-- seconds is the rounding of the doubles, not time: forgiving it keeps a fresh bucket of 7 per
-- minute at 6 remaining after one request (floor(diff / em) of redis_rate says 5) and admits
-- all 7 of a burst.
local gcra_slack = 2.5e-7
local function held(t, gnow, em)
  return math.max(math.ceil((t - gnow - gcra_slack) / em), 0)
end

-- read runs a read command on one key. A reply about the key's data (a key of another type
-- that someone wrote under the limit's name: WRONGTYPE) fails the call naming the key, before
-- anything is written, so the gateway can tell it from a failing node and log which key.
local function read(cmd, key, ...)
  local v = redis.pcall(cmd, key, ...)
  if type(v) == 'table' and v.err then
    error({err = v.err .. ' (key ' .. key .. ')'})
  end
  return v
end

-- kept_in sums the kept windows (fields named by their start) that began inside window ws of
-- win, and with drop deletes them: windows of another length that a change of window moved
-- aside, inside the window a change back returned to (their units were used in it). Only the
-- decisions after a change of window read them, until one admits a unit and keep_past moves
-- them.
local function kept_in(key, win, ws, drop)
  local _, we = bounds(win, ws)
  local f = redis.call('HGETALL', key)
  local sum = 0
  for i = 1, #f, 2 do
    local w = tonumber(f[i])
    if w and w >= ws and w < we then
      sum = sum + (tonumber(f[i + 1]) or 0)
      if drop then redis.call('HDEL', key, f[i]) end
    end
  end
  return sum
end

-- count reads a fixed window's hash: its count if it is of window ws of win, else 0. same
-- says the hash is in that window already; a hash counted in another window (w: the limit's
-- window changed since) is not, but its count is carried over when the window it counted
-- began inside ws's window (its units were all used there), with the kept windows that began
-- there too; keep_past moves them.
local function count(key, ws, win)
  local v = read('HMGET', key, 's', 'n', 'w')
  local s = tonumber(v[1])
  if not s then return 0, false end
  local n = tonumber(v[2])
  if v[2] and (not n or n ~= math.floor(n)) then
    error({err = 'ERR limits: the count is not an integer (key ' .. key .. ')'})
  end
  if v[3] and v[3] ~= win then
    if bounds(win, s) == ws then return (n or 0) + kept_in(key, win, ws, false), false end
    return 0, false
  end
  if s ~= ws then return 0, false end
  return n or 0, true
end

-- marks reads a spec's word of marks, " x<e><f>:<ppm>,...": whether a tenant's first refusal
-- in a window is reported, whether it is forecast, and the thresholds in millionths; nil for a
-- spec without (thresholds.go).
local function marks(spec)
  local e, f, list = string.match(spec, ' x(%d)(%d):([%d,]*)')
  if not e then return nil end
  local th = {}
  for p in string.gmatch(list, '%d+') do th[#th + 1] = tonumber(p) end
  return {e = e == '1', f = f == '1', th = th}
end

-- reached is how many thresholds used units of allow reach (Thresholds.reached).
local function reached(th, used, allow)
  if allow <= 0 then return 0 end
  local k = 0
  for i = 1, #th do
    if used * 1e6 >= th[i] * allow then k = i end
  end
  return k
end

-- forecasts is forecasts in thresholds.go, in the same doubles.
local function forecasts(used, allow, ws, we, now_us)
  if allow <= 0 or used >= allow then return false end
  local elapsed, span = now_us - ws * 1e6, (we - ws) * 1e6
  return elapsed * 20 >= span and used * 20 >= allow and elapsed * allow < used * span
end

-- cross marks in key what used units of allow were the first in the window [ws, we) to reach
-- (x: how many thresholds; f: the forecast) and returns their bits of Result.Crossed (0 most
-- of the time); same says the hash already counted in this window (else it holds no marks).
local function cross(key, mk, used, allow, same, ws, we, now_us)
  local bits = 0
  local k = reached(mk.th, used, allow)
  if k > 0 then
    local x = 0
    if same then x = tonumber(redis.call('HGET', key, 'x')) or 0 end
    if k > x then
      redis.call('HSET', key, 'x', k)
      for j = x + 1, k do bits = bits + 2 ^ (j - 1) end
    end
  end
  if mk.f and forecasts(used, allow, ws, we, now_us) and redis.call('HSETNX', key, 'f', 1) == 1 then
    bits = bits + 512
  end
  return bits
end

local function period_of(win)
  if win == 'h' then return 3600 elseif win == 'd' then return 86400
  elseif win == 'm' then return 2592000 end
  return tonumber(win)
end
` + historyLua // the kept windows a window's end moves aside (history_redis.go)

// quotaLua reads a tenant's run-time quota of one limit (see quota.go): a hash that almost
// no tenant has, so its read costs one lookup of a missing key. It returns the base (the
// override in force, else limit), the grants of the window (aligned as a fixed window's)
// and the override's end in µs (0: none).
const quotaLua = `
local function quota(key, limit, win, sec, now_us)
  local q = read('HMGET', key, 'ov', 'ox', 'g', 'ge')
  if not q[1] and not q[3] then return limit, 0, 0 end
  local base, g, ends = limit, 0, 0
  local ov, ox = tonumber(q[1]), tonumber(q[2])
  if ov and ox and ox > now_us then base, ends = ov, ox end
  if q[3] then
    local _, we = bounds(win, sec)
    if tonumber(q[4]) == we then g = tonumber(q[3]) or 0 end
  end
  return base, g, ends
end

-- The allowance: base plus grants, nothing while an override of 0 stands.
local function allowance(base, g)
  if base == 0 then return 0 end
  return base + g
end
`

// takeLua decides all limits at once: KEYS[i] is the counter of limit i, ARGV[i] its spec:
// "f|g|t[s][q] <limit> <window>", s for a shadow limit, q for a limit some of whose tenants
// may have a run-time quota (see quota.go): the quota keys of those limits follow the
// counters in KEYS, in the same order, each in its counter's slot. The first pass only
// reads; the second writes. A request is admitted when every enforced limit had room in its
// allowance (the limit or the tenant's override, plus the window's grants); it is then
// charged to every enforced limit and to every shadow limit that still has room, and a
// request denied by an enforced limit is charged to none: all-or-nothing in one call (a
// script runs atomically), shadow limits that keep counting after one of them is spent
// included. Fixed-window keys are hashes {s = window start, n = count} expiring at the
// window end; a stale s means a new window. GCRA keys hold the TAT exactly like
// redis_rate/v10, the bucket refilling at the base (limit or override) per period and
// holding the allowance. 't' (tokens) limits are only checked, but for a reserve, and 'c'
// (streams) limits count their live slots: both take a hold named by the last ARGV, "@<hold>"
// (see hold.go).
//
// Reply: "<ok> then per key: <allowed> <remaining> <reset µs> <retry µs> <window start>",
// followed for a q limit by "<allowance> <base>"; then, for each key whose decision crossed
// one of its marks (thresholds.go), "<key position, from 1> <Result.Crossed bits> <used>
// <held>" (Result.Used and Result.Held). One string (instead of an array of integers) keeps
// the client's reply parsing to a single allocation.
const takeLua = windowLua + quotaLua + `
-- Run-time quotas are rare: one EXISTS over the decision's quota keys says whether any is
-- to be read.
local function any_quota(from, to)
  return redis.call('EXISTS', unpack(KEYS, from, to)) > 0
end
` + takeBody

// nodeTakeLua is takeLua for a Cluster node (see nodePrelude). Its keys may lie in several
// slots of the node, and a command of several keys must keep to one slot even in a script
// allowed to cross them: the quota keys are checked one EXISTS each.
const nodeTakeLua = nodePrelude + windowLua + quotaLua + `
local function any_quota(from, to)
  for i = from, to do
    if redis.call('EXISTS', KEYS[i]) == 1 then return true end
  end
  return false
end
` + takeBody

const takeBody = holdLua + `
local t = redis.call('TIME')
local sec = tonumber(t[1])
local usec = tonumber(t[2])
local now_us = sec * 1000000 + usec
local gnow = (sec - jan_1_2017) + (usec / 1000000)
local n = #ARGV
local hid = ''
if n > 0 and string.sub(ARGV[n], 1, 1) == '@' then
  hid = string.sub(ARGV[n], 2)
  n = n - 1
end
local quotas = #KEYS > n and any_quota(n + 1, #KEYS)
local qk = n -- the last quota key read
local st = {}
local ok = 1
for i = 1, n do
  local algo, limit, win, shadow, q, u = parse(ARGV[i])
  local base, g, ends = limit, 0, 0
  if q then
    qk = qk + 1
    if quotas then base, g, ends = quota(KEYS[qk], limit, win, sec, now_us) end
  end
  -- u units are taken (0: a check), and need must fit to admit.
  local h = {algo = algo, limit = allowance(base, g), base = base, ends = ends, q = q, shadow = shadow, rlimit = limit, u = u, need = math.max(u, 1)}
  if algo == 'f' or algo == 't' then h.mk = marks(ARGV[i]) end
  if algo == 'f' or algo == 't' then
    local ws, we = bounds(win, sec)
    local cnt, same = count(KEYS[i], ws, win)
    h.ws, h.we, h.cnt, h.same = ws, we, cnt, same
    h.reset = we * 1000000 - now_us
    h.allowed = cnt + h.need <= h.limit
    if algo == 't' then
      h.reserve, h.ttl = hold_terms(ARGV[i])
      if h.reserve > 0 then
        local sum, _, hst = holds(KEYS[i], now_us)
        if (hst.owed or 0) > 0 then
          -- Answers whose gateway died: charged what they had passed (hold.go), whatever
          -- this decision; then counted as any use of the window.
          local rk, rspec, rst = KEYS[i], ARGV[i], hst
` + reapBlock + `
          cnt, same = count(KEYS[i], ws, win)
          h.cnt, h.same = cnt, same
        end
        h.held, h.hst = sum, hst
        h.allowed = h.limit - cnt - sum >= h.reserve
      end
    end
  elseif algo == 'c' then
    -- Streams: the live slots are the count.
    h.reserve, h.ttl = hold_terms(ARGV[i])
    local _, live, hst = holds(KEYS[i], now_us)
    h.cnt, h.hst = live, hst
    h.allowed = live < h.limit
  else
    -- A bucket of base 0 admits nothing; its emission interval is only reported.
    local em = period_of(win) / math.max(base, 1)
    local tat = tonumber(read('GET', KEYS[i])) or gnow
    tat = math.max(tat, gnow)
    h.em, h.tat, h.used = em, tat, held(tat, gnow, em)
    h.allowed = h.used + h.need <= h.limit
  end
  if not h.allowed and not shadow then ok = 0 end
  st[i] = h
end

local out = {tostring(ok)}
local crossed = {}
for i = 1, n do
  local h = st[i]
  local a, rem, reset, retry, ws = 0, 0, 0, 0, 0
  if h.allowed then a = 1 end
  local charge = ok == 1 and h.allowed and h.u > 0
  if h.algo == 't' then
    -- A tokens limit is only checked here; Debit counts the answer's tokens later. With a
    -- reserve, it holds the reserve until Settle.
    ws, reset = h.ws, h.reset
    rem = math.max(h.limit - h.cnt - (h.held or 0), 0)
    if charge and h.reserve > 0 and hid ~= '' then
      local keep_ms = h.we * 1000
      if not h.same then
        -- A new window: the ended one's count is kept first (history_redis.go).
        local win, keep = win_keep(ARGV[i])
        local carry = keep_past(KEYS[i], win, keep, h.ws)
        redis.call('HSET', KEYS[i], 's', h.ws, 'n', carry)
        keep_ms = kept_until(h.we, win, keep) * 1000
      end
      hold(KEYS[i], hid, h.reserve, h.ttl, now_us, h.hst, keep_ms)
      rem = math.max(rem - h.reserve, 0)
    elseif h.hst and h.hst.dead then
      store(KEYS[i], h.hst) -- drop the expired holds read
    end
    if not h.allowed then
      retry = reset
      -- Denied for the holds of answers in flight, which come back as they end.
      if h.reserve > 0 and h.cnt + h.reserve <= h.limit then retry = 1000000 end
      -- The tenant's first refusal in the window, as for requests below (the thresholds of
      -- tokens are crossed by the charges, chargeLua).
      if h.mk and h.mk.e and h.same and redis.call('HSETNX', KEYS[i], 'e', 1) == 1 then
        crossed[i], h.seen, h.seen_held = 256, h.cnt, h.held or 0
      end
    end
  elseif h.algo == 'c' then
    rem = math.max(h.limit - h.cnt, 0)
    if charge and hid ~= '' then
      hold(KEYS[i], hid, 1, h.ttl, now_us, h.hst, 0)
      rem = math.max(rem - 1, 0)
    elseif h.hst.dead then
      store(KEYS[i], h.hst) -- drop the expired holds read
    end
    if not h.allowed then retry = 1000000 end
  elseif h.algo == 'f' then
    ws, reset = h.ws, h.reset
    if charge then
      if h.same then
        redis.call('HINCRBY', KEYS[i], 'n', h.u)
      else
        local win, keep = win_keep(ARGV[i])
        local carry = keep_past(KEYS[i], win, keep, h.ws)
        redis.call('HSET', KEYS[i], 's', h.ws, 'n', carry + h.u)
        keep_until(KEYS[i], kept_until(h.we, win, keep) * 1000, now_us) -- never shorter (w: its window may have been longer)
      end
      rem = h.limit - h.cnt - h.u
      -- Thresholds and the forecast: the first decision of the window to reach one reports
      -- it, and marks it in the counter, so that it is reported once.
      if h.mk then
        local bits = cross(KEYS[i], h.mk, h.cnt + h.u, h.limit, h.same, h.ws, h.we, now_us)
        if bits > 0 then crossed[i], h.seen = bits, h.cnt + h.u end
      end
    else
      rem = math.max(h.limit - h.cnt, 0)
      if not h.allowed then retry = reset end
      -- The tenant's first refusal in the window (e marks it), in a window the counter holds.
      if not h.allowed and h.mk and h.mk.e and h.same and redis.call('HSETNX', KEYS[i], 'e', 1) == 1 then
        -- The count as usage read-back shows it (quotaStateLua's state).
        crossed[i], h.seen = (crossed[i] or 0) + 256, math.min(h.cnt, math.max(h.limit, h.rlimit))
      end
    end
  else
    if charge then
      local new_tat = h.tat + h.em * h.u
      local reset_after = new_tat - gnow
      if reset_after > 0 then
        redis.call('SET', KEYS[i], new_tat, 'EX', math.ceil(reset_after))
      end
      rem = h.limit - h.used - h.u
      reset = math.floor(reset_after * 1000000)
    elseif h.allowed then
      -- Denied by another limit, or a check: report the current state, nothing consumed.
      rem = h.limit - h.used
      reset = math.floor((h.tat - gnow) * 1000000)
    else
      rem = math.max(h.limit - h.used, 0) -- 0 but for a hit of several units
      reset = math.floor((h.tat - gnow) * 1000000)
      retry = math.floor((h.tat - gnow - (h.limit - h.need) * h.em) * 1000000)
    end
  end
  -- The override's end bounds the wait: the plan's limit applies again then (and while an
  -- override of 0 stands, nothing is admitted before it).
  if not h.allowed and h.ends > 0 and (h.limit == 0 or h.ends - now_us < retry) then
    retry = h.ends - now_us
  end
  if h.q then
    out[#out + 1] = string.format('%d %d %d %d %d %d %d', a, rem, reset, retry, ws, h.limit, h.base)
  else
    out[#out + 1] = string.format('%d %d %d %d %d', a, rem, reset, retry, ws)
  end
end
-- What was crossed, after every key's fields: "<key position> <bits> <used> <held>", none
-- most of the time.
for i = 1, n do
  if crossed[i] then out[#out + 1] = string.format('%d %d %d %d', i, crossed[i], st[i].seen, st[i].seen_held or 0) end
end
return table.concat(out, ' ')
`

// giveBackLua undoes one unit taken by takeLua (a refund, and the Redis Cluster
// compensation when another slot group denied; the units of a spec's u<n> for a hit that took
// several). ARGV[2i-1] is the spec, ARGV[2i] the window
// start the unit was counted in: the unit goes back to that window, in the counter's s and
// n while they still hold it, else in history while the window is kept (a later window
// moved it there); a window no longer kept has nothing to give back.
const giveBackLua = windowLua + holdLua + `
local t = redis.call('TIME')
local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
local gnow = (tonumber(t[1]) - jan_1_2017) + (tonumber(t[2]) / 1000000)
for i = 1, #KEYS do
  local algo, limit, win, _, _, u = parse(ARGV[2 * i - 1])
  if algo == 'f' then
    -- The window the unit was counted in: the current one, kept, or carried into the current
    -- one by a change of the limit's window (keep_past).
    local v = redis.call('HMGET', KEYS[i], 's', 'n', 'w')
    local ws = tonumber(ARGV[2 * i])
    if ws and v[3] and tonumber(v[1]) ~= ws and bounds(v[3], ws) == tonumber(v[1])
        and redis.call('HEXISTS', KEYS[i], ARGV[2 * i]) == 0 then
      ws = tonumber(v[1])
    end
    if tonumber(v[1]) == ws then
      local n = tonumber(v[2]) or 0
      if n > 0 then redis.call('HINCRBY', KEYS[i], 'n', -math.min(u, n)) end
    elseif ws then
      give_back_kept(KEYS[i], v[3] or win, keep_of(ARGV[2 * i - 1]), ws, tonumber(t[1]), u)
    end
  elseif (algo == 't' or algo == 'c') and string.sub(ARGV[2 * i], 1, 1) == '@' then
    -- A hold or slot of the decision (see hold.go).
    local f = 'h:' .. string.sub(ARGV[2 * i], 2)
    unhold(KEYS[i], f, read('HGET', KEYS[i], f), now_us)
  elseif algo == 'g' then
    local tat = tonumber(redis.call('GET', KEYS[i]))
    if tat then
      local new_tat = tat - u * period_of(win) / limit
      if new_tat <= gnow then
        redis.call('DEL', KEYS[i])
      else
        redis.call('SET', KEYS[i], new_tat, 'KEEPTTL')
      end
    end
  end
end
return 1
`

// quotaStateLua is a tenant's standing on one limit: state(ckey, qkey, algo, limit, win, sec,
// usec) returns its allowance, use and grants (the use as usage read-back shows it), its
// base, the override's end (µs, 0: none) and when the counter resets (µs).
const quotaStateLua = holdLua + `
local function state(ckey, qkey, algo, limit, win, sec, usec)
  local base, g, ends = quota(qkey, limit, win, sec, sec * 1000000 + usec)
  local allow = allowance(base, g)
  local used, reset
  if algo == 'c' then -- streams: the slots in use (see hold.go)
    local _, live = holds(ckey, sec * 1000000 + usec)
    used, reset = live, sec * 1000000 + usec
  elseif algo == 'f' or algo == 't' then
    local ws, we = bounds(win, sec)
    used = count(ckey, ws, win)
    reset = we * 1000000
  else
    local gnow = (sec - jan_1_2017) + (usec / 1000000)
    local em = period_of(win) / math.max(base, 1)
    local tat = math.max(tonumber(read('GET', ckey)) or gnow, gnow)
    used = held(tat, gnow, em)
    reset = math.floor((tat + jan_1_2017) * 1000000)
  end
  used = math.max(used, 0)
  -- Tokens may run past the limit (answers in flight when it ran out); requests never run
  -- past the allowance, but for a count made before an override lowered it (shown up to the
  -- limit).
  if algo ~= 't' then used = math.min(used, math.max(allow, limit)) end
  return allow, used, g, base, ends, reset
end
`

// usageLua reads the counter KEYS[1] with spec ARGV[1], and the tenant's quota KEYS[2],
// without writing. Reply: "<used> <remaining> <reset unix µs> <allowance> <granted>
// <override end µs, 0: none> <base> <reserved>", remaining net of the live holds.
const usageLua = windowLua + quotaLua + quotaStateLua + `
local t = redis.call('TIME')
local algo, limit, win = parse(ARGV[1])
local reserve = hold_terms(ARGV[1])
local allow, used, g, base, ends, reset = state(KEYS[1], KEYS[2], algo, limit, win, tonumber(t[1]), tonumber(t[2]))
local reserved = 0
if algo == 't' and reserve > 0 then
  reserved = holds(KEYS[1], tonumber(t[1]) * 1000000 + tonumber(t[2]))
end
return string.format('%d %d %d %d %d %d %d %d', used, math.max(allow - used - reserved, 0), reset, allow, g, ends, base, reserved)
`

// debitLua adds tokens to tokens limits ('t' specs) in their current windows (chargeLua).
// ARGV[3i-2] is the spec of KEYS[i], ARGV[3i-1] the amount, ARGV[3i] the allowance the
// admitting decision applied (0: unknown). Other specs are ignored. Reply: per key, "<bits
// crossed> <window start> <count> <held>" (0 0 0 0 for a key not charged).
const debitLua = windowLua + holdLua + chargeLua + `
local t = redis.call('TIME')
local sec = tonumber(t[1])
local now_us = sec * 1000000 + tonumber(t[2])
local out = {}
for i = 1, #KEYS do
  local spec = ARGV[3 * i - 2]
  local algo = parse(spec)
  local n = tonumber(ARGV[3 * i - 1])
  local bits, ws, used, held = 0, 0, 0, 0
  if algo == 't' and n and n > 0 then
    bits, ws, used, held = charge(KEYS[i], spec, n, sec, now_us, tonumber(ARGV[3 * i]) or 0)
  end
  out[i] = string.format('%d %d %d %d', bits, ws, used, held)
end
return table.concat(out, ' ')
`

// nodePrelude turns takeLua and giveBackLua into their Redis Cluster variants, which decide
// all keys of one node in one call although the keys hash to different slots. A script's
// declared keys must share a slot, so only the first key is declared (it routes the call to
// its node); all keys arrive in ARGV[2..n+1] with n = ARGV[1], followed by the usual
// arguments. The allow-cross-slot-keys flag (Redis 7) lets the script touch the node's other
// slots; a key of another node would fail the call, never be miscounted.
const nodePrelude = `#!lua flags=allow-cross-slot-keys
local nkeys = tonumber(ARGV[1])
local KEYS, ARGV = {unpack(ARGV, 2, nkeys + 1)}, {unpack(ARGV, nkeys + 2)}
`

// Scripts are immutable after construction, so sharing them is not mutable
// package state.
var (
	takeScript         = redis.NewScript(takeLua)
	giveBackScript     = redis.NewScript(giveBackLua)
	usageScript        = redis.NewScript(usageLua)
	debitScript        = redis.NewScript(debitLua)
	quotaScript        = redis.NewScript(quotaOpLua)
	nodeTakeScript     = redis.NewScript(nodeTakeLua)
	nodeGiveBackScript = redis.NewScript(nodePrelude + giveBackLua)
)
