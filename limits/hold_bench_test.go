package limits

import (
	"context"
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/docsgate/gateway/internal/redistest"
)

// BenchmarkHoldCost is what holds cost Redis, one caller at a time on a fresh redis-server:
// each iteration is an admission (the assistant's decision: four limits, plus a tokens limit
// with a reserve and a streams limit) and its settle, with `inflight` other answers of the same
// tenant holding tokens and slots meanwhile (each decision reads the tenant's holds).
// script-µs/call is INFO commandstats' usec_per_call of EVALSHA (take and settle alike),
// redis-µs/answer all of Redis' CPU per admission and settle:
//
//	go test -run '^$' -bench BenchmarkHoldCost -benchtime 5000x ./limits/
func BenchmarkHoldCost(b *testing.B) {
	srv := redistest.Start(b)
	for _, inflight := range []int{0, 50, 500} {
		b.Run(fmt.Sprintf("inflight=%d", inflight), func(b *testing.B) {
			c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
			b.Cleanup(func() { c.Close() })
			s := newRedisT(b, c, uniquePrefix())
			ctx := context.Background()
			if err := s.Preload(ctx); err != nil {
				b.Fatal(err)
			}
			tok := reserveRule(b, "tok", 1<<40, 4000, 0)
			st := streamsRule("st", 1<<40, 0)
			hits := append(benchHits(b, []string{"proj", "keyhash", "org", "1.2.3.4"}), Hit{Rule: tok, ID: "org"}, Hit{Rule: st, ID: "org"})
			var d Decision
			for range inflight + 1 {
				if err := s.Take(ctx, hits, &d); err != nil || !d.Allowed {
					b.Fatal(d, err)
				}
			}
			if err := c.ConfigResetStat(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			cpu0 := redisCPU(b, c)
			b.ResetTimer()
			for range b.N {
				if err := s.Take(ctx, hits, &d); err != nil || !d.Allowed {
					b.Fatal(d, err)
				}
				if _, err := s.Settle(ctx, d.Hold, hits, 1000); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric((redisCPU(b, c)-cpu0).Seconds()*1e6/float64(b.N), "redis-µs/answer")
			b.ReportMetric(usecPerCall(b, c, "evalsha"), "script-µs/call")
		})
	}
	b.Run("no_holds", func(b *testing.B) {
		decisionCost(b, srv, benchHits(b, []string{"proj", "keyhash", "org", "1.2.3.4"}), nil)
	})
}

// BenchmarkRefreshCost is what refreshing an answer's holds costs Redis, one caller at a time
// on a fresh redis-server: each iteration is one refresh (as an answer in flight makes every
// RefreshEvery) of the holds of one admission (a tokens limit with a reserve and a streams
// limit), with `inflight` other answers of the same tenant holding theirs. script-µs/call is
// INFO commandstats' usec_per_call of EVALSHA, redis-µs/refresh all of Redis' CPU per refresh:
//
//	go test -run '^$' -bench BenchmarkRefreshCost -benchtime 5000x ./limits/
func BenchmarkRefreshCost(b *testing.B) {
	srv := redistest.Start(b)
	for _, inflight := range []int{0, 50} {
		b.Run(fmt.Sprintf("inflight=%d", inflight), func(b *testing.B) {
			c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
			b.Cleanup(func() { c.Close() })
			s := newRedisT(b, c, uniquePrefix())
			ctx := context.Background()
			if err := s.Preload(ctx); err != nil {
				b.Fatal(err)
			}
			tok := reserveRule(b, "tok", 1<<40, 4000, 0)
			st := streamsRule("st", 1<<40, 0)
			hits := []Hit{{Rule: tok, ID: "org"}, {Rule: st, ID: "org"}}
			var d Decision
			for range inflight + 1 {
				if err := s.Take(ctx, hits, &d); err != nil || !d.Allowed {
					b.Fatal(d, err)
				}
			}
			held := d.Held(hits, nil)
			if err := c.ConfigResetStat(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			cpu0 := redisCPU(b, c)
			b.ResetTimer()
			for i := range b.N {
				if lapsed, err := refreshBench(ctx, s, d.Hold, held, int64(i+1)); err != nil || len(lapsed) > 0 {
					b.Fatal(lapsed, err)
				}
			}
			b.StopTimer()
			b.ReportMetric((redisCPU(b, c)-cpu0).Seconds()*1e6/float64(b.N), "redis-µs/refresh")
			b.ReportMetric(usecPerCall(b, c, "evalsha"), "script-µs/call")
		})
	}
}

// refreshBench is one refresh as the gateway makes it; passed is what the answer has passed.
func refreshBench(ctx context.Context, s *Redis, hold string, held []Hit, passed int64) ([]string, error) {
	return s.Refresh(ctx, hold, held, func(*Rule) int64 { return passed })
}
