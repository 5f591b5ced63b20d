package rls

import (
	"context"
	"slices"
	"strconv"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/docsgate/gateway/limits"
)

// BenchmarkShouldRateLimit measures a call on the in-process store, two descriptors (a
// project's minute limit and an address's hour limit) over 1,000 tenants: through the gRPC
// client on loopback (what Envoy waits for) and the service alone. It reports the p50 and p99
// of the calls; the bound (p99 under 1 ms) is read from here, never asserted.
func BenchmarkShouldRateLimit(b *testing.B) {
	h := start(b, referenceConfig, limits.NewMemory(), false)
	reqs := make([]*rlsv3.RateLimitRequest, 1000)
	for i := range reqs {
		reqs[i] = &rlsv3.RateLimitRequest{Domain: "another", Descriptors: []*commonv3.RateLimitDescriptor{
			desc("key2", "p"+strconv.Itoa(i)), desc("remote_address", "198.51.100."+strconv.Itoa(i%250)),
		}}
	}
	run := func(b *testing.B, call func(*rlsv3.RateLimitRequest) error) {
		took := make([]time.Duration, 0, b.N)
		b.ReportAllocs()
		b.ResetTimer()
		for i := range b.N {
			start := time.Now()
			if err := call(reqs[i%len(reqs)]); err != nil {
				b.Fatal(err)
			}
			took = append(took, time.Since(start))
		}
		b.StopTimer()
		slices.Sort(took)
		b.ReportMetric(float64(took[len(took)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(took[len(took)*99/100].Microseconds()), "p99-µs")
	}
	b.Run("grpc", func(b *testing.B) {
		run(b, func(r *rlsv3.RateLimitRequest) error {
			_, err := h.client.ShouldRateLimit(context.Background(), r)
			return err
		})
	})
	b.Run("service", func(b *testing.B) {
		run(b, func(r *rlsv3.RateLimitRequest) error {
			_, err := h.svc.ShouldRateLimit(context.Background(), r)
			return err
		})
	})
}
