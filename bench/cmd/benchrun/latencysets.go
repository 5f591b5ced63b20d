package main

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// latencySetNames are the servers of an open-loop set: the latency questions are whether
// coalescing costs latency (gateway-redis against the same binary with it off) and how far the
// gateway is from bare, so the three run back to back.
var latencySetNames = []string{"bare", "gateway-redis", "gateway-redis-nocoalesce"}

// setOrders are the six orders of the three servers, cycled set by set: over a multiple of
// six sets each server runs first, second and third equally often and each one directly
// before each other one equally often, so a machine that speeds up or slows down within a set
// favours none of them.
var setOrders = [][3]int{{0, 1, 2}, {1, 2, 0}, {2, 0, 1}, {0, 2, 1}, {2, 1, 0}, {1, 0, 2}}

// latencySet is one set of back-to-back open-loop runs on agent_job, one per server of
// latencySetNames. The open loop's p99 over a few seconds moves by milliseconds as the
// machine's speed drifts; runs seconds apart see the same machine, so the difference within a
// set is far steadier than that of runs a round apart.
type latencySet struct {
	order []string
	res   map[string]openResult
}

// measureLatencySets runs n sets of d per run at e.o.rate. The servers stay up for all sets,
// each warmed (closed loop, e.o.warmup) right before its run so its pools are full.
func (e *env) measureLatencySets(n int, d time.Duration) ([]latencySet, error) {
	w := allWorkloads[0] // agent_job
	script := e.scripts[w.name]
	servers := make([]*server, len(latencySetNames))
	for i, name := range latencySetNames {
		v := selectVariants(name)
		if len(v) == 0 {
			return nil, fmt.Errorf("latency sets: no variant %s", name)
		}
		srv, err := e.start(v[0], e.fast)
		if err != nil {
			return nil, err
		}
		defer srv.stop()
		servers[i] = srv
	}
	var out []latencySet
	for i := range n {
		s := latencySet{res: map[string]openResult{}}
		for _, j := range setOrders[i%len(setOrders)] {
			name := latencySetNames[j]
			warm, err := runWrk(servers[j].url, w, script, e.o.conns, e.o.warmup)
			if err != nil {
				return out, fmt.Errorf("latency set %d: %s warm-up: %w", i+1, name, err)
			}
			if warm.non2xx+warm.sockEr > 0 {
				return out, fmt.Errorf("latency set %d: %s warm-up: %d non-2xx answers, %d socket errors", i+1, name, warm.non2xx, warm.sockEr)
			}
			s.order = append(s.order, name)
			s.res[name] = runOpen(servers[j].url, servers[j].v.kind, w, e.o.rate, d)
		}
		logf("latency set %d: p50/p99 ms bare %.2f/%.2f, gateway-redis %.2f/%.2f, nocoalesce %.2f/%.2f", i+1,
			s.res["bare"].p50, s.res["bare"].p99, s.res["gateway-redis"].p50, s.res["gateway-redis"].p99,
			s.res["gateway-redis-nocoalesce"].p50, s.res["gateway-redis-nocoalesce"].p99)
		out = append(out, s)
	}
	return out, nil
}

// pooled is a quantile of every latency one server saw over all sets: the sets interleave the
// servers in time, so pooling compares them over the same spells of the machine, with far
// more requests behind a p99 than one run has. Shown, not judged: one stall of the machine in
// one run can own a pooled p99.
func (r *report) pooled(name string, q float64) float64 {
	var all []time.Duration
	for _, s := range r.latencySets {
		all = append(all, s.res[name].lat...)
	}
	slices.Sort(all)
	return ms(quantile(all, q))
}

// setErrors is the number of failed requests of one server over all sets.
func (r *report) setErrors(name string) int {
	n := 0
	for _, s := range r.latencySets {
		n += s.res[name].errs
	}
	return n
}

// diffInterval is the median over sets of a's quantile minus b's, and a distribution-free
// confidence interval of at least 95% for it: the k-th smallest and k-th largest difference,
// k the largest for which the chance that the true median falls outside is at most 5%
// (for 12 sets k = 3, 96%). ok is false with fewer than 6 sets, which give no such interval.
// slower counts the sets in which a was slower.
type diffInterval struct {
	med, lo, hi float64
	conf        float64
	slower, n   int
	ok          bool
}

func (r *report) setDiff(a, b string, q func(openResult) float64) diffInterval {
	var v []float64
	d := diffInterval{n: len(r.latencySets)}
	for _, s := range r.latencySets {
		x := math.Round((q(s.res[a])-q(s.res[b]))*1000) / 1000 // µs: no float residue on ties
		v = append(v, x)
		if x > 0 {
			d.slower++
		}
	}
	if len(v) == 0 {
		return d
	}
	slices.Sort(v)
	d.med = statOf(v).med
	for k := len(v) / 2; k >= 1; k-- {
		// The true median lies below the k-th smallest only if fewer than k differences fall
		// below it: a Binomial(n, 1/2) tail, on each side.
		if conf := 1 - 2*binomTail(k-1, len(v)); conf >= 0.95 {
			d.lo, d.hi, d.conf, d.ok = v[k-1], v[len(v)-k], conf, true
			break
		}
	}
	return d
}

// binomTail is P(X ≤ k) for X ~ Binomial(n, 1/2).
func binomTail(k, n int) float64 {
	p, c := 0.0, 1.0 // c = n choose i
	for i := 0; i <= k && i <= n; i++ {
		p += c
		c = c * float64(n-i) / float64(i+1)
	}
	return p / math.Pow(2, float64(n))
}

// judge is a target's verdict on "a is at most tol ms slower than b": met when the whole
// interval is at or below tol, missed when the whole interval is above it, and inconclusive
// when the run cannot tell (the interval straddles tol, too few sets, or a failed request,
// whose latency says nothing).
func (d diffInterval) judge(tol float64, errs int) string {
	switch {
	case errs > 0 || !d.ok:
		return "inconclusive"
	case d.hi <= tol:
		return "met"
	case d.lo > tol:
		return "**missed**"
	}
	return "inconclusive"
}

// latencyTargets judges gateway-redis against other in the sets, at p50 within tol50 ms and at
// p99 within tol99 ms; a failed request of either makes both inconclusive.
func (r *report) latencyTargets(other string, tol50, tol99 float64, label string, name func(q string, tol float64) string) [][3]string {
	errs := r.setErrors("gateway-redis") + r.setErrors(other)
	var t [][3]string
	for _, q := range []struct {
		name string
		f    func(openResult) float64
		tol  float64
	}{{"p50", openP50, tol50}, {"p99", openP99, tol99}} {
		d := r.setDiff("gateway-redis", other, q.f)
		t = append(t, [3]string{name(q.name, q.tol), fmt.Sprintf("%s: %s", label, d), d.judge(q.tol, errs)})
	}
	return t
}

func (d diffInterval) String() string {
	if !d.ok {
		return fmt.Sprintf("median %+.3f ms over %d sets (too few sets for an interval); slower in %d", d.med, d.n, d.slower)
	}
	return fmt.Sprintf("median %+.3f ms, %.0f%% interval %+.3f to %+.3f over %d sets; slower in %d", d.med, d.conf*100, d.lo, d.hi, d.n, d.slower)
}

// latencySetsTable writes every set, the intervals and the pooled quantiles.
func (r *report) latencySetsTable(w func(string, ...any)) {
	if len(r.latencySets) == 0 {
		return
	}
	w("## Open loop, back-to-back sets\n\n%d sets of open-loop agent_job runs at %d req/s (%s each, every server warmed by a %s closed loop right before its run): %s back to back, the six orders in turn; %s with GOMAXPROCS=%d. Latencies in ms. Every set:\n\n",
		len(r.latencySets), r.opts.rate, r.opts.openSetDuration, r.opts.warmup, strings.Join(latencySetNames, ", "), r.opts.placement("servers"), r.opts.serverProcs)
	w("| set | order | bare p50 | gateway-redis p50 | nocoalesce p50 | bare p99 | gateway-redis p99 | nocoalesce p99 | errors (bare / gw / nocoalesce) |\n|---|---|---|---|---|---|---|---|---|\n")
	for i, s := range r.latencySets {
		b, g, n := s.res["bare"], s.res["gateway-redis"], s.res["gateway-redis-nocoalesce"]
		w("| %d | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %d / %d / %d |\n", i+1, strings.Join(s.order, ", "),
			b.p50, g.p50, n.p50, b.p99, g.p99, n.p99, b.errs, g.errs, n.errs)
	}
	w("\nThe difference within a set, gateway-redis minus the other server (a distribution-free interval for its median over the sets):\n\n| against | p50 | p99 |\n|---|---|---|\n")
	for _, other := range []string{"gateway-redis-nocoalesce", "bare"} {
		w("| %s | %s | %s |\n", other, r.setDiff("gateway-redis", other, openP50), r.setDiff("gateway-redis", other, openP99))
	}
	w("\nEvery request of every set, per server (pooled; shown, not judged: one stall of the machine in one run can own a pooled p99):\n\n")
	w("| server | requests | errors | p50 | p99 | p99.9 |\n|---|---|---|---|---|---|\n")
	for _, n := range latencySetNames {
		reqs := 0
		for _, s := range r.latencySets {
			reqs += s.res[n].n
		}
		w("| %s | %d | %d | %.3f | %.2f | %.2f |\n", n, reqs, r.setErrors(n), r.pooled(n, 0.5), r.pooled(n, 0.99), r.pooled(n, 0.999))
	}
	w("\n")
}

func openP50(o openResult) float64 { return o.p50 }
func openP99(o openResult) float64 { return o.p99 }
