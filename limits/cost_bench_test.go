package limits

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/docsgate/gateway/internal/redistest"
)

// BenchmarkDecisionCost is what one decision costs Redis, one caller at a time on a fresh
// redis-server: script-µs/decision is the time Redis spends running the script (INFO
// commandstats, usec_per_call of EVALSHA: the script's own commands included, the network
// not), redis-µs/decision all of Redis' CPU (INFO cpu, reading and writing the connection
// included). agent_job is one limit, four_limits the assistant's decision of four, each for
// a tenant without a run-time quota. The file uses nothing quota-specific, so it measures the
// commit before run-time quotas as well (copy it there):
//
//	go test -run '^$' -bench BenchmarkDecisionCost -benchtime 20000x -count 6 ./limits/
func BenchmarkDecisionCost(b *testing.B) {
	srv := redistest.Start(b)
	for _, c := range []struct {
		name string
		ids  []string
	}{{"agent_job", nil}, {"four_limits", []string{"proj", "keyhash", "org", "1.2.3.4"}}} {
		b.Run(c.name, func(b *testing.B) {
			hits := benchHits(b, []string{"proj", "keyhash", "org", "1.2.3.4"})
			if c.ids == nil {
				hits = hits[:1]
			}
			decisionCost(b, srv, hits, nil)
		})
	}
}

// decisionCost runs b.N decisions of hits on a store of srv (after prepare, when set) and
// reports Redis' cost per decision.
func decisionCost(b *testing.B, srv *redistest.Server, hits []Hit, prepare func(*Redis)) {
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	b.Cleanup(func() { c.Close() })
	s := newRedisT(b, c, uniquePrefix())
	if err := s.Preload(context.Background()); err != nil {
		b.Fatal(err)
	}
	if prepare != nil {
		prepare(s)
	}
	var d Decision
	if err := s.Take(context.Background(), hits, &d); err != nil {
		b.Fatal(err)
	}
	if err := c.ConfigResetStat(context.Background()).Err(); err != nil {
		b.Fatal(err)
	}
	cpu0 := redisCPU(b, c)
	b.ResetTimer()
	for range b.N {
		if err := s.Take(context.Background(), hits, &d); err != nil || !d.Allowed {
			b.Fatal(d, err)
		}
	}
	b.StopTimer()
	b.ReportMetric((redisCPU(b, c)-cpu0).Seconds()*1e6/float64(b.N), "redis-µs/decision")
	b.ReportMetric(usecPerCall(b, c, "evalsha"), "script-µs/decision")
}

// usecPerCall is INFO commandstats' usec_per_call of cmd.
func usecPerCall(b *testing.B, c *redis.Client, cmd string) float64 {
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":"); ok {
			for _, kv := range strings.Split(rest, ",") {
				if v, ok := strings.CutPrefix(kv, "usec_per_call="); ok {
					f, _ := strconv.ParseFloat(v, 64)
					return f
				}
			}
		}
	}
	b.Fatalf("no %s in INFO commandstats", cmd)
	return 0
}
