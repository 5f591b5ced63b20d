package limits

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// A billing export lists every tenant of a window sorted by id, and streams: the gateway's
// memory must not grow with the tenants. SCAN returns keys in hash order, so the Redis store
// sorts in Redis: the scan adds each tenant to a sorted set of its own ("<id> <count>"
// members of one score, kept in byte order), which the export then reads a page at a time
// and deletes. The in-process store holds every count in memory anyway; it sorts a packed
// copy of the ids.

// Tenants is the tenants of one window of a limit, sorted by id, read one at a time.
type Tenants interface {
	// Len is how many there are.
	Len() int
	// Next returns the next tenant; ok is false after the last.
	Next(ctx context.Context) (id string, used int64, ok bool, err error)
	// Close frees what the listing holds (its sorted set in Redis), whatever ctx's state: a
	// cancelled ctx (the client went away) does not stop it; only its values are used.
	Close(ctx context.Context) error
}

// exportPage is how many tenants one read of the sorted set returns (and one ZADD adds).
const exportPage = 1000

// ExportTTL bounds the life of an export's sorted set whose gateway died before deleting it;
// an export must end well within it (its pages are read from the set).
const ExportTTL = 15 * time.Minute

// exportDeleteTimeout bounds the deletion of an export's sorted set. It runs on a context of
// its own, not the caller's: an export ends early because its client went away (the request's
// context is cancelled then) or its time ran out, and its set must go all the same.
const exportDeleteTimeout = 5 * time.Second

// ExportSorted lists the tenants with use of rule r in the window starting at start for
// which keep says yes, sorted by id. It reads the store whole before it returns.
func (m *Memory) ExportSorted(ctx context.Context, r *Rule, start int64, keep func(id string) bool) (Tenants, error) {
	var p packedIDs
	if err := m.Export(ctx, r, start, func(id string, used int64) {
		if keep(id) {
			p.add(id, used)
		}
	}); err != nil {
		return nil, err
	}
	p.sort()
	return &p, nil
}

// ExportSorted lists the tenants with use of rule r in the window starting at start for
// which keep says yes, sorted by id, through a sorted set that Close deletes (and that
// expires after ExportTTL). It reads every master whole before it returns.
func (r *Redis) ExportSorted(ctx context.Context, rule *Rule, start int64, keep func(id string) bool) (Tenants, error) {
	t := &redisTenants{c: r.client, key: r.rules.prefix + "export:" + rand.Text()}
	batch := make([]redis.Z, 0, exportPage)
	var ferr error
	flush := func() {
		if len(batch) == 0 || ferr != nil {
			return
		}
		pipe := r.client.Pipeline()
		pipe.ZAdd(ctx, t.key, batch...)
		pipe.Expire(ctx, t.key, ExportTTL)
		if _, err := pipe.Exec(ctx); err != nil {
			ferr = fmt.Errorf("limits: export: sort: %w", err)
		}
		t.n += len(batch)
		batch = batch[:0]
	}
	err := r.Export(ctx, rule, start, func(id string, used int64) {
		if !keep(id) { // Export visits one at a time
			return
		}
		batch = append(batch, redis.Z{Member: id + " " + strconv.FormatInt(used, 10)})
		if len(batch) == exportPage {
			flush()
		}
	})
	flush()
	if err == nil {
		err = ferr
	}
	if err != nil {
		_ = t.Close(ctx)
		return nil, err
	}
	return t, nil
}

// redisTenants pages through an export's sorted set in byte order of its members.
type redisTenants struct {
	c    redis.UniversalClient
	key  string
	n    int
	page []string
	i    int
	last string // the last member read: the next page starts after it
	done bool
}

func (t *redisTenants) Len() int { return t.n }

func (t *redisTenants) Next(ctx context.Context) (string, int64, bool, error) {
	if t.i == len(t.page) {
		if t.done {
			return "", 0, false, nil
		}
		lo := "-"
		if t.last != "" {
			lo = "(" + t.last
		}
		page, err := t.c.ZRangeByLex(ctx, t.key, &redis.ZRangeBy{Min: lo, Max: "+", Count: exportPage}).Result()
		if err != nil {
			return "", 0, false, fmt.Errorf("limits: export: read: %w", err)
		}
		t.done = len(page) < exportPage
		if len(page) == 0 {
			return "", 0, false, nil
		}
		t.page, t.i, t.last = page, 0, page[len(page)-1]
	}
	m := t.page[t.i]
	t.i++
	cut := strings.LastIndexByte(m, ' ')
	used, err := strconv.ParseInt(m[cut+1:], 10, 64)
	if cut < 0 || err != nil {
		return "", 0, false, fmt.Errorf("limits: export: %w %q", errMalformedReply, m)
	}
	return m[:cut], used, true, nil
}

// Close deletes the sorted set, even when ctx is cancelled or past its deadline (see
// exportDeleteTimeout).
func (t *redisTenants) Close(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), exportDeleteTimeout)
	defer cancel()
	if err := t.c.Unlink(ctx, t.key).Err(); err != nil {
		return fmt.Errorf("limits: export: delete %s: %w", t.key, err)
	}
	return nil
}

// packedIDs holds ids and counts in three flat slices (no string header or allocation per
// tenant), sorted by id.
type packedIDs struct {
	bytes []byte
	ends  []int32 // end of id i in bytes
	used  []int64
	order []int32
	next  int
}

func (p *packedIDs) add(id string, used int64) {
	p.bytes = append(p.bytes, id...)
	p.ends = append(p.ends, int32(len(p.bytes)))
	p.used = append(p.used, used)
}

func (p *packedIDs) id(i int32) []byte {
	start := int32(0)
	if i > 0 {
		start = p.ends[i-1]
	}
	return p.bytes[start:p.ends[i]]
}

func (p *packedIDs) sort() {
	p.order = make([]int32, len(p.ends))
	for i := range p.order {
		p.order[i] = int32(i)
	}
	slices.SortFunc(p.order, func(a, b int32) int { return bytes.Compare(p.id(a), p.id(b)) })
}

func (p *packedIDs) Len() int { return len(p.ends) }

func (p *packedIDs) Next(context.Context) (string, int64, bool, error) {
	if p.next == len(p.order) {
		return "", 0, false, nil
	}
	k := p.order[p.next]
	p.next++
	return string(p.id(k)), p.used[k], true, nil
}

func (p *packedIDs) Close(context.Context) error { return nil }
