package main

import (
	"fmt"
	"time"
)

// pairSample is one pair of back-to-back closed-loop runs of a workload: bare and a gateway
// variant (gateway-redis; gateway-full on agent_job), one right after the other (alternating which goes first), so that the machine's slower and
// faster spells hit both alike. On a shared machine whose speed drifts by tens of percent
// within a minute, the ratio within a pair is far steadier than the ratio of runs a round
// apart.
type pairSample struct {
	workload, variant  string // variant: the gateway's
	gatewayFirst       bool
	bare, gateway      float64 // closed-loop req/s
	bareCPU, gwCPU     float64 // CPU µs per request of the server under test
	bareErrs, gwErrors int64
}

func (p pairSample) ratio() float64 {
	if p.bare == 0 {
		return 0
	}
	return p.gateway / p.bare
}

// measurePairs runs n pairs of d each of workload w, bare against the gateway variant gw.
func (e *env) measurePairs(w workload, gw string, n int, d time.Duration) ([]pairSample, error) {
	return e.measurePairsOf(selectVariants("bare")[0], selectVariants(gw)[0], w, n, d)
}

// measurePairsOf runs n pairs of d each of workload w, of variants base and test (reported as
// the pair's bare and gateway). Both servers stay up for all pairs (each idle while the other
// is loaded), each warmed up before its run.
func (e *env) measurePairsOf(base, test variant, w workload, n int, d time.Duration) ([]pairSample, error) {
	script := e.scripts[w.name]
	var servers [2]*server
	for i, v := range []variant{base, test} {
		srv, err := e.start(v, e.fast)
		if err != nil {
			return nil, err
		}
		defer srv.stop()
		servers[i] = srv
	}
	run := func(srv *server) (rps, cpuUS float64, errs int64, err error) {
		if _, err := runWrk(srv.url, w, script, e.o.conns, e.o.warmup); err != nil {
			return 0, 0, 0, err
		}
		r, cpu, err := e.closedRun(srv, w, script, d)
		if err != nil {
			return 0, 0, 0, err
		}
		if r.reqs > 0 {
			cpuUS = cpu / float64(r.reqs) * 1e6
		}
		return r.rps, cpuUS, r.sockEr + r.non2xx, nil
	}
	var out []pairSample
	for i := range n {
		p := pairSample{workload: w.name, variant: test.name, gatewayFirst: i%2 == 1}
		order := []int{0, 1}
		if p.gatewayFirst {
			order = []int{1, 0}
		}
		for _, k := range order {
			rps, cpu, errs, err := run(servers[k])
			if err != nil {
				return out, fmt.Errorf("pair %d: %w", i+1, err)
			}
			if k == 0 {
				p.bare, p.bareCPU, p.bareErrs = rps, cpu, errs
			} else {
				p.gateway, p.gwCPU, p.gwErrors = rps, cpu, errs
			}
		}
		logf("pair %d %s: %s %.0f req/s (%.1f µs CPU/req), %s %.0f req/s (%.1f µs CPU/req): %.3f×",
			i+1, w.name, base.name, p.bare, p.bareCPU, test.name, p.gateway, p.gwCPU, p.ratio())
		out = append(out, p)
	}
	return out, nil
}

// pairsTable writes every pair and the summary, per workload and gateway variant.
func (r *report) pairsTable(w func(string, ...any)) {
	for _, wl := range allWorkloads {
		for _, gw := range []string{"gateway-redis", "gateway-full"} {
			pairs := r.pairsOf(wl.name, gw)
			if len(pairs) == 0 {
				continue
			}
			w("## %s against bare, paired runs: %s\n\n%d pairs of closed-loop %s runs (%s each after a %s warm-up, wrk 1 thread %d connections), bare and %s back to back, alternating which goes first; %s with GOMAXPROCS=%d. Every pair:\n\n",
				gw, wl.name, len(pairs), wl.name, r.opts.pairDuration, r.opts.warmup, r.opts.conns, gw, r.opts.placement("both servers"), r.opts.serverProcs)
			w("| pair | first | bare req/s | %s req/s | × bare | bare CPU µs / req | gateway CPU µs / req | errors (bare / gateway) |\n|---|---|---|---|---|---|---|---|\n", gw)
			for i, p := range pairs {
				first := "bare"
				if p.gatewayFirst {
					first = "gateway"
				}
				w("| %d | %s | %.0f | %.0f | %.3f | %.1f | %.1f | %d / %d |\n", i+1, first, p.bare, p.gateway, p.ratio(), p.bareCPU, p.gwCPU, p.bareErrs, p.gwErrors)
			}
			st, below := r.pairStats(wl.name, gw)
			w("\nRatio over the pairs: median %.3f, min %.3f, max %.3f; %d of %d pairs below 1.0.\n\n", st.med, st.min, st.max, below, len(pairs))
		}
	}
}

// pairsOf are the pairs of one workload against one gateway variant.
func (r *report) pairsOf(workload, variant string) []pairSample {
	var out []pairSample
	for _, p := range r.pairs {
		if p.workload == workload && p.variant == variant {
			out = append(out, p)
		}
	}
	return out
}

func (r *report) pairStats(workload, variant string) (stat, int) {
	var v []float64
	below := 0
	for _, p := range r.pairsOf(workload, variant) {
		v = append(v, p.ratio())
		if p.ratio() < 1 {
			below++
		}
	}
	return statOf(v), below
}

// notifyPairsTable writes the pairs of gateway-redis against gateway-redis-notify.
func (r *report) notifyPairsTable(w func(string, ...any)) {
	if len(r.notifyPairs) == 0 {
		return
	}
	var v []float64
	w("## Notifications on against off, paired runs: agent_job\n\n%d pairs of closed-loop agent_job runs (%s each after a %s warm-up, wrk 1 thread %d connections), gateway-redis and gateway-redis-notify (the same with `notifications.webhooks` set, thresholds and a forecast on every limit, which no request crosses) back to back, alternating which goes first; %s with GOMAXPROCS=%d. Every pair:\n\n",
		len(r.notifyPairs), r.opts.pairDuration, r.opts.warmup, r.opts.conns, r.opts.placement("both servers"), r.opts.serverProcs)
	w("| pair | first | off req/s | on req/s | on / off | off CPU µs / req | on CPU µs / req | errors (off / on) |\n|---|---|---|---|---|---|---|---|\n")
	for i, p := range r.notifyPairs {
		first := "off"
		if p.gatewayFirst {
			first = "on"
		}
		w("| %d | %s | %.0f | %.0f | %.3f | %.1f | %.1f | %d / %d |\n", i+1, first, p.bare, p.gateway, p.ratio(), p.bareCPU, p.gwCPU, p.bareErrs, p.gwErrors)
		v = append(v, p.ratio())
	}
	st := statOf(v)
	w("\nRatio on / off over the pairs: median %.3f, min %.3f, max %.3f.\n\n", st.med, st.min, st.max)
}

// basePairsTable writes the pairs of the base revision against the working tree, per workload.
func (r *report) basePairsTable(w func(string, ...any)) {
	for _, v := range []string{"gateway-redis", "gateway-full"} {
		for _, wl := range allWorkloads {
			r.basePairsOf(w, v, wl)
		}
	}
}

// basePairsOf writes the pairs of variant v's base against v on workload wl, if any ran.
func (r *report) basePairsOf(w func(string, ...any), v string, wl workload) {
	var pairs []pairSample
	for _, p := range r.basePairs {
		if p.workload == wl.name && p.variant == v {
			pairs = append(pairs, p)
		}
	}
	if len(pairs) == 0 {
		return
	}
	w("## The working tree against the base revision, paired runs: %s, %s\n\n%d pairs of closed-loop %s runs (%s each after a %s warm-up, wrk 1 thread %d connections), %s-base (%s) and %s back to back, alternating which goes first; %s with GOMAXPROCS=%d. Every pair:\n\n",
		wl.name, v, len(pairs), wl.name, r.opts.pairDuration, r.opts.warmup, r.opts.conns, v, r.opts.base, v, r.opts.placement("both servers"), r.opts.serverProcs)
	w("| pair | first | base req/s | new req/s | new / base | base CPU µs / req | new CPU µs / req | errors (base / new) |\n|---|---|---|---|---|---|---|---|\n")
	var ratios, cpu []float64
	for i, p := range pairs {
		first := "base"
		if p.gatewayFirst {
			first = "new"
		}
		w("| %d | %s | %.0f | %.0f | %.3f | %.1f | %.1f | %d / %d |\n", i+1, first, p.bare, p.gateway, p.ratio(), p.bareCPU, p.gwCPU, p.bareErrs, p.gwErrors)
		ratios = append(ratios, p.ratio())
		if p.bareCPU > 0 {
			cpu = append(cpu, p.gwCPU/p.bareCPU)
		}
	}
	st, c := statOf(ratios), statOf(cpu)
	w("\nnew / base over the pairs: req/s median %.3f (min %.3f, max %.3f); CPU per request median %.3f (min %.3f, max %.3f).\n\n", st.med, st.min, st.max, c.med, c.min, c.max)
}
