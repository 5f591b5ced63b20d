package limits

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/docsgate/gateway/internal/redistest"
)

// historyUsed lists a history's counts, newest first.
func historyUsed(t *testing.T, s HistoryStore, r *Rule, id string) []int64 {
	t.Helper()
	h, err := s.History(context.Background(), r, id)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]int64, len(h))
	for i, w := range h {
		out[i] = w.Used
	}
	return out
}

// admitN takes n units of r for id, all of which must be admitted.
func admitN(t *testing.T, s Store, r *Rule, id string, n int) {
	t.Helper()
	if got, last := takeN(t, s, n, Hit{Rule: r, ID: id}); got != n {
		t.Fatalf("take %s: %d of %d admitted, last %+v", id, got, n, last)
	}
}

// historyBackends are the backends of the history tests: coalescing changes nothing of what a
// counter keeps, so its variants are left out.
func historyBackends(t *testing.T) []backend {
	var out []backend
	for _, b := range backends(t, true) {
		if b.name != "redis-coalesced" && b.name != "cluster-coalesced" {
			out = append(out, b)
		}
	}
	return out
}

// Calendar months in process, on a clock the test moves: a month without use is listed with
// 0, a month past history is dropped when the next one begins, a quota reset forgets the
// current month only, and tokens debited keep their months too.
func TestHistoryMemoryMonths(t *testing.T) {
	now := time.Date(2024, 1, 20, 10, 0, 0, 0, time.UTC)
	var mu sync.Mutex
	m := NewMemory(WithClock(func() time.Time { mu.Lock(); defer mu.Unlock(); return now }))
	at := func(y int, mo time.Month, d int) {
		mu.Lock()
		now = time.Date(y, mo, d, 12, 0, 0, 0, time.UTC)
		mu.Unlock()
	}
	r := rule(t, "per_org", 100, "month", Fixed)
	r.History = 2
	tok := &Rule{Name: "tokens_per_org", Limit: 1000, Window: r.Window, Unit: Tokens, History: 2}
	ctx := context.Background()

	admitN(t, m, r, "acme", 3)
	if err := m.Debit(ctx, []Hit{{Rule: tok, ID: "acme"}}, 40); err != nil {
		t.Fatal(err)
	}
	at(2024, 2, 29)
	admitN(t, m, r, "acme", 2)
	if got := historyUsed(t, m, r, "acme"); !slices.Equal(got, []int64{2, 3, 0}) {
		t.Fatalf("February: %v, want [2 3 0]", got)
	}
	at(2024, 4, 1)
	admitN(t, m, r, "acme", 1)
	if err := m.Debit(ctx, []Hit{{Rule: tok, ID: "acme"}}, 7); err != nil {
		t.Fatal(err)
	}
	h, err := m.History(ctx, r, "acme")
	if err != nil {
		t.Fatal(err)
	}
	var starts []string
	for _, w := range h {
		starts = append(starts, w.Start.Format("2006-01-02")+".."+w.End.Format("01-02"))
	}
	if fmt.Sprint(starts) != "[2024-04-01..05-01 2024-03-01..04-01 2024-02-01..03-01]" {
		t.Fatalf("windows %v", starts)
	}
	if got := historyUsed(t, m, r, "acme"); !slices.Equal(got, []int64{1, 0, 2}) {
		t.Fatalf("April: %v, want [1 0 2] (January past history)", got)
	}
	if got := historyUsed(t, m, tok, "acme"); !slices.Equal(got, []int64{7, 0, 0}) {
		t.Fatalf("tokens in April: %v, want [7 0 0]", got)
	}
	jan := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC).Unix()
	feb := time.Date(2024, 2, 1, 0, 0, 0, 0, time.UTC).Unix()
	exported := func(start int64) map[string]int64 {
		out := map[string]int64{}
		if err := m.Export(ctx, r, start, func(id string, n int64) { out[id] = n }); err != nil {
			t.Fatal(err)
		}
		return out
	}
	if got := exported(feb); fmt.Sprint(got) != "map[acme:2]" {
		t.Fatalf("export of February: %v", got)
	}
	if got := exported(jan); len(got) != 0 {
		t.Fatalf("export of January (dropped): %v", got)
	}
	if _, err := m.Reset(ctx, r, "acme", Who{Actor: "t", Reason: "test"}); err != nil {
		t.Fatal(err)
	}
	if got := historyUsed(t, m, r, "acme"); !slices.Equal(got, []int64{0, 0, 2}) {
		t.Fatalf("after a reset: %v, want [0 0 2]", got)
	}
	// A GCRA limit keeps no windows.
	if _, err := m.History(ctx, rule(t, "g", 10, "hour", GCRA), "acme"); err == nil {
		t.Fatal("history of a GCRA limit answered")
	}
}

// The take script's window arithmetic agrees with Window.Shift (calendar months across
// years and leap days included), and keep_past moves the ended window aside and drops what
// is past history, on a real redis-server.
func TestHistoryLua(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	shift := redis.NewScript(windowLua + `return shift(ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]))`)
	for _, win := range []string{"month", "hour", "day", "7s"} {
		w := mustWindow(t, win)
		for _, day := range []time.Time{
			time.Date(2024, 1, 31, 5, 0, 0, 0, time.UTC), time.Date(2024, 2, 29, 23, 0, 0, 0, time.UTC),
			time.Date(2023, 12, 1, 0, 0, 0, 0, time.UTC), time.Date(2025, 3, 15, 0, 0, 0, 0, time.UTC),
		} {
			ws, _ := w.boundsUnix(day.Unix())
			for _, k := range []int{-13, -12, -2, -1, 0, 1, 2, 13} {
				got, err := shift.Run(ctx, c, nil, w.luaSpec(), ws, k).Int64()
				if want := w.Shift(ws, k); err != nil || got != want {
					t.Fatalf("%s from %s by %d: Lua %d %v, Go %d", win, time.Unix(ws, 0).UTC(), k, got, err, want)
				}
			}
		}
	}

	keep := redis.NewScript(windowLua + `keep_past(KEYS[1], 'h', 3, tonumber(ARGV[1])) return redis.call('HGETALL', KEYS[1])`)
	w := mustWindow(t, "hour")
	ws := int64(1_700_002_800) // an hour's start
	prev := w.Shift(ws, -1)
	key := "gw:h:hour:{acme}"
	args := []any{"s", prev, "n", 5, "w", "h"}
	for k := 1; k <= 4; k++ {
		args = append(args, strconv.FormatInt(w.Shift(prev, -k), 10), k)
	}
	c.HSet(ctx, key, args...)
	got, err := keep.Run(ctx, c, []string{key}, ws).StringSlice()
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for i := 0; i < len(got); i += 2 {
		m[got[i]] = got[i+1]
	}
	want := map[string]string{"s": strconv.FormatInt(prev, 10), "n": "5", "w": "h",
		strconv.FormatInt(prev, 10): "5", strconv.FormatInt(w.Shift(ws, -2), 10): "1", strconv.FormatInt(w.Shift(ws, -3), 10): "2"}
	if fmt.Sprint(m) != fmt.Sprint(want) {
		t.Fatalf("after keep_past: %v, want %v", m, want)
	}
}

// Both stores keep the same history: consecutive 1 s windows on Redis (standalone and
// Cluster) and in process, compared with what was taken.
func TestHistoryStores(t *testing.T) {
	t.Parallel() // servers of its own, and no latency bound
	for _, b := range historyBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			s := b.stores(t, 1)[0]
			hs, ok := s.(HistoryStore)
			if !ok {
				t.Fatalf("%T keeps no history", s)
			}
			r := rule(t, "per_org", 100, "1s", Fixed)
			r.History = 2
			ids := idsOnDistinctNodes(3)
			var want [][]int64 // per window, per id
			for k := range 4 {
				alignWindow(t, time.Second, 700*time.Millisecond)
				if k > 0 {
					time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 20*time.Millisecond)))
				}
				row := make([]int64, len(ids))
				for i, id := range ids {
					row[i] = int64((k+i)%3) + 1
					admitN(t, s, r, id, int(row[i]))
				}
				want = append(want, row)
			}
			for i, id := range ids {
				got := historyUsed(t, hs, r, id)
				w := []int64{want[3][i], want[2][i], want[1][i]}
				if !slices.Equal(got, w) {
					t.Errorf("%s: %v, want %v", id, got, w)
				}
			}
			now, err := hs.Clock(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			prev := now.Truncate(time.Second).Add(-time.Second).Unix()
			got := map[string]int64{}
			if err := hs.Export(context.Background(), r, prev, func(id string, n int64) { got[id] = n }); err != nil {
				t.Fatal(err)
			}
			for i, id := range ids {
				if got[id] != want[2][i] {
					t.Errorf("export of the previous window: %v, want %v for %v", got, want[2], ids)
				}
			}
		})
	}
}

// An export lists its tenants sorted by id across pages of the sorted set (ids that are
// prefixes of others, punctuation), only those keep says yes to, and leaves nothing behind in
// Redis once closed: in process, on Redis and on a Cluster (every master read).
func TestExportSorted(t *testing.T) {
	t.Parallel() // servers of its own, and no latency bound
	for _, b := range historyBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			s := b.stores(t, 1)[0]
			hs := s.(HistoryStore)
			r := rule(t, "per_org", 100, "hour", Fixed)
			r.History = 2
			if _, end := r.Window.Bounds(time.Now()); time.Until(end) < time.Minute {
				time.Sleep(time.Until(end) + time.Second) // the tenants all in one hour
			}
			var want []string
			for i := range 2500 {
				id := fmt.Sprintf("t%d", i) // t1 < t10 < t100 < t1000 < t1001 ...
				if i%5 == 0 {
					id += ".x"
				}
				admitN(t, s, r, id, 1+i%3)
				if i%7 != 0 {
					want = append(want, id+" "+strconv.Itoa(1+i%3))
				}
			}
			slices.Sort(want)
			ws, _ := r.Window.boundsUnix(time.Now().Unix())
			ts, err := hs.ExportSorted(context.Background(), r, ws, func(id string) bool {
				n, _ := strconv.Atoi(strings.TrimSuffix(id[1:], ".x"))
				return n%7 != 0
			})
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for {
				id, used, ok, err := ts.Next(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				if !ok {
					break
				}
				got = append(got, id+" "+strconv.FormatInt(used, 10))
			}
			if ts.Len() != len(want) || !slices.Equal(got, want) {
				t.Fatalf("export: %d tenants (Len %d), want %d; first %v, want %v", len(got), ts.Len(), len(want), got[:min(5, len(got))], want[:5])
			}
			if err := ts.Close(context.Background()); err != nil {
				t.Fatal(err)
			}
			if b.redis != nil {
				var left []string
				var mu sync.Mutex // ForEachMaster calls at once
				scan := func(ctx context.Context, c *redis.Client) error {
					keys, err := c.Keys(ctx, "*export:*").Result()
					mu.Lock()
					defer mu.Unlock()
					left = append(left, keys...)
					return err
				}
				if cl, ok := b.redis.(*redis.ClusterClient); ok {
					err = cl.ForEachMaster(context.Background(), scan)
				} else {
					err = scan(context.Background(), b.redis.(*redis.Client))
				}
				if err != nil || len(left) > 0 {
					t.Fatalf("left behind after Close: %v %v", left, err)
				}
			}
		})
	}
}

// A tokens limit with a reserve keeps its history like any fixed window: the ended window's
// tokens are kept when a hold opens the next window (the take script), when a settle does
// (the settle script), and in process by the same roll. Holds live beside the kept windows in
// the counter's hash and never count as use.
func TestHistoryOfReserveTokens(t *testing.T) {
	t.Parallel() // servers of its own, and no latency bound
	for _, b := range historyBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			s := b.stores(t, 1)[0]
			hs := s.(HistoryStore)
			r := tokenRule(t, "tok_hist", 1000, "1s")
			r.Reserve, r.ReserveTTL, r.History = 100, 10*time.Second, 3
			hits := []Hit{{Rule: r, ID: "acme"}}
			take := func() string {
				t.Helper()
				var d Decision
				if err := s.Take(ctx, hits, &d); err != nil || !d.Allowed || d.Hold == "" {
					t.Fatalf("take: %v %+v", err, d)
				}
				return d.Hold
			}
			settle := func(hold string, n int64) {
				t.Helper()
				if _, err := s.Settle(ctx, hold, hits, n); err != nil {
					t.Fatal(err)
				}
			}
			nextWindow := func() {
				time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 20*time.Millisecond)))
			}
			alignWindow(t, time.Second, 600*time.Millisecond)
			settle(take(), 30) // window 1: 30
			nextWindow()
			h := take() // window 2 opened by a hold: window 1 kept
			settle(h, 40)
			held := take() // still in flight when window 2 ends
			nextWindow()
			settle(held, 5) // window 3 opened by a settle: window 2 (40) kept
			got := historyUsed(t, hs, r, "acme")
			if want := []int64{5, 40, 30}; !slices.Equal(got[:min(len(got), 3)], want) {
				t.Fatalf("history %v, want %v first", got, want)
			}
		})
	}
}

// usedInWindow is a tenant's count of the window starting at ws (Unix s) as History shows it;
// the window must be among those kept.
func usedInWindow(t *testing.T, s HistoryStore, r *Rule, id string, ws int64) int64 {
	t.Helper()
	h, err := s.History(context.Background(), r, id)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range h {
		if w.Start.Unix() == ws {
			return w.Used
		}
	}
	t.Fatalf("history of %s %s has no window starting %d: %+v", r.Name, id, ws, h)
	return 0
}

// exportOf is the export of r's window starting at ws, by id.
func exportOf(t *testing.T, s HistoryStore, r *Rule, ws int64) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	if err := s.Export(context.Background(), r, ws, func(id string, n int64) { out[id] = n }); err != nil {
		t.Fatal(err)
	}
	return out
}

// nextWindow sleeps until 20 ms into the window after the one holding now, of length win.
func nextWindow(win time.Duration) {
	time.Sleep(time.Until(time.Now().Truncate(win).Add(win + 20*time.Millisecond)))
}

// A run-time action on a counter whose window has ended, before the tenant's next unit: the
// ended window's count moves into history first, as that unit would move it. So a reset
// forgets the current window only (requests and tokens), and neither a grant nor an override
// changes the ended window or leaves its count in the current one; the tenants' next units
// count from 0.
func TestHistoryKeptThroughQuotaActions(t *testing.T) {
	t.Parallel() // servers of its own, and no latency bound
	for _, b := range historyBackends(t) {
		t.Run(b.name, func(t *testing.T) {
			ctx := context.Background()
			s := b.stores(t, 1)[0]
			hs, q := s.(HistoryStore), s.(QuotaStore)
			r := rule(t, "per_org", 100, "2s", Fixed)
			r.History = 3
			tok := tokenRule(t, "tokens_per_org", 100_000, "2s")
			tok.History = 3
			ids := idsOnDistinctNodes(4) // reset, grant, override; tokens reset
			alignWindow(t, 2*time.Second, 1200*time.Millisecond)
			w0, _ := r.Window.boundsUnix(time.Now().Unix())
			for _, id := range ids[:3] {
				admitN(t, s, r, id, 5)
			}
			if err := s.Debit(ctx, []Hit{{Rule: tok, ID: ids[3]}}, 40); err != nil {
				t.Fatal(err)
			}
			nextWindow(2 * time.Second)
			var entries []AuditEntry
			e, err := q.Reset(ctx, r, ids[0], who)
			entries = append(entries, e)
			if err != nil {
				t.Fatal(err)
			}
			_, e, err = q.Grant(ctx, r, ids[1], 2, who)
			entries = append(entries, e)
			if err != nil {
				t.Fatal(err)
			}
			_, e, err = q.SetOverride(ctx, r, ids[2], 7, time.Now().Add(time.Hour), who)
			entries = append(entries, e)
			if err != nil {
				t.Fatal(err)
			}
			e, err = q.Reset(ctx, tok, ids[3], who)
			entries = append(entries, e)
			if err != nil {
				t.Fatal(err)
			}
			for i, e := range entries {
				if e.Before.Used != 0 || e.After.Used != 0 {
					t.Errorf("%s of %s after its window ended: used %d before, %d after, want 0 (the ended window is not the current one)", e.Action, ids[i], e.Before.Used, e.After.Used)
				}
			}
			for _, id := range ids[:3] {
				if n := usedInWindow(t, hs, r, id, w0); n != 5 {
					t.Errorf("%s: the ended window shows %d after the action, want 5", id, n)
				}
			}
			if n := usedInWindow(t, hs, tok, ids[3], w0); n != 40 {
				t.Errorf("tokens: the ended window shows %d after a reset, want 40", n)
			}
			if got := exportOf(t, hs, r, w0); len(got) != 3 || got[ids[0]] != 5 || got[ids[1]] != 5 || got[ids[2]] != 5 {
				t.Errorf("export of the ended window: %v, want 5 for each of %v", got, ids[:3])
			}
			if got := exportOf(t, hs, tok, w0); len(got) != 1 || got[ids[3]] != 40 {
				t.Errorf("tokens export of the ended window: %v, want %s 40", got, ids[3])
			}
			// The next units count in a window of their own, from 0.
			for _, id := range ids[:3] {
				admitN(t, s, r, id, 1)
				if u, err := s.Usage(ctx, r, id); err != nil || u.Used != 1 {
					t.Errorf("%s: used %d after one more unit (%v), want 1", id, u.Used, err)
				}
				if n := usedInWindow(t, hs, r, id, w0); n != 5 {
					t.Errorf("%s: the ended window shows %d after the next unit, want 5", id, n)
				}
			}
		})
	}
}
