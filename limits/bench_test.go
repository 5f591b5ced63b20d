package limits

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/docsgate/gateway/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// benchHits is the gateway's typical decision: four limits of one request.
func benchHits(b *testing.B, ids []string) []Hit {
	return []Hit{
		{Rule: rule(b, "per_project", 1<<40, "hour", Fixed), ID: ids[0]},
		{Rule: rule(b, "per_key", 1<<40, "month", Fixed), ID: ids[1%len(ids)]},
		{Rule: rule(b, "per_org", MaxGCRALimit(mustWindow(b, "hour")), "hour", GCRA), ID: ids[2%len(ids)]},
		{Rule: rule(b, "per_ip", 1<<40, "day", Fixed), ID: ids[3%len(ids)]},
	}
}

func runTake(b *testing.B, s Store, hits []Hit) {
	ctx := context.Background()
	var d Decision
	if err := s.Take(ctx, hits, &d); err != nil { // warm up (script load, caches)
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := s.Take(ctx, hits, &d); err != nil || !d.Allowed {
			b.Fatal(d, err)
		}
	}
}

// scriptCalls sums EVALSHA+EVAL calls over the given nodes.
func scriptCalls(b *testing.B, nodes []*redis.Client) int64 {
	var n int64
	for _, c := range nodes {
		n += commandCalls(b, c, "evalsha") + commandCalls(b, c, "eval")
	}
	return n
}

func BenchmarkTake(b *testing.B) {
	b.Run("memory", func(b *testing.B) {
		runTake(b, NewMemory(), benchHits(b, []string{"proj", "keyhash", "org", "1.2.3.4"}))
	})
	b.Run("redis", func(b *testing.B) {
		srv := redistest.Start(b)
		stats := srv.Client(b)
		s := newRedisT(b, srv.Client(b), "gw")
		before := scriptCalls(b, []*redis.Client{stats})
		runTake(b, s, benchHits(b, []string{"proj", "keyhash", "org", "1.2.3.4"}))
		b.StopTimer()
		calls := scriptCalls(b, []*redis.Client{stats}) - before
		b.ReportMetric(float64(calls)/float64(b.N+1), "scripts/op")
	})
	b.Run("cluster", func(b *testing.B) {
		cl := redistest.StartCluster(b, 3)
		var nodes []*redis.Client
		for _, a := range cl.Addrs {
			c := redis.NewClient(&redis.Options{Addr: a})
			b.Cleanup(func() { c.Close() })
			nodes = append(nodes, c)
		}
		s := newRedisT(b, cl.Client(b), "gw")
		hits := benchHits(b, idsOnDistinctNodes(3))
		var d Decision
		s.Take(context.Background(), hits, &d) // load scripts before counting
		before := scriptCalls(b, nodes)
		runTake(b, s, hits)
		b.StopTimer()
		calls := scriptCalls(b, nodes) - before
		b.ReportMetric(float64(calls)/float64(b.N+1), "scripts/op")
	})
}

// BenchmarkTakeConcurrent: decisions per second of the limiter alone on a real redis-server,
// at 1, 8, 64 and 256 concurrent callers, with and without coalescing (auto-pipelining), and
// the Redis CPU each decision cost (INFO cpu), which is what coalescing saves.
//
//	go test -run '^$' -bench BenchmarkTakeConcurrent -benchtime 20000x ./limits/
func BenchmarkTakeConcurrent(b *testing.B) {
	srv := redistest.Start(b)
	for _, mode := range []string{"plain", "coalesced"} {
		for _, conc := range []int{1, 8, 64, 256} {
			b.Run(fmt.Sprintf("%s/conc=%d", mode, conc), func(b *testing.B) {
				c := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: max(32, conc), MaxRetries: -1})
				b.Cleanup(func() { c.Close() })
				var opts []RedisOption
				if mode == "coalesced" {
					opts = append(opts, WithCoalescing())
				}
				s := newRedisT(b, c, uniquePrefix(), opts...)
				if err := s.Preload(context.Background()); err != nil {
					b.Fatal(err)
				}
				hits := benchHits(b, []string{"proj", "keyhash", "org", "1.2.3.4"})
				var next atomic.Int64
				var wg sync.WaitGroup
				cpu0 := redisCPU(b, c)
				b.ResetTimer()
				start := time.Now()
				for range conc {
					wg.Add(1)
					go func() {
						defer wg.Done()
						var d Decision
						for next.Add(1) <= int64(b.N) {
							if err := s.Take(context.Background(), hits, &d); err != nil || !d.Allowed {
								b.Error(d, err)
								return
							}
						}
					}()
				}
				wg.Wait()
				b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "decisions/s")
				b.ReportMetric((redisCPU(b, c)-cpu0).Seconds()*1e6/float64(b.N), "redis-µs/decision")
			})
		}
	}
}

// redisCPU is the CPU time the Redis server has used (user and system), from INFO cpu.
func redisCPU(b *testing.B, c *redis.Client) time.Duration {
	secs := infoValue(b, c, "cpu", "used_cpu_sys") + infoValue(b, c, "cpu", "used_cpu_user")
	return time.Duration(secs * float64(time.Second))
}
