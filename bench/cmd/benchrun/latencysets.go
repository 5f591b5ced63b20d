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

// latencySet is one set of back-to-back open-loop runs on agent_job, one per server of
// latencySetNames, in an order that rotates from set to set. The open loop's p99 over a few
// seconds moves by milliseconds as the machine's speed drifts; runs seconds apart see the same
// machine, so the difference within a set is far steadier than that of runs a round apart.
type latencySet struct {
	first string
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
			return nil, fmt.Errorf("open sets: no variant %s", name)
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
		s := latencySet{first: latencySetNames[i%len(servers)], res: map[string]openResult{}}
		for k := range servers {
			j := (i + k) % len(servers)
			if _, err := runWrk(servers[j].url, w, script, e.o.conns, e.o.warmup); err != nil {
				return out, fmt.Errorf("open set %d: %s warm-up: %w", i+1, latencySetNames[j], err)
			}
			s.res[latencySetNames[j]] = runOpen(servers[j].url, servers[j].v.kind, w, e.o.rate, d)
		}
		logf("open set %d: p50/p99 ms bare %.2f/%.2f, gateway-redis %.2f/%.2f, nocoalesce %.2f/%.2f", i+1,
			s.res["bare"].p50, s.res["bare"].p99, s.res["gateway-redis"].p50, s.res["gateway-redis"].p99,
			s.res["gateway-redis-nocoalesce"].p50, s.res["gateway-redis-nocoalesce"].p99)
		out = append(out, s)
	}
	return out, nil
}

// pooled is a quantile of every latency one server saw over the sets whose index satisfies
// keep: the sets interleave the servers in time, so pooling compares them over the same spells
// of a machine whose speed drifts, with far more requests behind a p99 than one run has.
func (r *report) pooled(name string, q float64, keep func(i int) bool) float64 {
	var all []time.Duration
	for i, s := range r.latencySets {
		if keep(i) {
			all = append(all, s.res[name].lat...)
		}
	}
	slices.Sort(all)
	return ms(quantile(all, q))
}

func everySet(int) bool { return true }

// setDiff is the median over sets of a's quantile minus b's (robust to one run spoilt by a
// stall of the machine, which pooling is not at p99), and in how many sets a was slower.
func (r *report) setDiff(a, b string, q func(openResult) float64) (stat, int) {
	var v []float64
	worse := 0
	for _, s := range r.latencySets {
		d := math.Round((q(s.res[a])-q(s.res[b]))*1000) / 1000 // µs: no float residue on ties
		v = append(v, d)
		if d > 0 {
			worse++
		}
	}
	return statOf(v), worse
}

// signP is the one-sided sign test: the chance that a server no slower than the other comes
// out slower in k or more of n sets.
func signP(k, n int) float64 {
	p := 0.0
	for i := k; i <= n; i++ {
		c := 1.0
		for j := 0; j < i; j++ {
			c = c * float64(n-j) / float64(j+1)
		}
		p += c
	}
	return p / math.Pow(2, float64(n))
}

// resolution is how far the pooled quantile q of the same server moves between the even and
// the odd sets, the largest over names: a difference between servers below it is not one the
// run can tell from noise.
func (r *report) resolution(q float64, names ...string) float64 {
	var res float64
	for _, n := range names {
		even := r.pooled(n, q, func(i int) bool { return i%2 == 0 })
		odd := r.pooled(n, q, func(i int) bool { return i%2 == 1 })
		res = max(res, math.Abs(even-odd))
	}
	return res
}

// latencySetsTable writes every set and the pooled quantiles.
func (r *report) latencySetsTable(w func(string, ...any)) {
	if len(r.latencySets) == 0 {
		return
	}
	w("## Open loop, back-to-back sets\n\n%d sets of open-loop agent_job runs at %d req/s (%s each, every server warmed by a %s closed loop right before its run): %s back to back, the order rotating by set; servers pinned to CPU 0 with GOMAXPROCS=%d. Latencies in ms. Every set:\n\n",
		len(r.latencySets), r.opts.rate, r.opts.openSetDuration, r.opts.warmup, strings.Join(latencySetNames, ", "), r.opts.serverProcs)
	w("| set | first | bare p50 | gateway-redis p50 | nocoalesce p50 | bare p99 | gateway-redis p99 | nocoalesce p99 | errors (bare / gw / nocoalesce) |\n|---|---|---|---|---|---|---|---|---|\n")
	for i, s := range r.latencySets {
		b, g, n := s.res["bare"], s.res["gateway-redis"], s.res["gateway-redis-nocoalesce"]
		w("| %d | %s | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %d / %d / %d |\n", i+1, s.first,
			b.p50, g.p50, n.p50, b.p99, g.p99, n.p99, b.errs, g.errs, n.errs)
	}
	p99 := func(o openResult) float64 { return o.p99 }
	dc, wc := r.setDiff("gateway-redis", "gateway-redis-nocoalesce", p99)
	db, wb := r.setDiff("gateway-redis", "bare", p99)
	n := len(r.latencySets)
	w("\np99, median over the sets of the difference within a set (range): gateway-redis − nocoalesce %+.2f ms (%s), slower in %d of %d sets; gateway-redis − bare %+.2f ms (%s), slower in %d of %d sets.\n",
		dc.med, dc.fmt(2), wc, n, db.med, db.fmt(2), wb, n)
	w("\nEvery request of every set, per server (pooled); resolution = how far the same server's quantile moves between the even and the odd sets (the largest of the three), the smallest difference this run can tell from noise:\n\n")
	w("| server | requests | errors | p50 | p99 | p99.9 |\n|---|---|---|---|---|---|\n")
	for _, n := range latencySetNames {
		reqs, errs := 0, 0
		for _, s := range r.latencySets {
			reqs += s.res[n].n
			errs += s.res[n].errs
		}
		w("| %s | %d | %d | %.3f | %.2f | %.2f |\n", n, reqs, errs,
			r.pooled(n, 0.5, everySet), r.pooled(n, 0.99, everySet), r.pooled(n, 0.999, everySet))
	}
	w("| resolution | | | %.3f | %.2f | %.2f |\n\n", r.resolution(0.5, latencySetNames...),
		r.resolution(0.99, latencySetNames...), r.resolution(0.999, latencySetNames...))
}
