package limits

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/docsgate/gateway/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// BenchmarkScan measures what /usage/top costs: one Scan of a limit with 10,000 and 100,000
// tenants on a real redis-server (plus as many keys of three other limits, which SCAN walks
// too), and the longest time Redis spent on one command meanwhile, from its SLOWLOG: the
// most the scan ever blocks Redis.
//
//	go test -run '^$' -bench BenchmarkScan -benchtime 3x ./limits/
func BenchmarkScan(b *testing.B) {
	for _, tenants := range []int{10_000, 100_000} {
		b.Run(strconv.Itoa(tenants), func(b *testing.B) {
			srv := redistest.Start(b)
			c := srv.Client(b)
			ctx := context.Background()
			r := rule(b, "per_org", 1_000_000, "hour", Fixed)
			s := newRedisT(b, c, "gw")
			ws, _ := r.Window.Bounds(time.Now())
			fill(b, c, s, r, tenants, ws.Unix())
			for _, other := range []*Rule{rule(b, "per_key", 10, "month", Fixed), rule(b, "per_ip", 10, "day", Fixed), rule(b, "per_project", 10, "hour", Fixed)} {
				ows, _ := other.Window.Bounds(time.Now())
				fill(b, c, s, other, tenants, ows.Unix())
			}
			if err := c.ConfigSet(ctx, "slowlog-log-slower-than", "0").Err(); err != nil {
				b.Fatal(err)
			}
			c.ConfigSet(ctx, "slowlog-max-len", "1000000")
			c.SlowLogReset(ctx)
			resolve := func(string) *Rule { return r }
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				n := 0
				if err := s.Scan(ctx, r, resolve, func(string, Usage) { n++ }); err != nil {
					b.Fatal(err)
				}
				if n != tenants {
					b.Fatalf("scanned %d of %d tenants", n, tenants)
				}
			}
			b.StopTimer()
			logs, err := c.SlowLogGet(ctx, -1).Result()
			if err != nil {
				b.Fatal(err)
			}
			var worst time.Duration
			var scans int
			for _, l := range logs {
				if len(l.Args) > 0 && (l.Args[0] == "scan" || l.Args[0] == "SCAN") {
					scans++
				}
				worst = max(worst, l.Duration)
			}
			b.ReportMetric(float64(worst.Microseconds()), "max-µs/command")
			b.ReportMetric(float64(scans)/float64(b.N), "scans/op")
		})
	}
}

// fill writes n fixed-window counters of r in window ws, pipelined, under the keys s gives
// them.
func fill(b *testing.B, c *redis.Client, s *Redis, r *Rule, n int, ws int64) {
	ctx := context.Background()
	cr, err := s.rules.get(r)
	if err != nil {
		b.Fatal(err)
	}
	pipe := c.Pipeline()
	for i := 0; i < n; i++ {
		key := fmt.Sprintf("%stenant%06d}", cr.keyPre, i)
		pipe.HSet(ctx, key, "s", ws, "n", i%100+1)
		pipe.Expire(ctx, key, time.Hour*24*32)
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
