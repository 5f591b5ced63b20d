package main

import (
	"math"
	"testing"
	"time"
)

func TestBinomTail(t *testing.T) {
	for _, c := range []struct {
		k, n int
		want float64
	}{
		{0, 10, 1.0 / 1024},
		{1, 10, 11.0 / 1024},
		{2, 10, 56.0 / 1024},
		{10, 10, 1},
		{2, 12, 79.0 / 4096},
	} {
		if got := binomTail(c.k, c.n); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("binomTail(%d, %d) = %v, want %v", c.k, c.n, got, c.want)
		}
	}
}

// sets builds a report whose set i has gateway-redis's p50 and p99 at gw[i] and bare's at 0.
func sets(gw []float64) *report {
	r := &report{}
	for _, x := range gw {
		r.latencySets = append(r.latencySets, latencySet{res: map[string]openResult{
			"bare":          {n: 100},
			"gateway-redis": {n: 100, p50: x, p99: x},
		}})
	}
	return r
}

func TestSetDiffInterval(t *testing.T) {
	// 12 sets: the interval is the 3rd smallest to the 3rd largest difference (96%).
	d := sets([]float64{5, -1, 0.2, 3, -4, 0.1, 0.3, 2, -0.5, 9, 0.4, 1}).setDiff("gateway-redis", "bare", openP99)
	if !d.ok || d.lo != -0.5 || d.hi != 3 || math.Abs(d.med-0.35) > 1e-9 || d.slower != 9 || math.Abs(d.conf-(1-2*79.0/4096)) > 1e-12 {
		t.Fatalf("12 sets: %+v", d)
	}
	// 10 sets: 2nd smallest to 2nd largest (98%).
	d = sets([]float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}).setDiff("gateway-redis", "bare", openP50)
	if !d.ok || d.lo != 2 || d.hi != 9 {
		t.Fatalf("10 sets: %+v", d)
	}
	// 5 sets give no 95% interval.
	if d = sets([]float64{1, 2, 3, 4, 5}).setDiff("gateway-redis", "bare", openP50); d.ok {
		t.Fatalf("5 sets: %+v", d)
	}
	// Ties round to zero, not to a float residue that counts as slower.
	r := &report{latencySets: []latencySet{{res: map[string]openResult{"bare": {p50: 0.58}, "gateway-redis": {p50: 0.1 + 0.48}}}}}
	if d = r.setDiff("gateway-redis", "bare", openP50); d.slower != 0 || d.med != 0 {
		t.Fatalf("tie: %+v", d)
	}
}

func TestJudge(t *testing.T) {
	six := func(lo, hi float64) diffInterval { return diffInterval{lo: lo, hi: hi, ok: true, n: 6} }
	for _, c := range []struct {
		d    diffInterval
		errs int
		want string
	}{
		{six(-2, 0.9), 0, "met"},
		{six(-2, 1), 0, "met"},
		{six(-2, 1.1), 0, "inconclusive"},
		{six(1.1, 5), 0, "**missed**"},
		{six(-2, 0.5), 3, "inconclusive"}, // failed requests: their latencies say nothing
		{diffInterval{n: 4}, 0, "inconclusive"},
	} {
		if got := c.d.judge(1, c.errs); got != c.want {
			t.Errorf("judge(%+v, errs %d) = %q, want %q", c.d, c.errs, got, c.want)
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

func TestPooled(t *testing.T) {
	r := &report{}
	// Three runs of 1,000; the third spoilt by a stall (5% of its requests at 200 ms).
	for i := range 3 {
		slow := 0
		if i == 2 {
			slow = 50
		}
		r.latencySets = append(r.latencySets, latencySet{res: map[string]openResult{"gateway-redis": {lat: lats(1000, 0.6, slow, 200), errs: i}}})
	}
	if got := r.pooled("gateway-redis", 0.5); math.Abs(got-0.6) > 1e-9 {
		t.Errorf("pooled p50 = %v, want 0.6", got)
	}
	// 50 of 3,000 requests at 200 ms: more than 1%, so the pooled p99 is the stall's.
	if got := r.pooled("gateway-redis", 0.99); math.Abs(got-200) > 1e-9 {
		t.Errorf("pooled p99 = %v, want 200", got)
	}
	if got := r.setErrors("gateway-redis"); got != 3 {
		t.Errorf("setErrors = %d, want 3", got)
	}
}

func TestSetOrdersBalanced(t *testing.T) {
	pos := map[[2]int]int{}  // (server, position) -> count
	next := map[[2]int]int{} // (server, server right after it) -> count
	for _, o := range setOrders {
		for p, s := range o {
			pos[[2]int{s, p}]++
			if p > 0 {
				next[[2]int{o[p-1], s}]++
			}
		}
	}
	for s := range 3 {
		for p := range 3 {
			if pos[[2]int{s, p}] != 2 {
				t.Errorf("server %d at position %d in %d orders, want 2", s, p, pos[[2]int{s, p}])
			}
		}
		for u := range 3 {
			if u != s && next[[2]int{s, u}] != 2 {
				t.Errorf("server %d right before %d in %d orders, want 2", s, u, next[[2]int{s, u}])
			}
		}
	}
}
