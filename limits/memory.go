package limits

import (
	"context"
	"fmt"
	"hash/maphash"
	"maps"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// memShards spreads keys over independent locks so unrelated requests do not
// contend on one mutex.
const memShards = 64

// sweepEvery is how many Takes pass between lazy sweeps of one shard; with 64
// shards every shard is swept every 64*sweepEvery Takes.
const sweepEvery = 256

// Memory is an in-process Store with the same semantics as Redis (fixed
// windows and GCRA, all-or-nothing), using its own clock. It suits a single
// gateway instance and tests. Expired windows are removed lazily: every
// sweepEvery Takes one shard is swept, so no goroutine needs stopping.
type Memory struct {
	now   func() time.Time
	seed  maphash.Seed
	rules ruleCache
	ops   atomic.Uint64
	// onCrossed is told what charges of tokens crossed (WithMemoryCrossings); nil: nobody asks.
	onCrossed func(Crossed)
	shards    [memShards]memShard
	quotas    memQuotas
}

type memShard struct {
	mu sync.Mutex
	m  map[memKey]*memEntry
}

type memKey struct {
	rule string // compiled.keyPre: "<name>:{", "<name>:tokens:{", "<name>:<window>:gcra:{", ...
	id   string
}

type memEntry struct {
	// past are the ended windows kept for history, newest first (fixed windows; history.go).
	past []pastUse

	ws, n   int64   // fixed: window start (Unix s) and count
	win     Window  // fixed: the window ws is of (the Redis hash's w); zero until one began
	tat     float64 // gcra: theoretical arrival time, seconds since 2017 (as redis_rate)
	expires int64   // Unix µs after which the entry is garbage
	// reached and exhausted mark what decisions reported in the window ws (thresholds.go).
	reached   uint8
	exhausted bool
	forecast  bool
	// holds are the live holds (tokens limits with a reserve) or slots (streams limits) by
	// decision (see hold.go).
	holds map[string]memHold
}

// MemoryOption configures NewMemory.
type MemoryOption func(*Memory)

// WithClock makes the store read time from now (tests).
func WithClock(now func() time.Time) MemoryOption {
	return func(m *Memory) { m.now = now }
}

// NewMemory returns an in-process store.
func NewMemory(opts ...MemoryOption) *Memory {
	m := &Memory{now: time.Now, seed: maphash.MakeSeed()}
	for i := range m.shards {
		m.shards[i].m = make(map[memKey]*memEntry)
	}
	m.quotas.m = map[quotaKey]*quota{}
	m.quotas.audit.max = DefaultAuditMax
	for _, o := range opts {
		o(m)
	}
	return m
}

const jan2017 = 1483228800 // GCRA time base of redis_rate (see takeLua)

// memHit is the per-hit working state of one Take.
type memHit struct {
	cr    *compiled
	rule  *Rule // the caller's (eachLocked), which Crossed reports
	key   memKey
	shard int
	e     *memEntry
	ok    bool
	units int64   // what the hit takes of a requests limit (Hit.Units; 0: a check)
	cnt   int64   // fixed
	same  bool    // fixed: the entry counts in the current window already
	ws    int64   // fixed
	we    int64   // fixed
	em    float64 // gcra
	tat   float64 // gcra
	used  int64   // gcra: units the bucket holds (held)
	held  int64   // tokens with a reserve: the live holds
	q     quotaTerms
	allow int64 // the allowance: limit or override, plus grants (see quota.go)
	base  int64 // the limit or override the grants add to
	ends  int64 // the override's end, Unix µs; 0: none
}

// memTime is one reading of the store's clock in the units the algorithms use.
type memTime struct {
	sec int64   // Unix seconds
	us  int64   // Unix microseconds
	g   float64 // GCRA time: seconds since 2017, as redis_rate (see takeLua)
}

func (m *Memory) clock() memTime { return timeOf(m.now()) }

func timeOf(now time.Time) memTime {
	sec, usec := now.Unix(), int64(now.Nanosecond()/1000)
	return memTime{sec: sec, us: sec*1e6 + usec, g: float64(sec-jan2017) + float64(usec)/1e6}
}

// Take implements Store. It locks the shards of all hits in index order (no
// deadlock between concurrent Takes), checks every limit, then consumes all
// or nothing (shadow hits: when admitted, those with room; see Decision).
func (m *Memory) Take(ctx context.Context, hits []Hit, d *Decision) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("limits: take: %w", err)
	}
	d.reset(len(hits))
	var buf [8]memHit
	var lockBuf [8]int
	hs, locks, err := m.prepare(hits, d, buf[:0], lockBuf[:0])
	if err != nil {
		return fmt.Errorf("limits: take: %w", err)
	}
	now := m.clock()
	hid := ""
	if needsHold(hits) {
		hid = newHold()
	}
	for _, s := range locks {
		m.shards[s].mu.Lock()
	}
	allOK := true
	for i := range hs {
		ok := m.check(&hs[i], now)
		allOK = allOK && (ok || hs[i].cr.snap.Shadow)
	}
	for i := range hs {
		m.settle(&hs[i], &d.Results[i], allOK, now, hid)
	}
	for _, s := range locks {
		m.shards[s].mu.Unlock()
	}
	d.Allowed = allOK
	if allOK {
		d.Hold = hid
	}
	if n := m.ops.Add(1); n%sweepEvery == 0 {
		m.sweep(int(n/sweepEvery)%memShards, now.us)
	}
	return nil
}

// prepare compiles the hits' rules into hs and lists, sorted, the shards to lock.
func (m *Memory) prepare(hits []Hit, d *Decision, hs []memHit, locks []int) ([]memHit, []int, error) {
	for i := range hits {
		cr, err := m.rules.get(hits[i].Rule)
		if err != nil {
			return nil, nil, err
		}
		d.Results[i].Rule = hits[i].Rule
		h := memHit{cr: cr, key: memKey{cr.keyPre, hits[i].ID}, units: hits[i].units()}
		if cr.enabled {
			h.shard = m.shardOf(h.key)
			locks = insertSorted(locks, h.shard)
		}
		hs = append(hs, h)
	}
	m.quotas.lookup(hs)
	return hs, locks, nil
}

// check reads h's counter and says whether its allowance has room (the caller holds the
// lock).
func (m *Memory) check(h *memHit, now memTime) bool {
	if !h.cr.enabled {
		h.ok = true
		return true
	}
	h.e = m.shards[h.shard].m[h.key]
	lim := h.cr.snap.Limit
	if h.cr.snap.Unit == Streams {
		return m.checkHolds(h, now)
	}
	if h.cr.snap.Algorithm == Fixed {
		h.ws, h.we = h.cr.snap.Window.boundsUnix(now.sec)
		h.terms(lim, now)
		if h.e != nil {
			h.cnt, h.same = h.e.current(h.cr.snap.Window, h.ws)
		}
		if h.cr.snap.Unit == Tokens && h.cr.snap.Reserve > 0 {
			return m.checkHolds(h, now)
		}
		h.ok = h.cnt+h.needs() <= h.allow
		return h.ok
	}
	if h.q.g != 0 { // grants belong to the window aligned as a fixed one
		h.ws, h.we = h.cr.snap.Window.boundsUnix(now.sec)
	}
	h.terms(lim, now)
	h.em = h.cr.period / float64(max(h.base, 1)) // a bucket of 0 admits nothing (see allow)
	h.tat = now.g
	if h.e != nil && h.e.expires > now.us {
		h.tat = math.Max(h.e.tat, now.g)
	}
	h.used = held(h.tat, now.g, h.em)
	h.ok = h.used+h.needs() <= h.allow
	return h.ok
}

// needs is how many units must fit for h to be admitted (Hit.needs).
func (h *memHit) needs() int64 { return max(h.units, 1) }

// terms settles the allowance h is decided against (h.we set for fixed windows and grants).
func (h *memHit) terms(lim int64, now memTime) {
	var g int64
	h.base, g, h.ends = h.q.terms(lim, now.us, h.we)
	h.allow = allowance(h.base, g)
}

// settle charges h when the decision admitted and its limit had room, and fills its result
// (the caller holds the lock).
func (m *Memory) settle(h *memHit, r *Result, allOK bool, now memTime, hid string) {
	r.Allowed = h.ok
	r.Limit, r.base = h.cr.snap.Limit, h.cr.snap.Limit
	switch {
	case !h.cr.enabled:
		return
	case holds(&h.cr.snap):
		m.settleHolds(h, r, allOK && h.ok, hid, now)
	case h.cr.snap.Unit == Tokens: // only checked: Debit counts the tokens later
		r.Reset = time.Duration(h.we*1e6-now.us) * time.Microsecond
		r.WindowStart = h.ws
		r.Remaining = max(h.allow-h.cnt, 0)
		if !h.ok {
			r.RetryAfter = r.Reset
			h.exhaust(r)
		}
	case h.cr.snap.Algorithm == Fixed:
		m.settleFixed(h, r, allOK && h.ok && h.units > 0, now)
	default:
		m.settleGCRA(h, r, allOK && h.ok && h.units > 0, now)
	}
	r.Limit, r.base = h.allow, h.base
	if !h.ok {
		r.RetryAfter = untilEnd(r.RetryAfter, h.allow, h.ends, now.us)
	}
}

func (m *Memory) settleFixed(h *memHit, r *Result, charge bool, now memTime) {
	r.Reset = time.Duration(h.we*1e6-now.us) * time.Microsecond
	r.WindowStart = h.ws
	if !charge {
		r.Remaining = max(h.allow-h.cnt, 0)
		if !h.ok {
			r.RetryAfter = r.Reset
			h.exhaust(r)
		}
		return
	}
	e := m.entry(h)
	e.roll(&h.cr.snap, h.ws, h.we) // a new window starts without marks (keep_past's x, e and f)
	e.n += h.units
	r.Remaining = h.allow - e.n
	if marks(&h.cr.snap) {
		if r.Crossed = e.cross(&h.cr.snap, h.allow, h.ws, h.we, now.us); r.Crossed != 0 {
			r.Used = e.n
		}
	}
}

// exhaust reports in r a refusal that is the tenant's first in a window the entry holds
// (takeLua's e), for a limit reporting exhaustion (Rule.Exhausted).
func (h *memHit) exhaust(r *Result) {
	if s := &h.cr.snap; marks(s) && s.Exhausted && !s.Shadow && h.same && !h.e.exhausted {
		h.e.exhausted = true
		r.Crossed |= CrossedExhausted
		r.Used, r.Held = capUsed(h.cnt, h.allow, s), h.held // as usage read-back shows them
	}
}

func (m *Memory) settleGCRA(h *memHit, r *Result, charge bool, now memTime) {
	switch {
	case charge:
		newTAT := h.tat + h.em*float64(h.units)
		e := m.entry(h)
		e.tat = newTAT
		e.expires = now.us + int64(math.Ceil(newTAT-now.g))*1e6
		r.Remaining = h.allow - h.used - h.units
		r.Reset = secs(newTAT - now.g)
	case h.ok: // denied by another limit, or a check: the current state, nothing consumed
		r.Remaining = h.allow - h.used
		r.Reset = secs(h.tat - now.g)
	default:
		r.Remaining = max(h.allow-h.used, 0) // 0 but for a hit of several units
		r.Reset = secs(h.tat - now.g)
		r.RetryAfter = secs(h.tat - now.g - float64(h.allow-h.needs())*h.em)
	}
}

func (m *Memory) shardOf(k memKey) int {
	var h maphash.Hash
	h.SetSeed(m.seed)
	h.WriteString(k.rule)
	h.WriteString(k.id)
	return int(h.Sum64() % memShards)
}

// entry returns h's entry, creating it (caller holds the shard lock).
func (m *Memory) entry(h *memHit) *memEntry {
	if h.e == nil {
		h.e = &memEntry{}
		m.shards[h.shard].m[h.key] = h.e
	}
	return h.e
}

func (m *Memory) sweep(shard int, nowUS int64) {
	s := &m.shards[shard]
	s.mu.Lock()
	for k, e := range s.m {
		if e.expires <= nowUS {
			delete(s.m, k)
		}
	}
	s.mu.Unlock()
}

// Len returns the number of stored counters (tests, metrics).
func (m *Memory) Len() int {
	n := 0
	for i := range m.shards {
		m.shards[i].mu.Lock()
		n += len(m.shards[i].m)
		m.shards[i].mu.Unlock()
	}
	return n
}

// Usage implements Store.
func (m *Memory) Usage(ctx context.Context, r *Rule, id string) (Usage, error) {
	if err := ctx.Err(); err != nil {
		return Usage{}, fmt.Errorf("limits: usage: %w", err)
	}
	cr, err := m.rules.get(r)
	if err != nil {
		return Usage{}, fmt.Errorf("limits: usage: %w", err)
	}
	if !cr.enabled {
		return Usage{Name: r.Name, Limit: r.Limit, Unit: r.Unit, Reserves: r.Unit == Tokens && r.Reserve > 0}, nil
	}
	q, _ := m.quotas.get(r, id)
	now := m.clock()
	return m.entryOf(cr, id).usage(cr, q, now), nil
}

// entryOf copies the counter of cr for id; one that expires at MinInt64 when there is none.
func (m *Memory) entryOf(cr *compiled, id string) memEntry {
	key := memKey{cr.keyPre, id}
	sh := &m.shards[m.shardOf(key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if p := sh.m[key]; p != nil {
		e := *p
		e.holds = maps.Clone(p.holds) // read after the lock is released
		return e
	}
	return memEntry{expires: math.MinInt64}
}

// usage interprets a counter of cr (e: its entry, expires at MinInt64 when there is none)
// with the tenant's quota q at now.
func (e memEntry) usage(cr *compiled, q quotaTerms, now memTime) Usage {
	r := &cr.snap
	u := Usage{Name: r.Name, Unit: r.Unit, Reserves: r.Unit == Tokens && r.Reserve > 0}
	ws, we := r.Window.boundsUnix(now.sec)
	base, g, ends := q.terms(r.Limit, now.us, we)
	u.Limit, u.Granted = allowance(base, g), g
	if ends > 0 {
		u.Override = &OverrideTerms{Value: base, Expires: time.UnixMicro(ends).UTC()}
	}
	switch {
	case r.Unit == Streams: // the slots in use (see hold.go)
		for _, h := range e.holds {
			if h.expires > now.us {
				u.Used++
			}
		}
		u.Reset = time.UnixMicro(now.us).UTC()
	case r.Algorithm == Fixed:
		if e.expires > now.us {
			u.Used, _ = e.current(r.Window, ws)
		}
		u.Reset = time.Unix(we, 0).UTC()
		if r.Unit == Tokens && r.Reserve > 0 {
			u.Reserved = e.held(now.us)
		}
	default:
		tat := now.g
		if e.expires > now.us && e.tat > now.g {
			tat = e.tat
		}
		u.Used = held(tat, now.g, cr.period/float64(max(base, 1)))
		u.Reset = time.UnixMicro(int64(math.Floor((tat + jan2017) * 1e6))).UTC()
	}
	u.Used = capUsed(u.Used, u.Limit, r)
	u.Remaining = max(u.Limit-u.Used-u.Reserved, 0)
	return u
}

// gcraSlack and held mirror takeLua's: a GCRA bucket whose TAT is t holds (t - gnow) / em
// units, a difference below gcraSlack seconds being the doubles' rounding (every time that
// enters is a whole microsecond), not time.
const gcraSlack = 2.5e-7

func held(t, gnow, em float64) int64 {
	return max(int64(math.Ceil((t-gnow-gcraSlack)/em)), 0)
}

func secs(f float64) time.Duration {
	return time.Duration(math.Floor(f*1e6)) * time.Microsecond
}

// insertSorted adds v to the sorted set s.
func insertSorted(s []int, v int) []int {
	i := 0
	for i < len(s) && s[i] < v {
		i++
	}
	if i < len(s) && s[i] == v {
		return s
	}
	s = append(s, 0)
	copy(s[i+1:], s[i:])
	s[i] = v
	return s
}
