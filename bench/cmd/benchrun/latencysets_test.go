package main

import (
	"math"
	"testing"
	"time"
)

func TestSignP(t *testing.T) {
	for _, c := range []struct {
		k, n int
		want float64
	}{
		{0, 10, 1},
		{10, 10, 1.0 / 1024},
		{9, 10, 11.0 / 1024},
		{8, 10, 56.0 / 1024},
		{5, 10, 638.0 / 1024},
	} {
		if got := signP(c.k, c.n); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("signP(%d, %d) = %v, want %v", c.k, c.n, got, c.want)
		}
	}
}

// lats is n latencies of base ms each, the last `slow` of them of slowMS ms.
func lats(n int, baseMS float64, slow int, slowMS float64) []time.Duration {
	out := make([]time.Duration, n)
	for i := range out {
		ms := baseMS
		if i >= n-slow {
			ms = slowMS
		}
		out[i] = time.Duration(ms * float64(time.Millisecond))
	}
	return out
}

func TestLatencySetStatistics(t *testing.T) {
	r := &report{}
	// Three sets; gateway-redis is 0.1 ms slower at p50 in every set, and its third run is
	// spoilt by a stall (5% of requests at 200 ms). bare's p99 is 10 ms in every set.
	for i := range 3 {
		gwSlow := 0
		if i == 2 {
			gwSlow = 50
		}
		r.latencySets = append(r.latencySets, latencySet{res: map[string]openResult{
			"bare":          {n: 1000, lat: lats(1000, 0.5, 5, 10), p50: 0.5, p99: 10},
			"gateway-redis": {n: 1000, lat: lats(1000, 0.6, gwSlow, 200), p50: 0.6, p99: map[bool]float64{true: 200, false: 0.6}[i == 2]},
		}})
	}
	if got := r.pooled("gateway-redis", 0.5, everySet); math.Abs(got-0.6) > 1e-9 {
		t.Errorf("pooled p50 = %v, want 0.6", got)
	}
	// 50 of 3,000 requests at 200 ms: more than 1%, so the pooled p99 is the stall's.
	if got := r.pooled("gateway-redis", 0.99, everySet); math.Abs(got-200) > 1e-9 {
		t.Errorf("pooled p99 = %v, want 200", got)
	}
	// The median of the differences is not swung by the one stalled run.
	d, worse := r.setDiff("gateway-redis", "bare", func(o openResult) float64 { return o.p99 })
	if d.med != -9.4 || worse != 1 {
		t.Errorf("setDiff p99 = %+v, worse %d; want median -9.4, worse 1", d, worse)
	}
	d, worse = r.setDiff("gateway-redis", "bare", func(o openResult) float64 { return o.p50 })
	if d.med != 0.1 || worse != 3 {
		t.Errorf("setDiff p50 = %+v, worse %d; want median 0.1, worse 3", d, worse)
	}
	// Split halves: even sets (0, 2) hold the stall, odd (1) does not.
	if got := r.resolution(0.99, "gateway-redis"); math.Abs(got-(200-0.6)) > 1e-9 {
		t.Errorf("resolution p99 = %v, want %v", got, 200-0.6)
	}
	if got := r.resolution(0.5, "bare", "gateway-redis"); got != 0 {
		t.Errorf("resolution p50 = %v, want 0", got)
	}
}
