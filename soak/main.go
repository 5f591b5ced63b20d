// Command soak runs mixed traffic against replicas while Redis fails over and the upstream flaps.
//
// Soak runs mixed traffic for SOAK_MINUTES (default 5) against two gateway replicas
// sharing one Redis (a master with two replicas behind three Sentinels, the gateways with
// redis.wait_replicas: 1), while the Redis master is killed every 20 s (a Sentinel failover
// each time; it rejoins as a replica) and the upstream simulator flaps; beside them, two more
// gateways (one per upstream transport) forward to an upstream that closes idle connections
// after 1 s (idle.go). It
// prints requests sent, answers by status, lost requests (no HTTP answer at all), limit
// overshoot (2xx per limit, id and window above the limit, counted on the client side), and
// RSS and goroutine growth of each gateway, and the idle-timeout upstream's failures per
// transport. Then the Cluster phase (cluster.go): a gateway with the default redis settings on
// a 3-master Cluster whose masters are killed in turn, reporting the errors of tenants on
// healthy masters besides lost requests and overshoot. It exits 1 on any loss, overshoot,
// healthy-master error or leak, any request delivered twice, or the pool failing more requests
// than net/http's Transport against the idle-timeout upstream.
//
//	make soak                  # 5 minutes
//	SOAK_MINUTES=1 make soak
//
// Needs redis-server on PATH and go to build the binaries. Everything listens on 127.0.0.1
// and every process it starts is stopped by PID when it ends. Not run in CI.
package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// Limits small enough to be hit all the time, on short windows.
const (
	window      = 10 * time.Second
	projectCap  = 20 // agent_job_per_project per window
	orgCap      = 30 // assistant_per_org per window
	projects    = 4
	orgs        = 2
	answerAfter = 15 * time.Second // a request with no answer by then is lost

	goroutineSlack = 50  // end may exceed start by this many goroutines
	rssGrowthMax   = 0.5 // end RSS below start * 1.5
)

func main() {
	os.Exit(run())
}

// procs started by the soak, stopped by PID at the end.
type service struct {
	name string
	bin  string
	args []string
	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	logf *os.File
}

func (s *service) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	cmd := exec.Command(s.bin, s.args...)
	cmd.Stdout, cmd.Stderr = s.logf, s.logf
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%s: %w", s.name, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	s.cmd, s.done = cmd, done
	return nil
}

// kill sends SIGKILL by PID and waits for the process.
func (s *service) kill() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = syscall.Kill(cmd.Process.Pid, syscall.SIGKILL)
	<-done
}

func (s *service) pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

func freePort() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func waitHTTP(url string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		res, err := http.Get(url)
		if err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready: %v", url, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func waitRedis(addr string, within time.Duration) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	deadline := time.Now().Add(within)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis %s not ready: %v", addr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func run() int {
	minutes := 5.0
	if v := os.Getenv("SOAK_MINUTES"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f <= 0 {
			fmt.Fprintf(os.Stderr, "soak: SOAK_MINUTES=%q is not a positive number\n", v)
			return 2
		}
		minutes = f
	}
	workers := 16
	if v := os.Getenv("SOAK_WORKERS"); v != "" {
		if n, err := strconv.Atoi(v); err == nil && n > 0 {
			workers = n
		}
	}
	duration := time.Duration(minutes * float64(time.Minute))

	dir, err := os.MkdirTemp("", "gateway-soak")
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	logf, err := os.Create(filepath.Join(dir, "services.log"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		return 1
	}
	defer logf.Close()

	fmt.Printf("soak: building the gateway and upstream-sim into %s\n", dir)
	for _, c := range []string{"gateway", "upstream-sim"} {
		out, err := exec.Command("go", "build", "-o", filepath.Join(dir, c), "./cmd/"+c).CombinedOutput()
		if err != nil {
			fmt.Fprintf(os.Stderr, "soak: building %s: %v\n%s", c, err, out)
			return 1
		}
	}
	redisBin, err := exec.LookPath("redis-server")
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak: redis-server not found (apt-get install redis-server)")
		return 1
	}

	var services []*service
	defer func() {
		for _, s := range services {
			s.kill()
		}
	}()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	var interrupted atomic.Bool
	go func() { <-sigs; interrupted.Store(true) }()

	// Redis: a Sentinel group whose nodes keep an fsync'ed AOF, so a node restarted inside a
	// window does not hand out the window's quota a second time; the gateways wait for one
	// replica's acknowledgement of every count (redis.wait_replicas: 1), so a failover loses
	// no count either.
	group, err := startRedisGroup(dir, redisBin, logf)
	services = append(services, group.services()...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		return 1
	}
	redisAddr := strings.Join(group.sentAddrs, ",")

	upAddr := freePort()
	up := &service{name: "upstream-sim", bin: filepath.Join(dir, "upstream-sim"), logf: logf,
		args: []string{"-listen", upAddr, "-part-delay", "20ms", "-answer-parts", "4", "-job-complete-after", "1s"}}
	services = append(services, up)
	if err := up.start(); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		return 1
	}
	if err := waitHTTP("http://"+upAddr+"/healthz", 10*time.Second); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		return 1
	}

	type gw struct {
		*service
		public, admin string
	}
	var gws []*gw
	for i := range 2 {
		g := &gw{public: freePort(), admin: freePort()}
		cfg := fmt.Sprintf(`listen: %q
admin_listen: %q
upstream:
  url: "http://%s"
  timeout: 5s
  dial_timeout: 1s
server:
  idle_timeout: 3s
  shutdown_grace: 5s
redis:
  addrs: [%s]
  master_name: %s
  wait_replicas: 1
  timeout: 200ms
  on_error: deny
  breaker: {failures: 5, cooldown: 500ms}
# All traffic comes from one address, 5%% of it refused for its key: no failure budget.
auth: {failure_limit: 0}
limits:
  agent_job_per_project: {limit: %d, window: %s}
  assistant_per_org: {limit: %d, window: %s}
routes:
  - {name: agent_job_status, method: GET, path: "/v2/agent/{projectId}/job/{jobId}", key: admin}
  - {name: assistant_message_v2, method: POST, path: "/discovery/v2/assistant/{domain}/message", key: assistant, stream: true, limits: []}
`, g.public, g.admin, upAddr, quoted(group.sentAddrs), groupName, projectCap, window, orgCap, window)
		path := filepath.Join(dir, fmt.Sprintf("gateway-%d.yaml", i))
		if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
			fmt.Fprintln(os.Stderr, "soak:", err)
			return 1
		}
		gl, err := os.Create(filepath.Join(dir, fmt.Sprintf("gateway-%d.log", i)))
		if err != nil {
			fmt.Fprintln(os.Stderr, "soak:", err)
			return 1
		}
		defer gl.Close()
		g.service = &service{name: fmt.Sprintf("gateway-%d", i), bin: filepath.Join(dir, "gateway"), logf: gl, args: []string{"-config", path}}
		services = append(services, g.service)
		if err := g.start(); err != nil {
			fmt.Fprintln(os.Stderr, "soak:", err)
			return 1
		}
		if err := waitHTTP("http://"+g.admin+"/readyz", 15*time.Second); err != nil {
			fmt.Fprintln(os.Stderr, "soak:", err)
			return 1
		}
		gws = append(gws, g)
	}

	idle, err := startIdleFault(dir, filepath.Join(dir, "gateway"))
	if idle != nil {
		defer idle.close()
		services = append(services, idle.services()...)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak: idle-timeout upstream:", err)
		return 1
	}

	// Traffic.
	st := newStats()
	transport := &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}
	client := &http.Client{Timeout: answerAfter, Transport: transport}
	load := func(stop <-chan struct{}, record bool) {
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					if interrupted.Load() {
						return
					}
					g := gws[(w+i)%len(gws)]
					one(client, g.public, rng, st, record)
				}
			}()
		}
		wg.Wait()
	}

	// Warm up, let it settle, then the baseline of each gateway.
	fmt.Printf("soak: 2 gateways, redis %s, upstream %s, %d workers, %v of traffic\n", redisAddr, upAddr, workers, duration)
	warmStop := make(chan struct{})
	go func() { time.Sleep(3 * time.Second); close(warmStop) }()
	load(warmStop, false)
	transport.CloseIdleConnections()
	time.Sleep(4 * time.Second) // past server.idle_timeout
	type sample struct {
		rss        int64
		goroutines float64
	}
	measure := func(g *gw) sample {
		return sample{rss: vmRSS(g.pid()), goroutines: goroutines(g.admin)}
	}
	start := make([]sample, len(gws))
	for i, g := range gws {
		start[i] = measure(g)
	}

	// Chaos: the Redis master killed every 20 s for 3 s (a failover each time); the upstream
	// every 15 s for 2 s.
	stop := make(chan struct{})
	var chaos sync.WaitGroup
	var redisKills, upKills, failovers atomic.Int32
	flap := func(s *service, every, down time.Duration, ready func() error, count *atomic.Int32, offset time.Duration) {
		defer chaos.Done()
		select {
		case <-time.After(offset):
		case <-stop:
			return
		}
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			s.kill()
			count.Add(1)
			time.Sleep(down)
			for attempt := 0; attempt < 40; attempt++ {
				if err := s.start(); err == nil {
					if ready() == nil {
						break
					}
					s.kill()
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
	chaos.Add(2)
	go func() {
		defer chaos.Done()
		t := time.NewTicker(20 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
			}
			redisKills.Add(1)
			if group.failover(3 * time.Second) {
				failovers.Add(1)
			}
		}
	}()
	go flap(up, 15*time.Second, 2*time.Second, func() error { return waitHTTP("http://"+upAddr+"/healthz", 5*time.Second) }, &upKills, 5*time.Second)

	began := time.Now()
	go func() {
		t := time.NewTicker(30 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				fmt.Printf("soak: %v elapsed, %d requests sent\n", time.Since(began).Round(time.Second), st.sent.Load())
			}
		}
	}()
	go func() {
		select {
		case <-time.After(duration):
		case <-sigs:
		}
		close(stop)
	}()
	var idleDone sync.WaitGroup
	idleDone.Add(1)
	go func() { defer idleDone.Done(); idle.run(stop) }()
	load(stop, true)
	chaos.Wait()
	idleDone.Wait()
	// Both dependencies back for the end measurement.
	for _, n := range group.nodes {
		if n.pid() == 0 {
			_ = n.start()
		}
	}
	if up.pid() == 0 {
		_ = up.start()
	}
	transport.CloseIdleConnections()

	// Growth: goroutines must come back within the slack once the load stopped.
	end := make([]sample, len(gws))
	for i, g := range gws {
		deadline := time.Now().Add(15 * time.Second)
		for {
			end[i] = measure(g)
			if end[i].goroutines <= start[i].goroutines+goroutineSlack || time.Now().After(deadline) {
				break
			}
			time.Sleep(500 * time.Millisecond)
		}
	}

	// Report.
	fail := false
	fmt.Printf("\n== soak report (%v, %d workers, Redis master killed %d times (%d Sentinel failovers), upstream killed %d times)\n",
		time.Since(began).Round(time.Second), workers, redisKills.Load(), failovers.Load(), upKills.Load())
	fmt.Printf("requests sent:   %d\n", st.sent.Load())
	st.mu.Lock()
	fmt.Printf("answered:        %s\n", codeCounts(st.codes))
	fmt.Printf("lost (no HTTP answer): %d\n", st.lost)
	for i, e := range st.lostErrs {
		if i == 5 {
			break
		}
		fmt.Printf("  e.g. %s\n", e)
	}
	fmt.Printf("bodies cut after the status line: %d non-stream (aborted on upstream failure, by design), streams ended without finish part: %d of %d\n",
		st.truncated, st.streamsIncomplete, st.streams)
	over := st.overshoot()
	ambiguous := st.ambiguous
	st.mu.Unlock()
	fmt.Printf("limit overshoot: %d (2xx per limit/id/window above the limit; %d admitted requests straddled a window edge and were left out)\n", len(over), ambiguous)
	for _, o := range over {
		fmt.Printf("  %s\n", o)
	}
	if st.lost > 0 || len(over) > 0 {
		fail = true
	}
	if !idle.report() {
		fail = true
	}
	for i, g := range gws {
		growth := float64(end[i].rss-start[i].rss) / float64(start[i].rss)
		fmt.Printf("%s: RSS %.1f MiB -> %.1f MiB (%+.0f%%), goroutines %.0f -> %.0f (%+.0f)\n", g.name,
			float64(start[i].rss)/(1<<20), float64(end[i].rss)/(1<<20), growth*100,
			start[i].goroutines, end[i].goroutines, end[i].goroutines-start[i].goroutines)
		if end[i].goroutines > start[i].goroutines+goroutineSlack {
			fmt.Printf("  LEAK: goroutines did not come back within +%d of the start\n", goroutineSlack)
			fail = true
		}
		if growth >= rssGrowthMax {
			fmt.Printf("  LEAK: RSS grew %.0f%% (limit %.0f%%)\n", growth*100, rssGrowthMax*100)
			fail = true
		}
	}
	if !interrupted.Load() {
		cr, err := runClusterPhase(dir, dir, redisBin, upAddr, logf, max(duration/2, 40*time.Second), &interrupted)
		services = append(services, cr.services...)
		if err != nil {
			fmt.Println("soak: cluster phase:", err)
			fail = true
		} else {
			cr.print()
			fail = fail || cr.failed()
		}
	}
	if interrupted.Load() {
		fmt.Println("soak: interrupted")
		return 1
	}
	if fail {
		fmt.Println("soak: FAIL")
		return 1
	}
	fmt.Println("soak: PASS")
	return 0
}

// stats of the measured phase.
type stats struct {
	sent              atomic.Int64
	mu                sync.Mutex
	codes             map[int]int
	lost              int
	lostErrs          []string
	truncated         int
	streams           int
	streamsIncomplete int
	admitted          map[string]int // limit/id/window -> 2xx fully inside the window
	ambiguous         int
}

func newStats() *stats { return &stats{codes: map[int]int{}, admitted: map[string]int{}} }

func (s *stats) overshoot() []string {
	var out []string
	for k, n := range s.admitted {
		limit := projectCap
		if strings.HasPrefix(k, "assistant_per_org/") {
			limit = orgCap
		}
		if n > limit {
			out = append(out, fmt.Sprintf("%s: %d admitted, limit %d", k, n, limit))
		}
	}
	sort.Strings(out)
	return out
}

// one sends a random request of the mix and records its outcome.
func one(client *http.Client, public string, rng *rand.Rand, st *stats, record bool) {
	var method, path, key, body, limit, id string
	stream := false
	switch r := rng.IntN(100); {
	case r < 30:
		id = fmt.Sprintf("soak-%d", rng.IntN(projects))
		method, path, key, body, limit = "POST", "/v2/agent/"+id+"/job", "svc_soak", `{"prompt":"soak"}`, "agent_job_per_project"
	case r < 50:
		id = fmt.Sprintf("org-%d", rng.IntN(orgs))
		method, path, key, limit, stream = "POST", "/discovery/v1/assistant/"+id+"/message", "svc_dsc_soak", "assistant_per_org", true
		body = `{"fp":"soak","messages":[{"id":"1","role":"user","content":"How do I start?"}]}`
	case r < 75: // unlimited streams (v2 route without limits): keeps streams in flight when things fail
		method, path, key, stream = "POST", fmt.Sprintf("/discovery/v2/assistant/docs-%d/message", rng.IntN(100)), "svc_dsc_soak", true
		body = `{"fp":"soak","messages":[{"id":"1","role":"user","parts":[{"type":"text","text":"How do I start?"}]}]}`
	case r < 80:
		method, path, key = "GET", "/v2/agent/soak-0/job/unknown", "svc_soak"
	case r < 85:
		method, path, body = "POST", "/v2/agent/soak-0/job", `{"prompt":"x"}` // no key: 401
	case r < 90:
		method, path, key, body = "POST", "/v2/agent/soak-0/job", "svc_soak", `{"prompt":""}` // 400
	default:
		method, path = "GET", "/nowhere" // 404
	}
	req, _ := http.NewRequest(method, "http://"+public+path, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	sentAt := time.Now()
	if record {
		st.sent.Add(1)
	}
	res, err := client.Do(req)
	if err != nil {
		if record {
			st.mu.Lock()
			st.lost++
			if len(st.lostErrs) < 20 {
				st.lostErrs = append(st.lostErrs, fmt.Sprintf("%s %s: %v", method, path, err))
			}
			st.mu.Unlock()
		}
		return
	}
	data, rerr := io.ReadAll(res.Body)
	res.Body.Close()
	recvAt := time.Now()
	if !record {
		return
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	st.codes[res.StatusCode]++
	if stream && res.StatusCode == 200 {
		st.streams++
		if rerr != nil || !hasFinish(data) {
			st.streamsIncomplete++
		}
	} else if rerr != nil {
		st.truncated++
	}
	if limit != "" && res.StatusCode/100 == 2 {
		// Windows are aligned to multiples of their length since the epoch, on Redis's clock,
		// which is this machine's: a request sent and answered inside one window was
		// counted in it. One that straddles an edge is left out rather than guessed.
		ws, we := sentAt.Truncate(window), recvAt.Truncate(window)
		if !ws.Equal(we) {
			st.ambiguous++
			return
		}
		st.admitted[fmt.Sprintf("%s/%s/%s", limit, id, ws.UTC().Format("15:04:05"))]++
	}
}

// codeCounts lists the count of each status code, the codes in order: "200: 5, 429: 2".
func codeCounts(counts map[int]int) string {
	parts := make([]string, 0, len(counts))
	for _, c := range slices.Sorted(maps.Keys(counts)) {
		parts = append(parts, fmt.Sprintf("%d: %d", c, counts[c]))
	}
	return strings.Join(parts, ", ")
}

// hasFinish reports whether a streamed answer reached its finish part.
func hasFinish(data []byte) bool {
	sc := bufio.NewScanner(strings.NewReader(string(data)))
	for sc.Scan() {
		line := sc.Text()
		// v1's data stream ends with a d: part, v2's UI message stream with a finish chunk.
		if strings.HasPrefix(line, "d:") || (strings.HasPrefix(line, "data: ") && strings.Contains(line, `"type":"finish"`)) {
			return true
		}
	}
	return false
}

func vmRSS(pid int) int64 {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

func goroutines(admin string) float64 {
	res, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		return -1
	}
	defer res.Body.Close()
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "go_goroutines "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err == nil {
				return f
			}
		}
	}
	return -1
}

func quoted(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = strconv.Quote(s)
	}
	return strings.Join(q, ", ")
}
