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

// BenchmarkHistoryReads measures what usage history costs the reads at 100,000 tenants: one
// Scan of a limit (what /usage/top runs) with no history kept and with every tenant holding
// its default history (48 hours, and the three other limits of the keyspace theirs: 13 months,
// 35 days, 48 hours), one Export of an ended window, the longest Redis command meanwhile
// (SLOWLOG) and the memory Redis holds per tenant and kept window (INFO used_memory, the same
// tenants without and with their history).
//
//	go test -run '^$' -bench BenchmarkHistoryReads -benchtime 3x ./limits/
func BenchmarkHistoryReads(b *testing.B) {
	const tenants = 100_000
	for _, kept := range []string{"none", "default"} {
		srv := redistest.Start(b)
		c := srv.Client(b)
		ctx := context.Background()
		r := rule(b, "per_org", 1_000_000, "hour", Fixed)
		r.History = DefaultHistory(r.Window)
		others := []*Rule{rule(b, "per_key", 10, "month", Fixed), rule(b, "per_ip", 10, "day", Fixed), rule(b, "per_project", 10, "hour", Fixed)}
		for _, x := range append([]*Rule{r}, others...) {
			keep := 0
			if kept == "default" {
				keep = DefaultHistory(x.Window)
			}
			before := redistest.InfoInt(b, c, "memory", "used_memory")
			fillHistory(b, c, x, tenants, keep)
			if x == r {
				per := float64(redistest.InfoInt(b, c, "memory", "used_memory")-before) / tenants
				b.Logf("%s history: %.0f bytes of Redis memory per tenant (%d kept windows)", kept, per, keep)
			}
		}
		s := newRedisT(b, c, "gw")
		resolve := func(string) *Rule { return r }
		slow := func(b *testing.B) {
			c.ConfigSet(ctx, "slowlog-log-slower-than", "0")
			c.ConfigSet(ctx, "slowlog-max-len", "1000000")
			c.SlowLogReset(ctx)
		}
		worst := func(b *testing.B) {
			logs, err := c.SlowLogGet(ctx, -1).Result()
			if err != nil {
				b.Fatal(err)
			}
			var w time.Duration
			for _, l := range logs {
				w = max(w, l.Duration)
			}
			b.ReportMetric(float64(w.Microseconds()), "max-µs/command")
		}
		b.Run("top/"+kept, func(b *testing.B) {
			slow(b)
			b.ResetTimer()
			for range b.N {
				n := 0
				if err := s.Scan(ctx, r, resolve, func(string, Usage) { n++ }); err != nil {
					b.Fatal(err)
				}
				if n != tenants {
					b.Fatalf("scanned %d of %d tenants", n, tenants)
				}
			}
			b.StopTimer()
			worst(b)
		})
		if kept == "none" {
			continue
		}
		b.Run("export/"+kept, func(b *testing.B) {
			ws, _ := r.Window.boundsUnix(time.Now().Unix())
			past := r.Window.Shift(ws, -10)
			slow(b)
			b.ResetTimer()
			for range b.N {
				n := 0
				if err := s.Export(ctx, r, past, func(string, int64) { n++ }); err != nil {
					b.Fatal(err)
				}
				if n != tenants {
					b.Fatalf("exported %d of %d tenants", n, tenants)
				}
			}
			b.StopTimer()
			worst(b)
		})
	}
}

// fillHistory writes n counters of r in the current window, each with keep ended windows kept
// (as the take script leaves them), pipelined.
func fillHistory(b *testing.B, c *redis.Client, r *Rule, n, keep int) {
	ctx := context.Background()
	ws, we := r.Window.boundsUnix(time.Now().Unix())
	pipe := c.Pipeline()
	for i := range n {
		key := fmt.Sprintf("gw:%s:%s:{tenant%06d}", r.Name, r.Window, i)
		args := []any{"s", ws, "n", i%100 + 1}
		for k := 1; k <= keep; k++ {
			args = append(args, strconv.FormatInt(r.Window.Shift(ws, -k), 10), (i+k)%1000+1)
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
