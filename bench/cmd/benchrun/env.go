package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/docsgate/gateway/bench/internal/child"
)

type variant struct {
	name  string
	kind  string // direct, bare, gateway
	store string // gateway only: memory, redis, cluster, replicated, wait1
	// base: the gateway built from the base revision (scripts/bench.sh BASE=<rev>), to compare
	// a change with what it changes in the same run.
	base bool
}

var variants = []variant{
	{"direct", "direct", "", false},
	{"bare", "bare", "", false},
	{"gateway-memory", "gateway", "memory", false},
	{"gateway-redis", "gateway", "redis", false},
	// gateway-redis with every feature of config.example.yaml on (fullConfig): keys looked up
	// in the Redis registry, the streamed routes' six limits (tokens with a reserve held and
	// settled, a streams slot), usage history and run-time quota checks (always on), and
	// tracing at its default ratio (1.0) into a collector that discards (otlpSink).
	{"gateway-full", "gateway", "full", false},
	// The same without coalescing (redis.coalesce: false): each decision its own write/read.
	{"gateway-redis-nocoalesce", "gateway", "redis-nocoalesce", false},
	// The same with net/http's Transport to the upstream (upstream.transport: standard)
	// instead of the gateway's own pool: what the pool is worth.
	{"gateway-redis-stdtransport", "gateway", "redis-stdtransport", false},
	{"gateway-cluster", "gateway", "cluster", false},
	// A master with one replica, without and with redis.wait_replicas: 1: the difference is
	// what waiting for the replica's acknowledgement costs.
	{"gateway-replicated", "gateway", "replicated", false},
	{"gateway-wait1", "gateway", "wait1", false},
}

// baseVariant is gateway-redis built from the base revision (bin/gateway-base, which
// scripts/bench.sh builds when BASE names one): with it, the rounds and the base pairs measure
// the working tree against the base in one run.
var baseVariant = variant{"gateway-redis-base", "gateway", "redis", true}

// fullBaseVariant is gateway-full built from the base revision: it runs only in the base
// pairs, against gateway-full, for a change that only registry mode (or another feature of the
// full config) meets, such as recording the keys' last use.
var fullBaseVariant = variant{"gateway-full-base", "gateway", "full", true}

// notifyVariant is gateway-redis with notifications on: a webhook to a sink of benchrun's,
// thresholds and a forecast on every limit, which no request crosses. It runs only in the
// notification pairs (-notify-pairs): what notifications cost a request that crosses nothing.
var notifyVariant = variant{"gateway-redis-notify", "gateway", "redis-notify", false}

func variantNames() []string {
	var n []string
	for _, v := range variants {
		n = append(n, v.name)
	}
	return n
}

func selectVariants(list string) []variant {
	var out []variant
	for _, name := range strings.Split(list, ",") {
		for _, v := range variants {
			if v.name == strings.TrimSpace(name) {
				out = append(out, v)
			}
		}
	}
	return out
}

// upstream is one shared upstream-sim (on the "other" CPU); direct runs a fresh copy of it.
type upstream struct {
	args []string
	url  string
	proc *child.Proc
}

type env struct {
	o                   options
	procs               *child.Group // every process it starts
	dir                 string
	gateway, sim, bare  string
	gatewayBase         string // bin/gateway-base; "" when there is none (no BASE)
	cpuServer, cpuRest  string
	redis               *redisNode
	cluster             []*redisNode
	replMaster, replica *redisNode // for gateway-replicated and gateway-wait1
	fast, stamp, idle   *upstream
	scripts             map[string]string
	hookSink            string // a webhook endpoint answering 204, for gateway-redis-notify
	stopSink            func()
	otlp                string // gateway-full's trace collector (otlpSink), its base URL
}

const adminToken = "bench-admin-token-0123456789abcdef"

func newEnv(o options, procs *child.Group) (*env, error) {
	e := &env{o: o, procs: procs, scripts: map[string]string{}}
	var err error
	if e.dir, err = os.MkdirTemp("", "gateway-bench-"); err != nil {
		return nil, err
	}
	for _, p := range []*string{&e.gateway, &e.sim, &e.bare} {
		_ = p
	}
	e.gateway = filepath.Join(o.bin, "gateway")
	if base := filepath.Join(o.bin, "gateway-base"); fileExists(base) {
		e.gatewayBase = base
	}
	e.sim = filepath.Join(o.bin, "upstream-sim")
	e.bare = filepath.Join(o.bin, "bare")
	for _, b := range []string{e.gateway, e.sim, e.bare} {
		if _, err := os.Stat(b); err != nil {
			return nil, fmt.Errorf("missing binary %s (scripts/bench.sh builds them)", b)
		}
	}
	for _, tool := range []string{"wrk", "redis-server", "redis-cli"} {
		if _, err := exec.LookPath(tool); err != nil {
			return nil, fmt.Errorf("%s not found (scripts/bench.sh installs it)", tool)
		}
	}
	if o.pin {
		if _, err := exec.LookPath("taskset"); err == nil {
			e.cpuServer, e.cpuRest = "0", "1"
		} else {
			logf("taskset not found: not pinning CPUs")
		}
	}
	ok := false
	defer func() {
		if !ok {
			e.close()
		}
	}()
	logf("starting redis-server and a 3-master cluster")
	if e.redis, err = startRedis(e.procs, e.dir, e.cpuRest, false); err != nil {
		return nil, err
	}
	if e.cluster, err = startCluster(e.procs, e.dir, e.cpuRest); err != nil {
		return nil, err
	}
	if strings.Contains(o.variants, "gateway-replicated") || strings.Contains(o.variants, "gateway-wait1") {
		logf("starting a redis-server with one replica")
		if e.replMaster, e.replica, err = startReplicated(e.procs, e.dir, e.cpuRest); err != nil {
			return nil, err
		}
	}
	e.fast = &upstream{args: []string{"-fast"}}
	e.stamp = &upstream{args: []string{"-stamp", "-part-delay", "10ms", "-answer-parts", "10"}}
	e.idle = &upstream{args: []string{"-part-delay", "10m", "-answer-parts", "1"}}
	for i, u := range []*upstream{e.fast, e.stamp, e.idle} {
		port := child.FreePort()
		u.url = fmt.Sprintf("http://127.0.0.1:%d", port)
		args := append([]string{"-listen", fmt.Sprintf("127.0.0.1:%d", port)}, u.args...)
		if u.proc, err = e.procs.Start("upstream-sim", e.cpuRest, e.procsEnv(), filepath.Join(e.dir, fmt.Sprintf("upstream-%d.log", i)), e.sim, args...); err != nil {
			return nil, err
		}
		if err := child.WaitHTTP(u.proc, u.url+"/healthz", 10*time.Second); err != nil {
			return nil, err
		}
	}
	for _, w := range allWorkloads {
		if e.scripts[w.name], err = wrkScript(e.dir, w); err != nil {
			return nil, err
		}
	}
	if e.hookSink, e.stopSink, err = startSink(); err != nil {
		return nil, err
	}
	if strings.Contains(o.variants, "gateway-full") {
		if e.otlp, err = otlpSink(); err != nil {
			return nil, err
		}
	}
	ok = true
	return e, nil
}

// startSink serves a webhook endpoint on loopback that accepts every delivery (204).
func startSink() (string, func(), error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusNoContent)
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String() + "/hooks", func() { _ = srv.Close() }, nil
}

func (e *env) procsEnv() []string {
	return []string{"GOMAXPROCS=" + strconv.Itoa(e.o.serverProcs)}
}

func (e *env) close() {
	if e.stopSink != nil {
		e.stopSink()
	}
	for _, u := range []*upstream{e.fast, e.stamp, e.idle} {
		if u != nil {
			u.proc.Stop()
		}
	}
	e.redis.stop()
	e.replica.stop()
	e.replMaster.stop()
	for _, n := range e.cluster {
		n.stop()
	}
	if e.dir != "" {
		os.RemoveAll(e.dir)
	}
}

// server is one started server under test.
type server struct {
	v       variant
	proc    *child.Proc
	url     string
	admin   string
	logPath string
	nodes   []*redisNode // the Redis it calls, for commandstats
}

func (e *env) start(v variant, up *upstream) (*server, error) {
	ports := child.FreePorts(2) // public and (gateway) admin
	port, adminPort := ports[0], ports[1]
	s := &server{v: v, url: fmt.Sprintf("http://127.0.0.1:%d", port)}
	s.logPath = filepath.Join(e.dir, fmt.Sprintf("%s-%d.log", v.name, port))
	var err error
	switch v.kind {
	case "direct":
		args := append([]string{"-listen", fmt.Sprintf("127.0.0.1:%d", port)}, up.args...)
		s.proc, err = e.procs.Start(v.name, e.cpuServer, e.procsEnv(), s.logPath, e.sim, args...)
		if err == nil {
			err = child.WaitHTTP(s.proc, s.url+"/healthz", 10*time.Second)
		}
	case "bare":
		s.nodes = []*redisNode{e.redis}
		s.admin = fmt.Sprintf("http://127.0.0.1:%d", adminPort) // its profiles only
		s.proc, err = e.procs.Start(v.name, e.cpuServer, e.procsEnv(), s.logPath, e.bare,
			"-listen", fmt.Sprintf("127.0.0.1:%d", port), "-upstream", up.url, "-redis", e.redis.addr,
			"-pprof", fmt.Sprintf("127.0.0.1:%d", adminPort))
		if err == nil {
			err = child.WaitHTTP(s.proc, s.url+"/healthz", 10*time.Second)
		}
	case "gateway":
		s.admin = fmt.Sprintf("http://127.0.0.1:%d", adminPort)
		var addrs []string
		switch v.store {
		case "redis", "redis-nocoalesce", "redis-stdtransport", "redis-notify", "full":
			s.nodes = []*redisNode{e.redis}
		case "cluster":
			s.nodes = e.cluster
		case "replicated", "wait1":
			s.nodes = []*redisNode{e.replMaster}
		}
		for _, n := range s.nodes {
			addrs = append(addrs, n.addr)
		}
		wait, coalesce, transport := 0, v.store != "redis-nocoalesce", "pool"
		if v.store == "redis-stdtransport" {
			transport = "standard"
		}
		if v.store == "wait1" {
			wait = 1
		}
		cfgPath := filepath.Join(e.dir, fmt.Sprintf("%s-%d.yaml", v.name, port))
		cfg := gatewayConfig(port, adminPort, up.url, addrs, wait, coalesce, transport)
		if v.store == "redis-notify" {
			cfg = notifyConfig(cfg, e.hookSink)
		}
		if v.store == "full" {
			cfg = fullConfig(cfg, e.otlp)
		}
		if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
			return nil, err
		}
		bin := e.gateway
		if v.base {
			bin = e.gatewayBase
		}
		s.proc, err = e.procs.Start(v.name, e.cpuServer, e.procsEnv(), s.logPath, bin, "-config", cfgPath)
		if err == nil {
			err = child.WaitHTTP(s.proc, s.admin+"/readyz", 10*time.Second)
		}
		if err == nil && v.store == "full" {
			err = registerKeys(s.admin)
		}
	}
	if err != nil {
		if s.proc != nil {
			s.proc.Stop()
		}
		b, _ := os.ReadFile(s.logPath)
		return nil, fmt.Errorf("%v\n%s", err, tail(b, 2000))
	}
	return s, nil
}

func (s *server) stop() {
	s.proc.Stop()
	os.Remove(s.logPath)
}

// logLines counts the access-log lines written so far (the gateway logs one per request).
func (s *server) logLines() int {
	b, _ := os.ReadFile(s.logPath)
	return strings.Count(string(b), `"msg":"request"`)
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// gatewayConfig: everything on (auth, validation, all route limits, metrics, access logs at
// info to stderr, which the bench sends to a file, batched by log.buffer as an operator would
// run it under load), limits too high to deny, plus a route whose limit is 1 per hour for the
// 429 path.
func gatewayConfig(port, adminPort int, upstream string, redisAddrs []string, waitReplicas int, coalesce bool, transport string) string {
	addrs := "[]"
	if len(redisAddrs) > 0 {
		addrs = `["` + strings.Join(redisAddrs, `", "`) + `"]`
	}
	return fmt.Sprintf(`listen: "127.0.0.1:%d"
admin_listen: "127.0.0.1:%d"
admin_token: %q
upstream:
  url: %q
  transport: %s
server:
  shutdown_grace: 2s
log:
  level: info
  format: json
  buffer: 262144
routes:
  - name: tiny_job
    method: POST
    path: /v2/agent/{projectId}/tiny
    key: admin
    limits: [tiny_per_project]
# The 401/429 mix comes from one address: no failure budget in the way of the measurement.
auth:
  failure_limit: 0
redis:
  addrs: %s
  wait_replicas: %d
  coalesce: %t
limits:
  agent_job_per_project: { limit: 1000000000 }
  assistant_per_key:     { limit: 1000000000 }
  assistant_per_org:     { limit: 1000000000 }
  assistant_per_ip:      { limit: 1000000000 }
  tiny_per_project:      { limit: 1, window: hour, by: project }
`, port, adminPort, adminToken, upstream, transport, addrs, waitReplicas, coalesce)
}

// notifyConfig turns notifications on in cfg, to the webhook at sink: the default thresholds
// on every limit, and a forecast on agent_job's.
func notifyConfig(cfg, sink string) string {
	cfg = strings.Replace(cfg, "agent_job_per_project: { limit: 1000000000 }", "agent_job_per_project: { limit: 1000000000, forecast: true }", 1)
	return cfg + fmt.Sprintf(`notifications:
  webhooks:
    - {name: sink, url: %q, secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", allow_private_addresses: true}
`, sink)
}

// httpSample is one (round, workload, variant) measurement.
type httpSample struct {
	round             int
	workload, variant string
	kind              string

	closed      wrkResult
	closedErrs  int64
	closedCPU1k float64 // CPU seconds of the server under test per 1,000 requests
	// Redis, over the closed loop, per request: CPU µs (every node), bytes in and out.
	redisCPUus, redisBytesIn, redisBytesOut float64
	open                                    openResult
	openCPU1k                               float64
	openScripts                             []float64 // per node, per request
	openOther                               float64   // other Redis commands per request
	load                                    float64   // 1-minute load average at the end of the block
	logLines                                int
	logExpected                             int64
	probes                                  []probeSample
}

type probeSample struct {
	label   string
	codes   map[int]int
	scripts []float64 // per node, per request
}

// closedRun is one closed-loop run of d against srv, and the CPU seconds srv spent in it.
func (e *env) closedRun(srv *server, w workload, script string, d time.Duration) (wrkResult, float64, error) {
	cpu0 := srv.proc.CPUSeconds()
	r, err := runWrk(srv.url, w, script, e.o.conns, d)
	return r, srv.proc.CPUSeconds() - cpu0, err
}

func (e *env) measureHTTP(round int, v variant, w workload) (httpSample, error) {
	s := httpSample{round: round, workload: w.name, variant: v.name, kind: v.kind}
	srv, err := e.start(v, e.fast)
	if err != nil {
		return s, err
	}
	defer srv.stop()
	script := e.scripts[w.name]
	// Warm-up: connections, pools, scripts loaded, the 429 limit used up.
	if _, err := runWrk(srv.url, w, script, e.o.conns, e.o.warmup); err != nil {
		return s, err
	}
	linesBefore := srv.logLines()

	rs0 := redisUsage(srv.nodes)
	closed, cpu, err := e.closedRun(srv, w, script, e.o.duration)
	if err != nil {
		return s, err
	}
	s.closed = closed
	if rs := redisUsage(srv.nodes).sub(rs0); s.closed.reqs > 0 && len(srv.nodes) > 0 {
		n := float64(s.closed.reqs)
		s.redisCPUus, s.redisBytesIn, s.redisBytesOut = rs.cpu*1e6/n, rs.in/n, rs.out/n
	}
	s.closedErrs = s.closed.sockEr
	if len(w.reqs) == 1 { // the mix answers non-2xx by design; checked exactly in the open loop
		s.closedErrs += s.closed.non2xx
	}
	if s.closed.reqs > 0 {
		s.closedCPU1k = cpu / float64(s.closed.reqs) * 1000
	}

	rc0 := snapshot(srv.nodes)
	cpu0 := srv.proc.CPUSeconds()
	s.open = runOpen(srv.url, v.kind, w, e.o.rate, e.o.duration)
	s.open.lat = nil // the rounds keep quantiles only; the latency sets pool every latency
	cpu1 := srv.proc.CPUSeconds()
	d := snapshot(srv.nodes).sub(rc0)
	if s.open.n > 0 {
		s.openCPU1k = (cpu1 - cpu0) / float64(s.open.n) * 1000
		for _, x := range d.scripts {
			s.openScripts = append(s.openScripts, float64(x)/float64(s.open.n))
		}
		s.openOther = float64(sum(d.other)) / float64(s.open.n)
	}
	if len(s.open.unexpected) > 0 {
		logf("  unexpected answers: %v", s.open.unexpected)
	}

	if len(srv.nodes) > 0 {
		if v.kind == "gateway" {
			// An overloaded open loop may have opened a limiter breaker: let it close (the
			// probes below count script calls). /readyz does not follow Redis; /metrics does.
			waitBreakersClosed(srv.admin+"/metrics", 5*time.Second)
		}
		for _, r := range w.reqs {
			before := snapshot(srv.nodes)
			codes, err := probe(srv.url, r, e.o.probeN)
			if err != nil {
				return s, fmt.Errorf("probe %s: %v", r.label, err)
			}
			dd := snapshot(srv.nodes).sub(before)
			ps := probeSample{label: r.label, codes: codes}
			for _, x := range dd.scripts {
				ps.scripts = append(ps.scripts, float64(x)/float64(e.o.probeN))
			}
			s.probes = append(s.probes, ps)
		}
	}
	s.load = loadAvg()
	if v.kind == "gateway" {
		time.Sleep(100 * time.Millisecond)
		s.logLines = srv.logLines() - linesBefore
		s.logExpected = s.closed.reqs + int64(s.open.n) + int64(len(s.probes)*e.o.probeN)
	}
	logf("load %.2f", s.load)
	logf("round %d %-18s %-16s closed %8.0f req/s (err %d, %.3f CPU s/1k)  open@%d p50 %.2f p99 %.2f p99.9 %.2f ms err %d  scripts/req %v",
		round+1, w.name, v.name, s.closed.rps, s.closedErrs, s.closedCPU1k, e.o.rate, s.open.p50, s.open.p99, s.open.p999, s.open.errs, fmtPerNode(s.openScripts))
	return s, nil
}

type streamSample struct {
	round   int
	variant string
	proto   string // "v1" (data stream) or "v2" (UI message stream)
	delay   delayResult
	idle    idleResult
}

// measureStreams measures the per-part delay and the memory of idle streams of variant v, on
// each stream protocol.
func (e *env) measureStreams(round int, v variant) ([]streamSample, error) {
	var out []streamSample
	for _, proto := range streamProtocols {
		s := streamSample{round: round, variant: v.name, proto: proto}
		srv, err := e.start(v, e.stamp)
		if err != nil {
			return out, err
		}
		s.delay = runDelay(srv.url, proto, e.o.delayConc, e.o.duration)
		srv.stop()
		if e.o.streams > 0 {
			srv, err := e.start(v, e.idle)
			if err != nil {
				return out, err
			}
			s.idle = runIdle(srv.proc, srv.url, proto, e.o.streams, 60*time.Second)
			srv.stop()
			time.Sleep(time.Second) // let the simulator and the kernel drop the closed streams
		}
		logf("round %d streams %s %-16s part delay p50 %.0f µs p99 %.0f µs (%d parts, %d errors)  idle: %d streams, RSS %d -> %d KiB = %.1f KiB/stream (opened in %s) %s",
			round+1, proto, v.name, s.delay.p50, s.delay.p99, s.delay.parts, s.delay.errs, s.idle.opened, s.idle.before, s.idle.after, s.idle.perStreamKiB,
			s.idle.openTime.Round(time.Millisecond), s.idle.firstErr)
		out = append(out, s)
	}
	return out, nil
}

// profile runs gateway-redis under the closed-loop load of -profile-workload (agent_job by
// default) and saves a CPU profile and an allocation profile from the admin listener's
// /debug/pprof/, with their top lists.
func (e *env) profile(d time.Duration, dir string, rep *report) error {
	v := selectVariants(e.o.profileVariant)[0]
	srv, err := e.start(v, e.fast)
	if err != nil {
		return err
	}
	defer srv.stop()
	w, ok := workloadNamed(e.o.profileWorkload)
	if !ok || e.scripts[w.name] == "" {
		return fmt.Errorf("-profile-workload %q: not a closed-loop workload of this run", e.o.profileWorkload)
	}
	logf("profiling %s under %s load for %s", v.name, w.name, d)
	done := make(chan error, 1)
	go func() {
		_, err := runWrk(srv.url, w, e.scripts[w.name], e.o.conns, d+2*time.Second)
		done <- err
	}()
	time.Sleep(time.Second)
	cpuPath := filepath.Join(dir, "profile-cpu.pb.gz")
	if err := fetchProfile(srv.admin+fmt.Sprintf("/debug/pprof/profile?seconds=%d", int(d.Seconds())), cpuPath, d+30*time.Second); err != nil {
		return err
	}
	allocPath := filepath.Join(dir, "profile-allocs.pb.gz")
	if err := fetchProfile(srv.admin+"/debug/pprof/allocs", allocPath, 30*time.Second); err != nil {
		return err
	}
	if err := <-done; err != nil {
		return err
	}
	rep.profileVariant, rep.profileWorkload = v.name, w.name
	bin := e.gateway
	if v.kind == "bare" {
		bin = e.bare
	}
	rep.profileCPU = pprofTop(bin, cpuPath, "-top", "-nodecount=25")
	rep.profileCPUCum = pprofTop(bin, cpuPath, "-top", "-cum", "-nodecount=40")
	rep.profileAllocs = pprofTop(bin, allocPath, "-top", "-sample_index=alloc_objects", "-nodecount=25")
	for name, text := range map[string]string{"profile-cpu.txt": rep.profileCPU + "\n\n" + rep.profileCPUCum, "profile-allocs.txt": rep.profileAllocs} {
		_ = os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644)
	}
	return nil
}

func fetchProfile(url, path string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("%s: %s %s", url, resp.Status, b)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(f, resp.Body)
	return err
}

func pprofTop(bin, path string, args ...string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "go", append(append([]string{"tool", "pprof"}, args...), bin, path)...).CombinedOutput()
	if err != nil {
		return fmt.Sprintf("go tool pprof: %v\n%s", err, out)
	}
	return strings.TrimSpace(string(out))
}

// waitBreakersClosed polls the gateway's metrics until no gateway_ratelimit_breaker_open series is 1,
// or timeout passes.
func waitBreakersClosed(url string, timeout time.Duration) {
	c := &http.Client{Timeout: 500 * time.Millisecond}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		resp, err := c.Get(url)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			open := false
			for _, line := range strings.Split(string(b), "\n") {
				if strings.HasPrefix(line, "gateway_ratelimit_breaker_open{") && strings.HasSuffix(line, " 1") {
					open = true
				}
			}
			if resp.StatusCode == 200 && !open {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// loadAvg is the 1-minute load average: on 2 cores, well above 2 means other work competed
// with the bench (its own processes account for about 2 under closed-loop load).
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
