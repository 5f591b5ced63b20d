package limits

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/docsgate/gateway/internal/redistest"
)

// BenchmarkAnswerCalls is the gateway's side of the calls an answer makes after its admission,
// one caller at a time on real Redis (a standalone redis-server and a 3-master Cluster whose
// tenants are on different masters): settle (an admission with a reserve and a slot, then its
// settle), debit (the tokens of three tokens limits) and usages (four counters read back).
// ns/op is mostly the round trip; allocs/op and B/op are the gateway's own work, which is what
// a change to these functions moves:
//
//	go test -run '^$' -bench BenchmarkAnswerCalls -benchmem ./limits/
func BenchmarkAnswerCalls(b *testing.B) {
	b.Run("redis", func(b *testing.B) {
		srv := redistest.Start(b)
		c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
		b.Cleanup(func() { c.Close() })
		answerCalls(b, c, []string{"proj", "keyhash", "org", "1.2.3.4"})
	})
	b.Run("cluster", func(b *testing.B) {
		cl := redistest.StartCluster(b, 3)
		answerCalls(b, cl.Client(b), idsOnDistinctNodes(3))
	})
}

func answerCalls(b *testing.B, c redis.UniversalClient, ids []string) {
	s := newRedisT(b, c, uniquePrefix())
	ctx := context.Background()
	if err := s.Preload(ctx); err != nil {
		b.Fatal(err)
	}
	counters := benchHits(b, ids)
	tokens := []Hit{
		{Rule: tokenRule(b, "tok_project", 1<<40, "hour"), ID: ids[0]},
		{Rule: tokenRule(b, "tok_key", 1<<40, "month"), ID: ids[1%len(ids)]},
		{Rule: tokenRule(b, "tok_org", 1<<40, "day"), ID: ids[2%len(ids)]},
	}
	held := append(benchHits(b, ids[:1]), Hit{Rule: reserveRule(b, "res", 1<<40, 4000, 0), ID: ids[1%len(ids)]},
		Hit{Rule: streamsRule("st", 1<<40, 0), ID: ids[2%len(ids)]})
	run := map[string]func() error{
		"settle": func() error {
			var d Decision
			if err := s.Take(ctx, held, &d); err != nil || !d.Allowed {
				b.Fatal(d, err)
			}
			_, err := s.Settle(ctx, d.Hold, held, 1000)
			return err
		},
		"debit":  func() error { return s.Debit(ctx, tokens, 10) },
		"usages": func() error { _, err := s.Usages(ctx, counters); return err },
	}
	for _, name := range []string{"settle", "debit", "usages"} {
		b.Run(name, func(b *testing.B) {
			if err := run[name](); err != nil { // warm up: scripts loaded, connections open
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if err := run[name](); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
