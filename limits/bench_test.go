package limits

import (
	"context"
	"testing"

	"github.com/docsgate/gateway/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// benchHits is the gateway's typical decision: four limits of one request.
func benchHits(b *testing.B, ids []string) []Hit {
	return []Hit{
		{rule(b, "per_project", 1<<40, "hour", Fixed), ids[0]},
		{rule(b, "per_key", 1<<40, "month", Fixed), ids[1%len(ids)]},
		{rule(b, "per_org", 1<<40, "hour", GCRA), ids[2%len(ids)]},
		{rule(b, "per_ip", 1<<40, "day", Fixed), ids[3%len(ids)]},
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
		s := NewRedis(srv.Client(b), "gw")
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
		s := NewRedis(cl.Client(b), "gw")
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
