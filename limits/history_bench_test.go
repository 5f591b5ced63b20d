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

// BenchmarkHistoryReads measures what usage history costs the reads at 100,000 tenants, on
// two redis-servers holding the same tenants of four limits (400,000 keys): one without
// history, one with every tenant holding its limit's default history (the limit read keeps 48
// hours, the three others 13 months, 35 days, 48 hours). Each op runs, one after the other, a
// Scan of the limit (what /usage/top runs) on both servers and an export of an ended window
// (ExportSorted, read to the end), so a loaded machine slows both sides alike:
// ms-top-none/op, ms-top-history/op and ms-export/op are their times, max-µs/command the
// longest Redis command of the history server meanwhile (SLOWLOG). It also logs the Redis
// memory per tenant and kept window (INFO used_memory of the two servers) and the size of an
// export's sorted set.
//
//	go test -run '^$' -bench BenchmarkHistoryReads -benchtime 5x ./limits/
func BenchmarkHistoryReads(b *testing.B) {
	const tenants = 100_000
	ctx := context.Background()
	r := rule(b, "per_org", 1_000_000, "hour", Fixed)
	r.History = DefaultHistory(r.Window)
	others := []*Rule{rule(b, "per_key", 10, "month", Fixed), rule(b, "per_ip", 10, "day", Fixed), rule(b, "per_project", 10, "hour", Fixed)}
	var clients [2]*redis.Client
	var stores [2]*Redis
	var mem [2]int64
	for i := range clients {
		srv := redistest.Start(b)
		clients[i] = srv.Client(b)
		before := redistest.InfoInt(b, clients[i], "memory", "used_memory")
		for _, x := range append([]*Rule{r}, others...) {
			keep := 0
			if i == 1 {
				keep = DefaultHistory(x.Window)
			}
			fillHistory(b, clients[i], x, tenants, keep, readCounts)
		}
		mem[i] = redistest.InfoInt(b, clients[i], "memory", "used_memory") - before
		stores[i] = newRedisT(b, clients[i], "gw")
	}
	kept := 0
	for _, x := range append([]*Rule{r}, others...) {
		kept += DefaultHistory(x.Window)
	}
	b.Logf("Redis memory: %.0f and %.0f bytes per tenant and limit without and with history: %.1f bytes per tenant and kept window",
		float64(mem[0])/(4*tenants), float64(mem[1])/(4*tenants), float64(mem[1]-mem[0])/float64(tenants*kept))
	c := clients[1]
	c.ConfigSet(ctx, "slowlog-log-slower-than", "0")
	c.ConfigSet(ctx, "slowlog-max-len", "1000000")
	c.SlowLogReset(ctx)
	resolve := func(string) *Rule { return r }
	ws, _ := r.Window.boundsUnix(time.Now().Unix())
	past := r.Window.Shift(ws, -10)
	var took [3]time.Duration
	b.ResetTimer()
	for range b.N {
		for i, s := range stores {
			t0 := time.Now()
			n := 0
			if err := s.Scan(ctx, r, resolve, func(string, Usage) { n++ }); err != nil {
				b.Fatal(err)
			}
			took[i] += time.Since(t0)
			if n != tenants {
				b.Fatalf("scanned %d of %d tenants", n, tenants)
			}
		}
		t0 := time.Now()
		n := 0
		ts, err := stores[1].ExportSorted(ctx, r, past, func(string) bool { return true })
		if err != nil {
			b.Fatal(err)
		}
		for {
			_, _, ok, err := ts.Next(ctx)
			if err != nil {
				b.Fatal(err)
			}
			if !ok {
				break
			}
			n++
		}
		if err := ts.Close(ctx); err != nil {
			b.Fatal(err)
		}
		took[2] += time.Since(t0)
		if n != tenants {
			b.Fatalf("exported %d of %d tenants", n, tenants)
		}
	}
	b.StopTimer()
	for i, name := range []string{"ms-top-none/op", "ms-top-history/op", "ms-export/op"} {
		b.ReportMetric(float64(took[i].Milliseconds())/float64(b.N), name)
	}
	logs, err := c.SlowLogGet(ctx, -1).Result()
	if err != nil {
		b.Fatal(err)
	}
	var worst time.Duration
	var cmd string
	for _, l := range logs {
		if l.Duration > worst {
			worst, cmd = l.Duration, fmt.Sprint(l.Args[0])
		}
	}
	b.ReportMetric(float64(worst.Microseconds()), "max-µs/command")
	b.Logf("longest command: %s", cmd)
	// Then (its MEMORY USAGE not among the commands above) the sorted set an export of the
	// window holds while it is read (export.go).
	ts, err := stores[1].ExportSorted(ctx, r, past, func(string) bool { return true })
	if err != nil {
		b.Fatal(err)
	}
	size, err := c.MemoryUsage(ctx, ts.(*redisTenants).key, 0).Result()
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("an export's sorted set of %d tenants: %d bytes (%.0f per tenant)", ts.Len(), size, float64(size)/float64(ts.Len()))
	if err := ts.Close(ctx); err != nil {
		b.Fatal(err)
	}
}

// fillHistory writes n counters of r in the current window, each with keep ended windows kept
// (as the take script leaves them), pipelined: tenant i's count of the window k windows back
// (0: the current one) is count(i, k).
func fillHistory(b *testing.B, c *redis.Client, r *Rule, n, keep int, count func(i, k int) int64) {
	ctx := context.Background()
	ws, we := r.Window.boundsUnix(time.Now().Unix())
	pipe := c.Pipeline()
	for i := range n {
		key := fmt.Sprintf("gw:%s:%s:{tenant%06d}", r.Name, r.Window, i)
		args := []any{"s", ws, "n", count(i, 0)}
		for k := 1; k <= keep; k++ {
			args = append(args, strconv.FormatInt(r.Window.Shift(ws, -k), 10), count(i, k))
		}
		pipe.HSet(ctx, key, args...)
		pipe.ExpireAt(ctx, key, time.Unix(r.Window.Shift(we, keep), 0))
		if pipe.Len() >= 2000 {
			if _, err := pipe.Exec(ctx); err != nil {
				b.Fatal(err)
			}
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		b.Fatal(err)
	}
}

// readCounts are the counts BenchmarkHistoryReads fills: 1 to 100 in the current window, 1 to
// 1000 in the kept ones.
func readCounts(i, k int) int64 {
	if k == 0 {
		return int64(i%100 + 1)
	}
	return int64((i+k)%1000 + 1)
}

// BenchmarkHistoryDecisionCost is what keeping history costs Redis per decision (see
// BenchmarkDecisionCost for the metrics): "same_window" decisions of one limit in a window
// already begun, with no history and with the default 48 hours; "window_end" decisions that
// each begin a tenant's new window, its hash holding the previous window and 48 kept ones (the
// once-per-tenant-and-window step that moves the count aside and drops the oldest).
//
//	go test -run '^$' -bench BenchmarkHistoryDecisionCost -benchtime 20000x -count 3 ./limits/
func BenchmarkHistoryDecisionCost(b *testing.B) {
	srv := redistest.Start(b)
	for _, keep := range []int{0, 48} {
		b.Run("same_window/history="+strconv.Itoa(keep), func(b *testing.B) {
			r := rule(b, "agent_job_per_project", 1<<40, "hour", Fixed)
			r.History = keep
			decisionCost(b, srv, []Hit{{Rule: r, ID: "proj"}}, nil)
		})
	}
	b.Run("window_end/history=48", func(b *testing.B) {
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
		b.Cleanup(func() { c.Close() })
		prefix := uniquePrefix()
		s := newRedisT(b, c, prefix)
		r := rule(b, "agent_job_per_project", 1<<40, "hour", Fixed)
		r.History = 48
		ctx := context.Background()
		ws, _ := r.Window.boundsUnix(time.Now().Unix())
		prev := r.Window.Shift(ws, -1)
		pipe := c.Pipeline()
		for i := range b.N {
			args := []any{"s", prev, "n", 7}
			for k := 1; k <= 48; k++ {
				args = append(args, strconv.FormatInt(r.Window.Shift(prev, -k), 10), k)
			}
			key, _ := s.Key(r, "t"+strconv.Itoa(i))
			pipe.HSet(ctx, key, args...)
			if pipe.Len() >= 2000 {
				if _, err := pipe.Exec(ctx); err != nil {
					b.Fatal(err)
				}
			}
		}
		if _, err := pipe.Exec(ctx); err != nil {
			b.Fatal(err)
		}
		if err := s.Preload(ctx); err != nil {
			b.Fatal(err)
		}
		var d Decision
		if err := c.ConfigResetStat(ctx).Err(); err != nil {
			b.Fatal(err)
		}
		cpu0 := redisCPU(b, c)
		b.ResetTimer()
		for i := range b.N {
			if err := s.Take(ctx, []Hit{{Rule: r, ID: "t" + strconv.Itoa(i)}}, &d); err != nil || !d.Allowed {
				b.Fatal(d, err)
			}
		}
		b.StopTimer()
		b.ReportMetric((redisCPU(b, c)-cpu0).Seconds()*1e6/float64(b.N), "redis-µs/decision")
		b.ReportMetric(usecPerCall(b, c, "evalsha"), "script-µs/decision")
		key, _ := s.Key(r, "t0")
		if n, _ := c.HLen(ctx, key).Result(); n != 2+48 {
			b.Fatalf("a tenant's hash holds %d fields after its window ended, want 50", n)
		}
	})
}
