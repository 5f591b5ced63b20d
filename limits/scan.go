package limits

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// scanCount is the COUNT hint of one SCAN call: each call walks about this many keys of the
// keyspace, which keeps every call to a millisecond or so, however many tenants there are.
const scanCount = 1000

// Scan implements Store. It walks the keyspace of every master with SCAN MATCH (never KEYS):
// each call returns at once, so Redis is never blocked for long, and the keys found are read
// back in one pipeline per batch. Counters are interpreted at the node's own TIME.
func (r *Redis) Scan(ctx context.Context, rule *Rule, resolve func(id string) *Rule, visit func(id string, u Usage)) error {
	cr, err := r.rules.get(rule)
	if err != nil {
		return fmt.Errorf("limits: scan: %w", err)
	}
	if !cr.enabled {
		return nil
	}
	// On a Cluster the masters are scanned concurrently: resolve and visit are serialised.
	var mu sync.Mutex
	node := func(ctx context.Context, c redis.Cmdable) error {
		now, err := c.Time(ctx).Result()
		if err != nil {
			return fmt.Errorf("limits: scan: time: %w", err)
		}
		return scanNode(ctx, c, cr, now, func(id string, raw rawCounter) {
			mu.Lock()
			defer mu.Unlock()
			if u, ok := raw.usage(rule, resolve(id), now); ok {
				visit(id, u)
			}
		})
	}
	if r.cluster != nil {
		return r.cluster.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return node(ctx, c) })
	}
	return node(ctx, r.client)
}

// rawCounter is a counter as stored: a fixed window's start and count, or a GCRA TAT, with
// its tenant's run-time quota.
type rawCounter struct {
	ws, n int64
	win   Window // the window ws is of (the hash's w; zero when it has none)
	tat   float64
	q     quotaTerms
	holds map[string]memHold // a limit with holds (see hold.go)
	// past holds the kept windows of a counter whose window is not the limit's (a change of
	// window since its last unit): a change back counts those that began inside the current
	// window (memEntry.current), and a read must too.
	past []pastUse
}

func scanNode(ctx context.Context, c redis.Cmdable, cr *compiled, now time.Time, found func(string, rawCounter)) error {
	match := globEscape(cr.keyPre) + "*"
	// Each algorithm has keys of its own (algoKeyPart); the type filter also skips a key of
	// another type that someone wrote under the limit's names, which would fail the read.
	typ := "hash"
	if cr.snap.Algorithm == GCRA {
		typ = "string"
	}
	var cursor uint64
	for {
		keys, next, err := c.ScanType(ctx, cursor, match, scanCount, typ).Result()
		if err != nil {
			return fmt.Errorf("limits: scan: %w", err)
		}
		if len(keys) > 0 {
			if err := readCounters(ctx, c, cr, keys, found); err != nil {
				return err
			}
		}
		if next == 0 {
			return nil
		}
		cursor = next
	}
}

// readCounters reads one SCAN batch in one pipeline. Keys that expired in between are skipped.
func readCounters(ctx context.Context, c redis.Cmdable, cr *compiled, keys []string, found func(string, rawCounter)) error {
	pipe := c.Pipeline()
	rd := queueCounters(ctx, pipe, cr, keys)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("limits: scan: read: %w", err)
	}
	// Fixed counters in another window are read whole once the batch is read: their kept
	// windows may count in the current one (memEntry.current).
	var other []wholeCounter
	for i, k := range keys {
		id, ok := idOf(cr.keyPre, k)
		if !ok {
			continue
		}
		raw, ok := rd.counter(i, cr)
		if !ok {
			continue
		}
		if rd.fixed && !rd.withHolds && otherWindow(raw.win, cr.snap.Window) {
			other = append(other, wholeCounter{id, k, raw})
			continue
		}
		found(id, raw)
	}
	if len(other) == 0 {
		return nil
	}
	return readKept(ctx, c, other, found)
}

// counterReads are the reads of one SCAN batch, by key: the hash whole (a limit with holds),
// its s, n and w (a fixed window) or the TAT (GCRA), and the tenant's quota (nil for a key
// that is not a counter's).
type counterReads struct {
	fixed, withHolds bool
	all              []*redis.MapStringStringCmd
	hm               []*redis.SliceCmd
	gets             []*redis.StringCmd
	quotas           []*redis.SliceCmd
}

// queueCounters queues the reads of keys, a SCAN batch of cr's counters, on pipe.
func queueCounters(ctx context.Context, pipe redis.Pipeliner, cr *compiled, keys []string) counterReads {
	rd := counterReads{
		fixed:     cr.snap.Algorithm == Fixed,
		withHolds: holds(&cr.snap),
		all:       make([]*redis.MapStringStringCmd, 0, len(keys)),
		hm:        make([]*redis.SliceCmd, 0, len(keys)),
		gets:      make([]*redis.StringCmd, 0, len(keys)),
		quotas:    make([]*redis.SliceCmd, len(keys)),
	}
	for i, k := range keys {
		switch {
		case rd.withHolds:
			rd.all = append(rd.all, pipe.HGetAll(ctx, k))
		case rd.fixed:
			rd.hm = append(rd.hm, pipe.HMGet(ctx, k, "s", "n", "w"))
		default:
			rd.gets = append(rd.gets, pipe.Get(ctx, k))
		}
		if id, ok := idOf(cr.keyPre, k); ok {
			rd.quotas[i] = pipe.HMGet(ctx, cr.quotaPre+id+"}", "ov", "ox", "g", "ge")
		}
	}
	return rd
}

// counter interprets the reads of the i-th key, a counter of cr; false when it expired
// between SCAN and the read.
func (rd *counterReads) counter(i int, cr *compiled) (rawCounter, bool) {
	var raw rawCounter
	switch {
	case rd.withHolds:
		raw = rawOfHolds(rd.all[i].Val())
		if otherWindow(raw.win, cr.snap.Window) {
			raw.past = keptOf(rd.all[i].Val())
		}
	case rd.fixed:
		v := rd.hm[i].Val()
		if len(v) != 3 {
			return raw, false
		}
		ws, err1 := strconv.ParseInt(str(v[0]), 10, 64)
		n, err2 := strconv.ParseInt(str(v[1]), 10, 64)
		if err1 != nil || err2 != nil {
			return raw, false
		}
		raw.ws, raw.n = ws, n
		raw.win, _ = windowOfSpec(str(v[2]))
	default:
		tat, err := strconv.ParseFloat(rd.gets[i].Val(), 64)
		if err != nil {
			return raw, false
		}
		raw.tat = tat
	}
	raw.q = quotaOfFields(rd.quotas[i].Val())
	return raw, true
}

// wholeCounter is a fixed counter of a SCAN batch whose window is not the limit's.
type wholeCounter struct {
	id, key string
	raw     rawCounter
}

// readKept reads the hashes of other in one pipeline for their kept windows, and hands the
// counters to found.
func readKept(ctx context.Context, c redis.Cmdable, other []wholeCounter, found func(string, rawCounter)) error {
	pipe := c.Pipeline()
	hashes := make([]*redis.MapStringStringCmd, len(other))
	for j, o := range other {
		hashes[j] = pipe.HGetAll(ctx, o.key)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return fmt.Errorf("limits: scan: read: %w", err)
	}
	for j, o := range other {
		o.raw.past = keptOf(hashes[j].Val())
		found(o.id, o.raw)
	}
	return nil
}

// keptOf reads the kept windows of a counter hash (its fields named by a window's start):
// usesOf's, less the current window it ends with.
func keptOf(h map[string]string) []pastUse {
	uses := usesOf(flatten(h))
	return uses[:len(uses)-1]
}

// flatten turns a hash read as a map into HGETALL's reply: fields and values in turn.
func flatten(h map[string]string) []any {
	kv := make([]any, 0, 2*len(h))
	for f, v := range h {
		kv = append(kv, f, v)
	}
	return kv
}

// rawOfHolds reads the hash of a limit with holds: s and n (a tokens limit's window), and the
// holds "h:<hold>" = "<amount> <expiry µs>".
func rawOfHolds(h map[string]string) rawCounter {
	var raw rawCounter
	raw.ws, _ = strconv.ParseInt(h["s"], 10, 64)
	raw.n, _ = strconv.ParseInt(h["n"], 10, 64)
	raw.win, _ = windowOfSpec(h["w"])
	for f, v := range h {
		id, ok := strings.CutPrefix(f, "h:")
		if !ok {
			continue
		}
		var hd memHold
		if _, err := fmt.Sscanf(v, "%d %d", &hd.amount, &hd.expires); err == nil {
			if raw.holds == nil {
				raw.holds = map[string]memHold{}
			}
			raw.holds[id] = hd
		}
	}
	return raw
}

// quotaOfFields reads the fields ov, ox, g, ge of a quota hash (absent ones are 0).
func quotaOfFields(v []any) quotaTerms {
	var q quotaTerms
	if len(v) != 4 {
		return q
	}
	for i, p := range []*int64{&q.ov, &q.ox, &q.g, &q.ge} {
		*p, _ = strconv.ParseInt(str(v[i]), 10, 64)
	}
	return q
}

func str(v any) string {
	s, _ := v.(string)
	return s
}

// idOf cuts the id out of "<keyPre><id>}".
func idOf(keyPre, key string) (string, bool) {
	if !strings.HasPrefix(key, keyPre) || !strings.HasSuffix(key, "}") || len(key) == len(keyPre)+1 {
		return "", false
	}
	return key[len(keyPre) : len(key)-1], true
}

// globEscape quotes the characters SCAN MATCH treats as patterns.
func globEscape(s string) string {
	var b strings.Builder
	for _, c := range s {
		if strings.ContainsRune(`*?[]\`, c) {
			b.WriteByte('\\')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// usage interprets a counter found under base's keys with the rule that applies to its id.
// ok is false when nothing is in use, or when that rule counts under other keys.
func (c rawCounter) usage(base, r *Rule, now time.Time) (Usage, bool) {
	if r == nil || r.Limit <= 0 || r.Window != base.Window || r.Algorithm != base.Algorithm || r.Unit != base.Unit {
		return Usage{}, false
	}
	mt := timeOf(now)
	// Interpreted as the in-process store's entry is: one arithmetic for both stores.
	e := memEntry{ws: c.ws, n: c.n, win: c.win, tat: c.tat, expires: math.MaxInt64, holds: c.holds, past: c.past}
	u := e.usage(&compiled{snap: *r, period: r.Window.Nominal().Seconds()}, c.q, mt)
	return u, u.Used > 0 || u.Reserved > 0
}

// Scan implements Store. Entries are copied under each shard's lock and interpreted outside
// it, so a scan holds no lock while resolve runs.
func (m *Memory) Scan(ctx context.Context, rule *Rule, resolve func(id string) *Rule, visit func(id string, u Usage)) error {
	cr, err := m.rules.get(rule)
	if err != nil {
		return fmt.Errorf("limits: scan: %w", err)
	}
	if !cr.enabled {
		return nil
	}
	now := m.now()
	nowUS := now.UnixMicro()
	type found struct {
		id  string
		raw rawCounter
	}
	var batch []found
	for i := range m.shards {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("limits: scan: %w", err)
		}
		sh := &m.shards[i]
		batch = batch[:0]
		sh.mu.Lock()
		for k, e := range sh.m {
			if k.rule == cr.keyPre && e.expires > nowUS {
				raw := rawCounter{ws: e.ws, n: e.n, win: e.win, tat: e.tat, holds: maps.Clone(e.holds)}
				if otherWindow(e.win, cr.snap.Window) {
					raw.past = slices.Clone(e.past)
				}
				batch = append(batch, found{k.id, raw})
			}
		}
		sh.mu.Unlock()
		for _, f := range batch {
			f.raw.q, _ = m.quotas.get(rule, f.id)
			if u, ok := f.raw.usage(rule, resolve(f.id), now); ok {
				visit(f.id, u)
			}
		}
	}
	return nil
}

// Scan implements Store. Reads for operators do not go through the breaker: they neither
// open it nor are refused by it, and the caller's context bounds them.
func (g *Guard) Scan(ctx context.Context, r *Rule, resolve func(id string) *Rule, visit func(id string, u Usage)) error {
	return g.s.Scan(ctx, r, resolve, visit)
}
