package limits

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/docsgate/gateway/internal/redistest"
)

// listpackEntries is Redis' default hash-max-listpack-entries: a hash of at most that many
// fields is a listpack.
const listpackEntries = 512

// holdRoom is how many answers in flight a tenant of a tokens limit with a reserve may have at
// once while its hash keeps MaxHistory windows and stays a listpack through a window end: the
// fields left beside the kept windows, the one a window end adds before it drops the oldest, s,
// n, w and m, and hs, hc and hx (see MaxHistory).
const holdRoom = listpackEntries - MaxHistory - 1 - 4 - 3

// requestCounts and tokenCounts are a tenant's counts of window k (0: the current one) as the
// memory measurements fill them: requests 1 to 100, tokens 10^5 to 10^7.
func requestCounts(i, k int) int64 { return int64((i+k)%100 + 1) }
func tokenCounts(i, k int) int64 {
	return 100_000 + int64((i*7919+k*104729)%9_900_001)
}

// At the largest history the config accepts, a tenant's counter stays a compact listpack
// through a window end (which adds the ended window before it drops the oldest): a requests
// limit, and a tokens limit with a reserve whose tenant has holdRoom answers in flight (room
// for at least 100 is the promise). It then costs Redis at most 16 bytes per kept window, with
// request-sized and token-sized counts (MEMORY USAGE of the hash against the same hash without
// its windows).
func TestHistoryAtMaxStaysCompact(t *testing.T) {
	if holdRoom < 100 {
		t.Fatalf("MaxHistory %d leaves room for %d answers in flight per tenant, want 100", MaxHistory, holdRoom)
	}
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	cfg, err := c.ConfigGet(ctx, "hash-max-listpack-entries").Result()
	if err != nil || cfg["hash-max-listpack-entries"] != strconv.Itoa(listpackEntries) {
		t.Fatalf("the test's redis-server: hash-max-listpack-entries %v (%v), want Redis' default %d", cfg, err, listpackEntries)
	}
	s := newRedisT(t, c, "gw")
	reqs := rule(t, "per_project", 1000, "hour", Fixed)
	reqs.History = MaxHistory
	tok := tokenRule(t, "tokens_per_org", 1<<40, "hour")
	tok.Reserve, tok.ReserveTTL, tok.History = 100, time.Hour, MaxHistory
	for _, tc := range []struct {
		name  string
		r     *Rule
		count func(i, k int) int64
		holds int // in flight before the window end, which takes one more
	}{
		{"requests", reqs, requestCounts, 0},
		{"tokens", tok, tokenCounts, holdRoom - 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := tc.r
			key, err := s.Key(r, "acme")
			if err != nil {
				t.Fatal(err)
			}
			ws, _ := r.Window.boundsUnix(time.Now().Unix())
			if _, end := r.Window.Bounds(time.Now()); time.Until(end) < 10*time.Second {
				time.Sleep(time.Until(end) + time.Second) // the fill and the take in one window
				ws, _ = r.Window.boundsUnix(time.Now().Unix())
			}
			// The hash as the previous window left it: that window's count in s and n, MaxHistory
			// windows kept before it, and the holds of the answers in flight.
			prev := r.Window.Shift(ws, -1)
			fields := []any{"s", prev, "n", tc.count(0, 0), "w", r.Window.luaSpec()}
			for k := 1; k <= MaxHistory; k++ {
				fields = append(fields, strconv.FormatInt(r.Window.Shift(prev, -k), 10), tc.count(0, k))
			}
			if tc.holds > 0 {
				exp := time.Now().Add(time.Hour).UnixMicro()
				for i := range tc.holds {
					fields = append(fields, fmt.Sprintf("h:%024x", i), fmt.Sprintf("100 %d", exp))
				}
				fields = append(fields, "hs", 100*tc.holds, "hc", tc.holds, "hx", exp)
			}
			if err := c.HSet(ctx, key, fields...).Err(); err != nil {
				t.Fatal(err)
			}
			var d Decision
			if err := s.Take(ctx, []Hit{{Rule: r, ID: "acme"}}, &d); err != nil || !d.Allowed {
				t.Fatalf("the window end's take: %v %+v", err, d)
			}
			n, enc := c.HLen(ctx, key).Val(), c.ObjectEncoding(ctx, key).Val()
			want := int64(3 + MaxHistory)
			if tc.holds > 0 {
				want += int64(tc.holds) + 1 + 3
			}
			if n != want || enc != "listpack" {
				t.Fatalf("after the window end the hash holds %d fields (want %d) as a %s, want a listpack", n, want, enc)
			}
			if h := historyUsed(t, s, r, "acme"); len(h) != MaxHistory+1 || h[1] != tc.count(0, 0) || h[MaxHistory] != tc.count(0, MaxHistory-1) {
				t.Fatalf("history after the window end: %d windows, the ended one %d (want %d)", len(h), h[1], tc.count(0, 0))
			}
			// The windows' cost: the counter's s, n and windows against its s and n alone (the
			// holds, which come and go with the answers, left out of both).
			isWindow := func(f string) bool { _, err := strconv.ParseInt(f, 10, 64); return err == nil }
			withWindows := copyHash(t, c, key, func(f string) bool { return f == "s" || f == "n" || isWindow(f) })
			bare := copyHash(t, c, key, func(f string) bool { return f == "s" || f == "n" })
			perWindow := float64(memoryUsage(t, c, withWindows)-memoryUsage(t, c, bare)) / MaxHistory
			t.Logf("%s: %.1f bytes per kept window at history %d (%d fields)", tc.name, perWindow, MaxHistory, n)
			if perWindow > 16 {
				t.Fatalf("%.1f bytes per kept window, want at most 16", perWindow)
			}
		})
	}
}

// BenchmarkHistoryMemory is what Redis keeps per tenant and kept window at the largest history
// the config accepts (MaxHistory): each op fills a fresh database with 2,000 tenants' counters
// of an hourly limit without history, then the same tenants with MaxHistory ended windows each,
// and reports the difference in INFO used_memory per tenant and kept window, once with
// request-sized counts (1 to 100: bytes/window-requests) and once with token-sized ones (10^5
// to 10^7: bytes/window-tokens). It fails if a tenant's hash is not a listpack.
//
//	go test -run '^$' -bench BenchmarkHistoryMemory -benchtime 3x ./limits/
func BenchmarkHistoryMemory(b *testing.B) {
	const tenants = 2000
	srv := redistest.Start(b)
	c := srv.Client(b)
	ctx := context.Background()
	r := rule(b, "per_org", 1<<40, "hour", Fixed)
	r.History = MaxHistory
	sizes := []struct {
		metric string
		count  func(i, k int) int64
	}{
		{"bytes/window-requests", requestCounts},
		{"bytes/window-tokens", tokenCounts},
	}
	per := make([]float64, len(sizes))
	for range b.N {
		for j, size := range sizes {
			b.StopTimer()
			if err := c.FlushAll(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			before := redistest.InfoInt(b, c, "memory", "used_memory")
			fillHistory(b, c, r, tenants, 0, size.count)
			bare := redistest.InfoInt(b, c, "memory", "used_memory")
			fillHistory(b, c, r, tenants, MaxHistory, size.count)
			full := redistest.InfoInt(b, c, "memory", "used_memory")
			per[j] += float64(full-bare) / float64(tenants*MaxHistory)
			key := fmt.Sprintf("gw:%s:%s:{tenant%06d}", r.Name, r.Window, 0)
			if enc := c.ObjectEncoding(ctx, key).Val(); enc != "listpack" {
				b.Fatalf("%s: a tenant's hash of %d windows is a %s, want a listpack", size.metric, MaxHistory, enc)
			}
			if b.N > 1 {
				continue // logged by the first run (b.N 1) already
			}
			b.Logf("%s: %d tenants, %.0f bytes each without history, %.0f with %d windows (one hash: MEMORY USAGE %d)",
				size.metric, tenants, float64(bare-before)/tenants, float64(full-before)/tenants, MaxHistory, memoryUsage(b, c, key))
		}
	}
	for j, size := range sizes {
		b.ReportMetric(per[j]/float64(b.N), size.metric)
	}
}

// memoryUsage is MEMORY USAGE of key, every field counted.
func memoryUsage(t testing.TB, c *redis.Client, key string) int64 {
	t.Helper()
	n, err := c.MemoryUsage(context.Background(), key, 0).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// copyHash copies the fields of key's hash that keep says yes to into a key of its own, and
// returns that key.
func copyHash(t *testing.T, c *redis.Client, key string, keep func(field string) bool) string {
	t.Helper()
	ctx := context.Background()
	all, err := c.HGetAll(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	var fields []any
	for f, v := range all {
		if keep(f) {
			fields = append(fields, f, v)
		}
	}
	to := fmt.Sprintf("%s:copy%d", key, len(fields))
	if err := c.HSet(ctx, to, fields...).Err(); err != nil {
		t.Fatal(err)
	}
	return to
}
