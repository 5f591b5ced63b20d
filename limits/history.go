package limits

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"slices"
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
//	gw:assistant_per_org:{acme} = {s: 1764090000, n: 17, w: h, 1764086400: 250, 1764082800: 3}
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
// oldest (keep_past), s, n, w and m (after a change of window), a tokens limit's hs, hc and
// hx, and one h:<id> per answer in flight (hold.go): 400 + 1 + 4 + 3 = 408 fields leave room
// for 104 answers in flight per tenant at once. Past that the tenant's hash (only it) becomes a hashtable.
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
	// Limit is the limit of the tenant's plan as configured now (run-time grants and
	// overrides aside), 0 when the limit counts another unit now; the store leaves it to the
	// caller, which knows the plans.
	Limit int64
	// Current marks the window in progress (the first of a history), the one run-time quota
	// applies to: Allowance is the tenant's allowance in force in it, as usage read-back
	// shows it (the limit or the override in force, plus the window's grants), Granted the
	// window's grants and Override the override in force (nil: none). The caller clears
	// Current for the counters of a unit the limit no longer counts: no allowance applies.
	Current            bool
	Allowance, Granted int64
	Override           *OverrideTerms
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
	keep := keepOf(r)
	out := make([]int64, 0, keep+1)
	for k := 0; k <= keep; k++ {
		out = append(out, r.Window.Shift(ws, -k))
	}
	return out
}

// historyOf builds a tenant's history at now (Unix µs) from a lookup of each window's count,
// and its run-time quota q for the current window.
func historyOf(r *Rule, q quotaTerms, nowUS int64, used func(ws int64) int64) []WindowUse {
	starts := Kept(r, nowUS/1e6)
	out := make([]WindowUse, len(starts))
	for i, ws := range starts {
		out[i] = WindowUse{Start: time.Unix(ws, 0).UTC(), End: time.Unix(r.Window.Shift(ws, 1), 0).UTC(), Used: used(ws)}
	}
	cur := &out[0]
	base, g, ends := q.terms(r.Limit, nowUS, cur.End.Unix())
	cur.Current, cur.Allowance, cur.Granted = true, allowance(base, g), g
	if ends > 0 {
		cur.Override = &OverrideTerms{Value: base, Expires: time.UnixMicro(ends).UTC()}
	}
	return out
}

// pastUse is one ended window of an in-process entry.
type pastUse struct{ ws, n int64 }

// keepOf is the number of ended windows r keeps (0 for GCRA, which has none).
func keepOf(r *Rule) int {
	if r.Algorithm == Fixed {
		return r.History
	}
	return 0
}

// current is e's count in the window of w starting at ws, and whether e is in that window
// already. An entry that counts in another window (the limit's window changed since) is not,
// but its count carries over when the window it counted began inside ws's window, with the
// kept windows that began there too (a change and a change back; as count in script.go).
func (e *memEntry) current(w Window, ws int64) (n int64, same bool) {
	if otherWindow(e.win, w) {
		if from, _ := w.boundsUnix(e.ws); from == ws && e.ws != 0 {
			return e.n + e.pastIn(w, ws, false), false
		}
		return 0, false
	}
	if e.ws == ws {
		return e.n, true
	}
	return 0, false
}

// roll moves e to the window [ws, we) of r, keeping the ended window's count when r keeps
// history, and sets how long e lives (the caller holds the lock).
func (e *memEntry) roll(r *Rule, ws, we int64) { e.rollIn(r.Window, keepOf(r), ws, we) }

// rollIn is roll in window w keeping keep ended windows (keep_past in history_redis.go): an
// entry that counted in another window carries its count over when its window began inside
// ws's, else keeps it under its own start (readers bill it by byWindow).
func (e *memEntry) rollIn(w Window, keep int, ws, we int64) {
	changed := otherWindow(e.win, w)
	if changed || e.ws != ws {
		var carry int64
		live := e.expires != 0
		switch {
		case changed:
			if from, _ := w.boundsUnix(e.ws); from == ws {
				carry = e.n + e.pastIn(w, ws, true)
			} else if keep > 0 && e.n > 0 && live {
				e.addPast(e.ws, e.n)
			}
		case keep > 0 && e.n > 0 && e.ws < ws && live:
			// Added to a kept window of the same start, if a change of window left one.
			e.addPast(e.ws, e.n)
		}
		cut := w.Shift(ws, -keep)
		for len(e.past) > 0 && e.past[len(e.past)-1].ws < cut {
			e.past = e.past[:len(e.past)-1]
		}
		e.ws, e.n = ws, carry
		e.reached, e.exhausted, e.forecast = 0, false, false // the marks belong to the window that ended
	}
	e.win = w
	// Never sooner than before: the entry may hold holds of answers in flight (hold_memory.go).
	e.expires = max(e.expires, w.Shift(we, keep)*1e6)
}

// pastIn sums the kept windows that began inside the window of w starting at ws, and with
// drop removes them (kept_in in script.go).
func (e *memEntry) pastIn(w Window, ws int64, drop bool) int64 {
	_, we := w.boundsUnix(ws)
	inside := func(p pastUse) bool { return p.ws >= ws && p.ws < we }
	var sum int64
	for _, p := range e.past {
		if inside(p) {
			sum += p.n
		}
	}
	if drop {
		e.past = slices.DeleteFunc(e.past, inside)
	}
	return sum
}

// otherWindow says a counter that counts in window counted is not in window w: the limit's
// window changed since its last unit (zero: a counter from before windows were recorded).
func otherWindow(counted, w Window) bool { return !counted.IsZero() && counted != w }

// addPast adds n to the kept window starting at ws, keeping past newest first.
func (e *memEntry) addPast(ws, n int64) {
	i := 0
	for i < len(e.past) && e.past[i].ws > ws {
		i++
	}
	if i < len(e.past) && e.past[i].ws == ws {
		e.past[i].n += n
		return
	}
	e.past = slices.Insert(e.past, i, pastUse{ws, n})
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
	if e := sh.m[key]; e != nil && e.expires > now.us {
		if _, same := e.current(r.Window, ws); !same {
			e.roll(r, ws, we)
		}
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
	var uses []pastUse
	sh.mu.Lock()
	if e := sh.m[key]; e != nil && e.expires > now.us {
		uses = append(append(uses, pastUse{e.ws, e.n}), e.past...)
	}
	sh.mu.Unlock()
	q, _ := m.quotas.get(r, id)
	by := byWindow(r.Window, uses)
	return historyOf(r, q, now.us, func(ws int64) int64 { return by[ws] }), nil
}

// byWindow sums counts by the window of w containing each one's start: windows of another
// length (counted before a change of the limit's window, or under a plan with another window)
// are billed to the window of w that contains their start, as keep_past re-keys them.
func byWindow(w Window, uses []pastUse) map[int64]int64 {
	by := make(map[int64]int64, len(uses))
	for _, u := range uses {
		if u.n > 0 {
			ws, _ := w.boundsUnix(u.ws)
			by[ws] += u.n
		}
	}
	return by
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
			if n := e.usedIn(r.Window, start); n > 0 {
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

// usedIn is the entry's count of the window of w starting at ws: what it counted in the
// windows that began in it (byWindow).
func (e *memEntry) usedIn(w Window, ws int64) int64 {
	_, we := w.boundsUnix(ws)
	var n int64
	if e.ws >= ws && e.ws < we {
		n += e.n
	}
	for _, p := range e.past {
		if p.ws >= ws && p.ws < we {
			n += p.n
		}
	}
	return n
}

// giveBack takes one unit off the window of r starting at ws, as giveBackLua does: the
// current count while the entry is still in that window, else the window's kept count while
// r keeps it at Unix second now; never below 0 (the caller holds the lock).
func (e *memEntry) giveBack(r *Rule, ws, now int64) {
	w := r.Window
	if !e.win.IsZero() {
		w = e.win
		// Carried into the current window by a change of the limit's window (rollIn).
		if from, _ := w.boundsUnix(ws); e.ws != ws && from == e.ws && !slices.ContainsFunc(e.past, func(p pastUse) bool { return p.ws == ws }) {
			ws = e.ws
		}
	}
	if e.ws == ws {
		e.n = max(e.n-1, 0)
		return
	}
	cur, _ := w.boundsUnix(now)
	if !keepsHistory(r) || ws >= cur || ws < w.Shift(cur, -r.History) {
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
