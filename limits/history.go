package limits

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"strconv"
	"time"
)

// Usage history: a fixed-window limit keeps the counts of its last Rule.History windows after
// they end, so operators can bill and plan ("what did acme use each day this month?").
//
// The counts are the counters the limiter keeps anyway. When a tenant's first unit of a new
// window arrives, the take script (or the debit script, for tokens) moves the ended window's
// count into a field of the same hash named by the window's start, drops fields older than
// the kept range and lets the hash live until its newest window leaves the range:
//
//	gw:assistant_per_org:hour:{acme} = {s: 1764090000, n: 17, 1764086400: 250, 1764082800: 3}
//
// So the request path keeps its one script call (the move happens inside it, once per tenant
// and window), the history lives in the key's own slot (any Cluster layout), and /usage/top
// still scans one key per tenant. In process, the entry keeps the same list (lost with the
// process).

// MaxHistory bounds Rule.History where Redis keeps a tenant's hash compact. Redis stores a
// hash of at most hash-max-listpack-entries fields (512 by default) as a listpack: a kept
// window, its start and count stored as integers, costs about 9 bytes for request-sized
// counts and 13 for token-sized ones (below 2^31: 4-byte integers, as window starts are until
// 2038). One field more and the hash becomes a hashtable for good, about 70 bytes per window.
// At most, the hash holds the kept windows, the one a window end adds before it drops the
// oldest (keep_past), s and n, a tokens limit's hs, hc and hx, and one h:<id> per answer in
// flight (hold.go): 400 + 1 + 2 + 3 = 406 fields leave room for 106 answers in flight per
// tenant at once. Past that the tenant's hash (only it) becomes a hashtable.
const MaxHistory = 400

// DefaultHistory is the number of ended windows a limit keeps unless configured: 48 hours,
// 35 days, 13 months, 10 windows of a duration.
func DefaultHistory(w Window) int {
	if w.IsZero() { // no window (a limit that counts something else): nothing to keep
		return 0
	}
	switch w.kind {
	case kindHour:
		return 48
	case kindDay:
		return 35
	case kindMonth:
		return 13
	}
	return 10
}

// ErrNoHistory is wrapped by errors about a limit that keeps no windows (a GCRA limit).
var ErrNoHistory = errors.New("limits: the limit keeps no windows")

// ErrUnknownWindow is wrapped by errors about a window that is not kept (ended longer ago
// than the limit's history, or not begun).
var ErrUnknownWindow = errors.New("limits: window not kept")

// WindowUse is one window of a tenant's history.
type WindowUse struct {
	Start, End time.Time
	Used       int64
	Limit      int64 // the limit of the tenant's plan (run-time grants and overrides aside)
}

// TenantHistory is one tenant's use of one limit, window by window, newest first.
type TenantHistory struct {
	Limit, ID, Unit string
	Windows         []WindowUse
}

// ExportRow is one tenant's use of a limit in one window.
type ExportRow struct {
	ID          string
	Used, Limit int64
	// Plan is the tenant's plan ("" for the default limits); Label and Org describe a
	// registered key (limits that count by key).
	Plan, Label, Org string
}

// Export is every tenant with use of one limit in one window, sorted by id. Rows yields them
// one at a time, so a writer can stream them, and ends with an error if the store fails
// meanwhile; Close frees what the listing holds (call it once done).
type Export struct {
	Limit, Unit string
	Start, End  time.Time
	Tenants     int
	Rows        iter.Seq2[ExportRow, error]
	Close       func() error
}

// HistoryStore reads the windows kept for history.
type HistoryStore interface {
	// History returns the tenant's use of rule r in the current window and each kept ended
	// window, newest first, one entry per window (Used 0 where nothing was counted).
	History(ctx context.Context, r *Rule, id string) ([]WindowUse, error)
	// Export calls visit for each tenant with use of rule r in the window starting at start
	// (Unix seconds), in no particular order and never concurrently. It reads in bounded
	// batches like Scan, every master of a Cluster.
	Export(ctx context.Context, r *Rule, start int64, visit func(id string, used int64)) error
	// ExportSorted is Export sorted by id, of the tenants keep says yes to, read one at a
	// time without the caller holding them all (see export.go).
	ExportSorted(ctx context.Context, r *Rule, start int64, keep func(id string) bool) (Tenants, error)
	// Clock is the store's time, which decides the current window.
	Clock(ctx context.Context) (time.Time, error)
}

var (
	_ HistoryStore = (*Memory)(nil)
	_ HistoryStore = (*Redis)(nil)
)

// keepSpec is what a rule adds to its script spec: " k<n>", the number of ended windows kept
// (a word of its own, last, so other optional words may come before it).
func keepSpec(r *Rule) string {
	if !keepsHistory(r) {
		return ""
	}
	return " k" + strconv.Itoa(r.History)
}

// keepsHistory says whether r keeps ended windows: a fixed window with a history.
func keepsHistory(r *Rule) bool {
	return r.Algorithm == Fixed && r.History > 0 && !r.Window.IsZero()
}

// Shift returns the start of the window k windows after the one starting at ws (before, for
// a negative k). ws must be a window start.
func (w Window) Shift(ws int64, k int) int64 {
	if w.kind != kindMonth {
		s, e := w.boundsUnix(ws)
		return ws + int64(k)*(e-s)
	}
	t := time.Unix(ws, 0).UTC()
	return t.AddDate(0, k, 0).Unix()
}

// IsStart reports whether Unix second s starts a window.
func (w Window) IsStart(s int64) bool {
	ws, _ := w.boundsUnix(s)
	return ws == s
}

// Kept lists the windows a rule keeps at Unix second now, newest (the current one) first:
// their starts.
func Kept(r *Rule, now int64) []int64 {
	ws, _ := r.Window.boundsUnix(now)
	keep := 0
	if r.Algorithm == Fixed {
		keep = r.History
	}
	out := make([]int64, 0, keep+1)
	for k := 0; k <= keep; k++ {
		out = append(out, r.Window.Shift(ws, -k))
	}
	return out
}

// historyOf builds a tenant's history at Unix second now from a lookup of each window's count.
func historyOf(r *Rule, now int64, used func(ws int64) int64) []WindowUse {
	starts := Kept(r, now)
	out := make([]WindowUse, len(starts))
	for i, ws := range starts {
		out[i] = WindowUse{Start: time.Unix(ws, 0).UTC(), End: time.Unix(r.Window.Shift(ws, 1), 0).UTC(), Used: used(ws)}
	}
	return out
}

// pastUse is one ended window of an in-process entry.
type pastUse struct{ ws, n int64 }

// roll moves e to the window [ws, we) of r, keeping the ended window's count when r keeps
// history, and sets how long e lives (the caller holds the lock).
func (e *memEntry) roll(r *Rule, ws, we int64) {
	keep := 0
	if r.Algorithm == Fixed {
		keep = r.History
	}
	if e.ws != ws {
		if keep > 0 && e.n > 0 && e.ws < ws && e.expires != 0 {
			e.past = append([]pastUse{{e.ws, e.n}}, e.past...)
		}
		cut := r.Window.Shift(ws, -keep)
		for len(e.past) > 0 && e.past[len(e.past)-1].ws < cut {
			e.past = e.past[:len(e.past)-1]
		}
		e.ws, e.n = ws, 0
	}
	// Never sooner than before: the entry may hold holds of answers in flight (hold_memory.go).
	e.expires = max(e.expires, r.Window.Shift(we, keep)*1e6)
}

// rollEnded moves the ended window of the counter of (cr, id) into its history, as the
// tenant's next unit would: a run-time action (quota_memory.go) must not lose that window's
// count, which sits in the current one until then.
func (m *Memory) rollEnded(cr *compiled, id string, now memTime) {
	r := &cr.snap
	if !keepsHistory(r) {
		return
	}
	key := memKey{cr.keyPre, id}
	sh := &m.shards[m.shardOf(key)]
	ws, we := r.Window.boundsUnix(now.sec)
	sh.mu.Lock()
	if e := sh.m[key]; e != nil && e.expires > now.us && e.ws < ws {
		e.roll(r, ws, we)
	}
	sh.mu.Unlock()
}

// History implements HistoryStore.
func (m *Memory) History(ctx context.Context, r *Rule, id string) ([]WindowUse, error) {
	cr, err := m.historyRule(ctx, r)
	if err != nil {
		return nil, err
	}
	now := m.clock()
	key := memKey{cr.keyPre, id}
	sh := &m.shards[m.shardOf(key)]
	var cur pastUse
	var past []pastUse
	sh.mu.Lock()
	if e := sh.m[key]; e != nil && e.expires > now.us {
		cur, past = pastUse{e.ws, e.n}, append(past, e.past...)
	}
	sh.mu.Unlock()
	return historyOf(r, now.sec, func(ws int64) int64 {
		if ws == cur.ws {
			return cur.n
		}
		for _, p := range past {
			if p.ws == ws {
				return p.n
			}
		}
		return 0
	}), nil
}

// Export implements HistoryStore. Counts are copied under each shard's lock and visited
// outside it.
func (m *Memory) Export(ctx context.Context, r *Rule, start int64, visit func(id string, used int64)) error {
	cr, err := m.historyRule(ctx, r)
	if err != nil {
		return err
	}
	nowUS := m.clock().us
	type found struct {
		id string
		n  int64
	}
	var batch []found
	for i := range m.shards {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("limits: export: %w", err)
		}
		sh := &m.shards[i]
		batch = batch[:0]
		sh.mu.Lock()
		for k, e := range sh.m {
			if k.rule != cr.keyPre || e.expires <= nowUS {
				continue
			}
			if n := e.usedIn(start); n > 0 {
				batch = append(batch, found{k.id, n})
			}
		}
		sh.mu.Unlock()
		for _, f := range batch {
			visit(f.id, f.n)
		}
	}
	return nil
}

// usedIn is the entry's count of the window starting at ws.
func (e *memEntry) usedIn(ws int64) int64 {
	if e.ws == ws {
		return e.n
	}
	for _, p := range e.past {
		if p.ws == ws {
			return p.n
		}
	}
	return 0
}

// giveBack takes one unit off the window of r starting at ws, as giveBackLua does: the
// current count while the entry is still in that window, else the window's kept count while
// r keeps it at Unix second now; never below 0 (the caller holds the lock).
func (e *memEntry) giveBack(r *Rule, ws, now int64) {
	if e.ws == ws {
		e.n = max(e.n-1, 0)
		return
	}
	cur, _ := r.Window.boundsUnix(now)
	if !keepsHistory(r) || ws >= cur || ws < r.Window.Shift(cur, -r.History) {
		return
	}
	for i, p := range e.past {
		if p.ws != ws {
			continue
		}
		if p.n <= 1 { // roll keeps only windows with use, as the Redis hash does
			e.past = append(e.past[:i], e.past[i+1:]...)
		} else {
			e.past[i].n--
		}
		return
	}
}

// Clock implements HistoryStore.
func (m *Memory) Clock(context.Context) (time.Time, error) { return m.now(), nil }

func (m *Memory) historyRule(ctx context.Context, r *Rule) (*compiled, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("limits: history: %w", err)
	}
	return checkHistoryRule(&m.rules, r)
}

func checkHistoryRule(c *ruleCache, r *Rule) (*compiled, error) {
	cr, err := c.get(r)
	if err != nil {
		return nil, fmt.Errorf("limits: history: %w", err)
	}
	if r.Algorithm != Fixed {
		return nil, fmt.Errorf("limits: history of %s: %w (a GCRA limit has no windows)", r.Name, ErrNoHistory)
	}
	return cr, nil
}
