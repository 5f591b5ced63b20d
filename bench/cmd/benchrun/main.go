// Command benchrun is the gateway's benchmark suite (make bench): it starts the upstream
// simulator, Redis (standalone and a 3-master Cluster) and, one at a time, each server under
// test (direct, bare, gateway-memory, gateway-redis, gateway-cluster), drives them with wrk
// (closed loop) and vegeta (open loop, as a library), reads CPU and RSS from /proc and Redis
// commands from INFO commandstats, and writes a Markdown report.
//
// Rounds are interleaved: every round runs every workload on every variant in turn (the
// order rotating by round), so a noisy machine hits all variants alike; the report shows the
// median over rounds and the spread (min-max).
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/docsgate/gateway/bench/internal/child"
)

type options struct {
	bin             string
	out             string
	goBench         string
	allocTraces     string
	allocN          int
	rounds          int
	pairs           int
	pairDuration    time.Duration
	openSets        int
	openSetDuration time.Duration
	duration        time.Duration
	warmup          time.Duration
	conns           int
	rate            int
	streams         int
	delayConc       int
	probeN          int
	pin             bool
	profile         time.Duration
	profileWorkload string
	profileVariant  string
	variants        string
	notifyPairs     int
	workloads       string
	serverProcs     int
	source          string
	base            string // the base revision gateway-base was built from, for the report
}

func main() {
	var o options
	flag.StringVar(&o.bin, "bin", "bin", "directory holding gateway, upstream-sim and bare")
	flag.StringVar(&o.out, "out", "bench/results/latest.md", "Markdown report to write")
	flag.StringVar(&o.goBench, "gobench", "", "go test -bench output to include (optional)")
	flag.StringVar(&o.allocTraces, "alloc-traces", "", "`go tool pprof -sample_index=alloc_objects -traces` of BenchmarkGatewayAgentJob run with -memprofilerate 1 (optional)")
	flag.IntVar(&o.allocN, "alloc-n", 0, "iterations of BenchmarkGatewayAgentJob in -alloc-traces (b.N of every run, summed)")
	flag.IntVar(&o.rounds, "rounds", 3, "interleaved rounds")
	flag.IntVar(&o.pairs, "pairs", 10, "back-to-back pairs of bare and gateway-redis closed-loop runs on agent_job, assistant_message and assistant_message_v2 (each when selected; 0: skip)")
	flag.DurationVar(&o.pairDuration, "pair-duration", 3*time.Second, "length of each paired run")
	flag.IntVar(&o.openSets, "open-sets", 12, "back-to-back sets of bare, gateway-redis and gateway-redis-nocoalesce open-loop runs on agent_job, the six orders in turn (a multiple of 6 balances them; at least 6 for a verdict; 0: skip)")
	flag.DurationVar(&o.openSetDuration, "open-set-duration", 3*time.Second, "length of each open-loop run of a set")
	flag.DurationVar(&o.duration, "duration", 4*time.Second, "length of each closed-loop and open-loop run")
	flag.DurationVar(&o.warmup, "warmup", time.Second, "closed-loop warm-up before each measurement (not counted)")
	flag.IntVar(&o.conns, "conns", 50, "closed-loop connections (wrk -t1)")
	flag.IntVar(&o.rate, "rate", 2000, "open-loop rate, requests per second")
	flag.IntVar(&o.streams, "streams", 5000, "open idle streams for RSS per stream (0: skip)")
	flag.IntVar(&o.delayConc, "delay-conc", 20, "concurrent streams for the per-part delay")
	flag.IntVar(&o.probeN, "probe", 400, "requests per Redis-count probe")
	flag.BoolVar(&o.pin, "pin", true, "pin the server under test to CPU 0 and everything else to CPU 1 (taskset)")
	flag.DurationVar(&o.profile, "profile", 10*time.Second, "CPU profile of gateway-redis under -profile-workload's load after the rounds (0: skip)")
	flag.StringVar(&o.profileWorkload, "profile-workload", "agent_job", "the workload the profile is taken under (one of -workloads)")
	flag.StringVar(&o.profileVariant, "profile-variant", "gateway-redis", "the variant profiled (one of -variants)")
	flag.IntVar(&o.notifyPairs, "notify-pairs", 6, "pairs of agent_job runs of gateway-redis with notifications off and on (0: skip)")
	flag.StringVar(&o.variants, "variants", strings.Join(variantNames(), ","), "variants to run")
	flag.StringVar(&o.workloads, "workloads", "agent_job,assistant_message,assistant_message_v2,401/429 mix,streams", "workloads to run (streams: per-part delay and idle streams, on v1 and v2)")
	flag.IntVar(&o.serverProcs, "gomaxprocs", 1, "GOMAXPROCS of the server under test and of the upstream simulator")
	flag.StringVar(&o.source, "source", "", "what was measured (revision), for the report")
	flag.StringVar(&o.base, "base", "", "the revision bin/gateway-base was built from, for the report (the variant gateway-redis-base and the base pairs run when that binary exists)")
	flag.Parse()

	procs := &child.Group{}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-sig
		fmt.Fprintln(os.Stderr, "bench: interrupted; stopping children")
		procs.StopAll()
		os.Exit(130)
	}()
	code := run(o, procs)
	procs.StopAll()
	os.Exit(code)
}

func run(o options, procs *child.Group) int {
	start := time.Now()
	e, err := newEnv(o, procs)
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		return 1
	}
	defer e.close()
	rep := &report{opts: o, started: start}
	vs := selectVariants(o.variants)
	if e.gatewayBase != "" && hasVariant(vs, "gateway-redis") {
		vs = append(vs, baseVariant) // interleaved with the others in every round
	}
	wls := map[string]bool{}
	for _, w := range strings.Split(o.workloads, ",") {
		wls[strings.TrimSpace(w)] = true
	}
	for r := 0; r < o.rounds; r++ {
		order := rotate(vs, r)
		for _, w := range allWorkloads {
			if !wls[w.name] {
				continue
			}
			for _, v := range order {
				s, err := e.measureHTTP(r, v, w)
				if err != nil {
					fmt.Fprintf(os.Stderr, "bench: round %d %s %s: %v\n", r+1, w.name, v.name, err)
					return 1
				}
				rep.http = append(rep.http, s)
			}
		}
		if wls["streams"] {
			for _, v := range order {
				s, err := e.measureStreams(r, v)
				if err != nil {
					fmt.Fprintf(os.Stderr, "bench: round %d streams %s: %v\n", r+1, v.name, err)
					return 1
				}
				rep.streams = append(rep.streams, s...)
			}
		}
	}
	if o.pairs > 0 && hasVariant(vs, "gateway-redis") && hasVariant(vs, "bare") {
		// The throughput ratios against bare: agent_job, and both streamed routes.
		for _, w := range allWorkloads {
			if !wls[w.name] || (w.name != "agent_job" && w.name != "assistant_message" && w.name != "assistant_message_v2") {
				continue
			}
			pairs, err := e.measurePairs(w, "gateway-redis", o.pairs, o.pairDuration)
			if err != nil {
				fmt.Fprintf(os.Stderr, "bench: pairs %s: %v\n", w.name, err)
				return 1
			}
			rep.pairs = append(rep.pairs, pairs...)
		}
	}
	if o.pairs > 0 && e.gatewayBase != "" && hasVariant(vs, "gateway-redis") {
		// The working tree against the base revision, paired: agent_job and both streamed routes.
		for _, w := range allWorkloads {
			if !wls[w.name] || (w.name != "agent_job" && w.name != "assistant_message" && w.name != "assistant_message_v2") {
				continue
			}
			pairs, err := e.measurePairsOf(baseVariant, selectVariants("gateway-redis")[0], w, o.pairs, o.pairDuration)
			if err != nil {
				fmt.Fprintf(os.Stderr, "bench: base pairs %s: %v\n", w.name, err)
				return 1
			}
			rep.basePairs = append(rep.basePairs, pairs...)
		}
	}
	if o.pairs > 0 && e.gatewayBase != "" && hasVariant(vs, "gateway-full") {
		// The same in registry mode with every feature on: agent_job and the v1 stream.
		for _, w := range allWorkloads {
			if !wls[w.name] || (w.name != "agent_job" && w.name != "assistant_message") {
				continue
			}
			pairs, err := e.measurePairsOf(fullBaseVariant, selectVariants("gateway-full")[0], w, o.pairs, o.pairDuration)
			if err != nil {
				fmt.Fprintf(os.Stderr, "bench: full base pairs %s: %v\n", w.name, err)
				return 1
			}
			rep.basePairs = append(rep.basePairs, pairs...)
		}
	}
	if o.pairs > 0 && wls["agent_job"] && hasVariant(vs, "gateway-full") && hasVariant(vs, "bare") {
		// agent_job with every feature of the example config on (the 1.3× target).
		pairs, err := e.measurePairs(allWorkloads[0], "gateway-full", o.pairs, o.pairDuration)
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: pairs agent_job gateway-full: %v\n", err)
			return 1
		}
		rep.pairs = append(rep.pairs, pairs...)
	}
	if o.notifyPairs > 0 && wls["agent_job"] && hasVariant(vs, "gateway-redis") {
		// What notifications cost a request that crosses nothing.
		w := allWorkloads[0]
		pairs, err := e.measurePairsOf(selectVariants("gateway-redis")[0], notifyVariant, w, o.notifyPairs, o.pairDuration)
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: notification pairs: %v\n", err)
			return 1
		}
		rep.notifyPairs = pairs
	}
	if o.openSets > 0 && wls["agent_job"] && hasVariant(vs, "bare") && hasVariant(vs, "gateway-redis") && hasVariant(vs, "gateway-redis-nocoalesce") {
		sets, err := e.measureLatencySets(o.openSets, o.openSetDuration)
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: open sets: %v\n", err)
			return 1
		}
		rep.latencySets = sets
	}
	if o.profile > 0 && hasVariant(vs, o.profileVariant) {
		if err := e.profile(o.profile, filepath.Dir(o.out), rep); err != nil {
			fmt.Fprintf(os.Stderr, "bench: profile: %v\n", err)
		}
	}
	if o.allocTraces != "" && o.allocN > 0 {
		if a, err := readAllocTraces(o.allocTraces, o.allocN); err == nil {
			rep.allocs = &a
		} else {
			fmt.Fprintf(os.Stderr, "bench: allocation traces: %v\n", err)
		}
	}
	if o.goBench != "" {
		if b, err := os.ReadFile(o.goBench); err == nil {
			rep.goBench = string(b)
		}
	}
	rep.elapsed = time.Since(start)
	md := rep.markdown()
	if err := os.MkdirAll(filepath.Dir(o.out), 0o755); err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		return 1
	}
	if err := os.WriteFile(o.out, []byte(md), 0o644); err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		return 1
	}
	fmt.Println(md)
	fmt.Fprintf(os.Stderr, "bench: wrote %s in %s\n", o.out, rep.elapsed.Round(time.Second))
	return 0
}

// placement says where the servers under test ran, for a report's text.
func (o options) placement(servers string) string {
	if o.pin {
		return servers + " pinned to CPU 0"
	}
	return servers + " unpinned"
}

func rotate(vs []variant, r int) []variant {
	out := make([]variant, 0, len(vs))
	for i := range vs {
		out = append(out, vs[(i+r)%len(vs)])
	}
	return out
}

func hasVariant(vs []variant, name string) bool {
	for _, v := range vs {
		if v.name == name {
			return true
		}
	}
	return false
}

func logf(format string, a ...any) {
	fmt.Fprintf(os.Stderr, time.Now().Format("15:04:05 ")+format+"\n", a...)
}
