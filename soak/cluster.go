package main

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/docsgate/gateway/auth"
)

// The Cluster phase: a Redis Cluster of three masters with a replica each (full coverage off,
// as docs/production.md asks), one gateway on it with every redis setting at its default but the
// addresses (the default breaker: 5 failures, 1 s; timeout 100 ms; on_error deny; coalescing),
// a steady load on tenants of every master, and one master killed every clusterKillEvery (its
// replica takes over, the old master rejoins as a replica). It reports the errors of tenants
// on healthy masters (must be 0: each master has its own breaker), lost requests and limit
// overshoot (both 0), and the gateway's goroutine and RSS growth.

const (
	clusterKillEvery  = 20 * time.Second
	clusterWorkers    = 8
	clusterPace       = 10 * time.Millisecond // per worker: 800 requests a second, far from saturating the machine
	clusterProjects   = 12                    // agent_job tenants, spread over the masters
	clusterOrgs       = 6                     // assistant orgs: each request also counts its key and IP, on other nodes
	clusterKeySoak    = "svc_dsc_soakcluster"
	clusterClientAddr = "127.0.0.1" // the per-IP limit's id: every request comes from here
)

// clusterNode is one redis-server of the Cluster.
type clusterNode struct {
	*service
	addr string
}

// faultWindow is the time a shard (a master and its replica: the slots they serve) was failing:
// from its master's kill until the old master rejoined as a replica of the promoted one.
type faultWindow struct {
	slots    [][2]int64
	from, to time.Time
	promoted time.Time
}

func (w faultWindow) covers(slot int64, from, to time.Time) bool {
	if to.Before(w.from) || from.After(w.to) {
		return false
	}
	for _, r := range w.slots {
		if r[0] <= slot && slot <= r[1] {
			return true
		}
	}
	return false
}

// clusterRequest is one request's outcome: the slots of every limit it counts, when it ran,
// and whether it failed (no answer, or neither 2xx nor 429).
type clusterRequest struct {
	slots    []int64
	from, to time.Time
	failed   bool
	what     string
}

type clusterResult struct {
	services       []*service
	duration       time.Duration
	kills, promos  int
	sent           int
	codes          map[int]int
	lost           int
	healthyErrs    []clusterRequest
	victimErrs     int
	overshoot      []string
	ambiguous      int
	rss, gor       [2]float64
	goroutinesLeak bool
	rssLeak        bool
}

func (r *clusterResult) failed() bool {
	return r.lost > 0 || len(r.healthyErrs) > 0 || len(r.overshoot) > 0 || r.goroutinesLeak || r.rssLeak || r.kills == 0 || r.kills != r.promos
}

func (r *clusterResult) print() {
	fmt.Printf("\n== Cluster phase (%v, 3 masters with a replica each, one gateway on the default redis settings, %d workers every %v; a master killed %d times, %d replicas promoted)\n",
		r.duration.Round(time.Second), clusterWorkers, clusterPace, r.kills, r.promos)
	fmt.Printf("requests sent:   %d\n", r.sent)
	fmt.Printf("answered:        %s\n", codeCounts(r.codes))
	fmt.Printf("lost (no HTTP answer): %d\n", r.lost)
	fmt.Printf("errors on the killed master's tenants while it failed over: %d (503 limiter_unavailable, expected)\n", r.victimErrs)
	fmt.Printf("healthy-master errors: %d (tenants whose every limit lives on a master not failing then)\n", len(r.healthyErrs))
	for i, e := range r.healthyErrs {
		if i == 5 {
			break
		}
		fmt.Printf("  e.g. %s at %s, %v\n", e.what, e.from.Format("15:04:05.000"), e.to.Sub(e.from).Round(time.Millisecond))
	}
	fmt.Printf("limit overshoot: %d (%d admitted requests straddled a window edge and were left out)\n", len(r.overshoot), r.ambiguous)
	for _, o := range r.overshoot {
		fmt.Printf("  %s\n", o)
	}
	fmt.Printf("gateway-cluster: RSS %.1f MiB -> %.1f MiB, goroutines %.0f -> %.0f\n", r.rss[0]/(1<<20), r.rss[1]/(1<<20), r.gor[0], r.gor[1])
	if r.goroutinesLeak {
		fmt.Printf("  LEAK: goroutines did not come back within +%d of the start\n", goroutineSlack)
	}
	if r.rssLeak {
		fmt.Printf("  LEAK: RSS grew past %.0f%%\n", rssGrowthMax*100)
	}
	if r.kills == 0 || r.kills != r.promos {
		fmt.Println("  FAULT NOT EXERCISED: a kill without a promotion (or no kill at all)")
	}
}

// runClusterPhase runs the Cluster phase for d. bin is the directory of the built binaries.
func runClusterPhase(dir, bin, redisBin, upAddr string, logf *os.File, d time.Duration, interrupted *atomic.Bool) (*clusterResult, error) {
	res := &clusterResult{codes: map[int]int{}}
	nodes, err := startCluster(dir, redisBin, logf)
	for _, n := range nodes {
		res.services = append(res.services, n.service)
	}
	if err != nil {
		return res, err
	}
	seed := redis.NewClient(&redis.Options{Addr: nodes[0].addr})
	defer seed.Close()
	// The layout is asked of any node that answers (the first may be a killed master).
	var shardsMu sync.Mutex
	shardsOf := func() ([]redis.ClusterShard, error) {
		shardsMu.Lock()
		defer shardsMu.Unlock()
		var last error
		for _, n := range nodes {
			c := redis.NewClient(&redis.Options{Addr: n.addr, MaxRetries: -1})
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			sh, err := c.ClusterShards(ctx).Result()
			cancel()
			c.Close()
			if err == nil {
				return sh, nil
			}
			last = err
		}
		return nil, fmt.Errorf("cluster shards: %w", last)
	}

	public, admin := freePort(), freePort()
	addrs := make([]string, len(nodes))
	for i, n := range nodes {
		addrs[i] = n.addr
	}
	cfg := fmt.Sprintf(`listen: %q
admin_listen: %q
upstream:
  url: "http://%s"
  timeout: 5s
server:
  idle_timeout: 3s
# Every redis setting at its default but the addresses: the default breaker.
redis:
  addrs: [%s]
auth: {failure_limit: 0}
limits:
  agent_job_per_project: {limit: %d, window: %s}
  assistant_per_org: {limit: %d, window: %s}
  assistant_per_key: {limit: 1000000000}
  assistant_per_ip: {limit: 1000000000}
`, public, admin, upAddr, quoted(addrs), projectCap, window, orgCap, window)
	path := filepath.Join(dir, "gateway-cluster.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		return res, err
	}
	gl, err := os.Create(filepath.Join(dir, "gateway-cluster.log"))
	if err != nil {
		return res, err
	}
	defer gl.Close()
	gw := &service{name: "gateway-cluster", bin: filepath.Join(bin, "gateway"), logf: gl, args: []string{"-config", path}}
	res.services = append(res.services, gw)
	if err := gw.start(); err != nil {
		return res, err
	}
	if err := waitHTTP("http://"+admin+"/readyz", 15*time.Second); err != nil {
		return res, err
	}

	// Every limit id of the mix and its slot, asked of the Cluster itself.
	slot := map[string]int64{}
	ids := []string{auth.Digest(clusterKeySoak), clusterClientAddr}
	for i := range clusterProjects {
		ids = append(ids, fmt.Sprintf("soakc-%d", i))
	}
	for i := range clusterOrgs {
		ids = append(ids, fmt.Sprintf("orgc-%d", i))
	}
	for _, id := range ids {
		s, err := seed.ClusterKeySlot(context.Background(), "{"+id+"}").Result()
		if err != nil {
			return res, fmt.Errorf("cluster keyslot: %w", err)
		}
		slot[id] = s
	}

	var mu sync.Mutex
	var reqs []clusterRequest
	admitted := map[string]int{}
	transport := &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}
	defer transport.CloseIdleConnections()
	client := &http.Client{Timeout: answerAfter, Transport: transport}
	stop := make(chan struct{})
	var load sync.WaitGroup
	for w := range clusterWorkers {
		load.Add(1)
		go func() {
			defer load.Done()
			rng := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			next := time.Now()
			for {
				select {
				case <-stop:
					return
				case <-time.After(time.Until(next)):
				}
				if interrupted.Load() {
					return
				}
				if now := time.Now(); next.Before(now) {
					next = now
				}
				next = next.Add(clusterPace)
				r, limitKey := clusterOne(client, public, rng, slot)
				mu.Lock()
				reqs = append(reqs, r)
				if limitKey != "" {
					ws, we := r.from.Truncate(window), r.to.Truncate(window)
					if ws.Equal(we) {
						admitted[limitKey+"/"+ws.UTC().Format("15:04:05")]++
					} else {
						res.ambiguous++
					}
				}
				mu.Unlock()
			}
		}()
	}

	// Warm up, then the gateway's baseline.
	time.Sleep(3 * time.Second)
	res.rss[0], res.gor[0] = float64(vmRSS(gw.pid())), goroutines(admin)
	began := time.Now()
	var windows []faultWindow
	for k := 0; time.Since(began)+clusterKillEvery/2 < d && !interrupted.Load(); k++ {
		time.Sleep(clusterKillEvery / 2)
		w, promoted, err := killClusterMaster(shardsOf, nodes, k%3)
		if err != nil {
			fmt.Println("soak: cluster:", err)
			continue
		}
		res.kills++
		if promoted {
			res.promos++
		}
		windows = append(windows, w)
		fmt.Printf("soak: cluster master killed at %s (%d); its replica promoted %v later, the old master back as a replica after %v\n",
			w.from.Format("15:04:05.000"), res.kills, w.promoted.Sub(w.from).Round(10*time.Millisecond), w.to.Sub(w.from).Round(100*time.Millisecond))
		time.Sleep(clusterKillEvery/2 - w.to.Sub(w.from))
	}
	close(stop)
	load.Wait()
	res.duration = time.Since(began)
	transport.CloseIdleConnections()
	deadline := time.Now().Add(15 * time.Second)
	for {
		res.rss[1], res.gor[1] = float64(vmRSS(gw.pid())), goroutines(admin)
		if res.gor[1] <= res.gor[0]+goroutineSlack || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	res.goroutinesLeak = res.gor[1] > res.gor[0]+goroutineSlack
	res.rssLeak = res.rss[0] > 0 && (res.rss[1]-res.rss[0])/res.rss[0] >= rssGrowthMax

	// Each request: an error while one of its limits' shards failed is the dead master's; any
	// other error is a healthy master's.
	for _, r := range reqs {
		if r.from.Before(began) {
			continue // warm-up
		}
		res.sent++
		if r.what == "" {
			res.lost++
		} else {
			res.codes[r.code()]++
		}
		if !r.failed {
			continue
		}
		victim := false
		for _, w := range windows {
			for _, s := range r.slots {
				victim = victim || w.covers(s, r.from, r.to)
			}
		}
		if victim {
			res.victimErrs++
		} else {
			res.healthyErrs = append(res.healthyErrs, r)
		}
	}
	for k, n := range admitted {
		limit := projectCap
		if strings.HasPrefix(k, "assistant_per_org/") {
			limit = orgCap
		}
		if n > limit {
			res.overshoot = append(res.overshoot, fmt.Sprintf("%s: %d admitted, limit %d", k, n, limit))
		}
	}
	sort.Strings(res.overshoot)
	return res, nil
}

// code is the status of r for the report (0: no answer).
func (r clusterRequest) code() int {
	var c int
	if _, err := fmt.Sscanf(r.what, "%d", &c); err != nil {
		return 0
	}
	return c
}

// clusterOne sends one request of the Cluster mix: agent_job on a project (one node), or an
// assistant message (its org, key and IP limits: up to three nodes). It returns the outcome
// and, for an admission, the limit and id it was counted under ("" otherwise).
func clusterOne(client *http.Client, public string, rng *rand.Rand, slot map[string]int64) (clusterRequest, string) {
	var r clusterRequest
	var path, key, body, counted string
	if rng.IntN(100) < 60 {
		id := fmt.Sprintf("soakc-%d", rng.IntN(clusterProjects))
		path, key, body, counted = "/v2/agent/"+id+"/job", "svc_soakcluster", `{"prompt":"soak"}`, "agent_job_per_project/"+id
		r.slots = []int64{slot[id]}
	} else {
		org := fmt.Sprintf("orgc-%d", rng.IntN(clusterOrgs))
		path, key, counted = "/discovery/v1/assistant/"+org+"/message", clusterKeySoak, "assistant_per_org/"+org
		body = `{"fp":"soak","messages":[{"id":"1","role":"user","content":"How do I start?"}]}`
		r.slots = []int64{slot[org], slot[auth.Digest(clusterKeySoak)], slot[clusterClientAddr]}
	}
	req, _ := http.NewRequest("POST", "http://"+public+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	r.from = time.Now()
	resp, err := client.Do(req)
	if err != nil {
		r.to, r.failed = time.Now(), true
		return r, ""
	}
	_, rerr := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	r.to = time.Now()
	r.what = fmt.Sprintf("%d %s", resp.StatusCode, path)
	ok := resp.StatusCode/100 == 2 || resp.StatusCode == 429
	r.failed = !ok || rerr != nil
	if resp.StatusCode/100 != 2 {
		counted = ""
	}
	return r, counted
}

// startCluster starts six redis-servers (no persistence: a restarted node rejoins as a replica
// and copies its master) and makes them a Cluster of three masters with a replica each.
func startCluster(dir, redisBin string, logf *os.File) ([]*clusterNode, error) {
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		return nil, fmt.Errorf("redis-cli not found (apt-get install redis-tools)")
	}
	var nodes []*clusterNode
	for i := range 6 {
		addr, bus := freePort(), freePort()
		_, port, _ := net.SplitHostPort(addr)
		_, busPort, _ := net.SplitHostPort(bus)
		d := filepath.Join(dir, fmt.Sprintf("cluster-%d", i))
		_ = os.MkdirAll(d, 0o755)
		s := &service{name: fmt.Sprintf("cluster-%d", i), bin: redisBin, logf: logf, args: []string{
			"--port", port, "--bind", "127.0.0.1", "--dir", d, "--save", "", "--appendonly", "no",
			"--daemonize", "no", "--protected-mode", "no", "--loglevel", "warning",
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-port", busPort,
			"--cluster-node-timeout", "1000", "--cluster-require-full-coverage", "no"}}
		nodes = append(nodes, &clusterNode{service: s, addr: addr})
		if err := s.start(); err != nil {
			return nodes, err
		}
		if err := waitRedis(addr, 10*time.Second); err != nil {
			return nodes, err
		}
	}
	args := []string{"--cluster", "create"}
	for _, n := range nodes {
		args = append(args, n.addr)
	}
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		return nodes, fmt.Errorf("redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(60 * time.Second)
	for _, n := range nodes {
		for !clusterNodeReady(n.addr) {
			if time.Now().After(deadline) {
				return nodes, fmt.Errorf("cluster node %s not ready", n.addr)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	return nodes, nil
}

// clusterNodeReady: the node sees the cluster ok, and is a master with its replica or a
// replica linked to its master.
func clusterNodeReady(addr string) bool {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	info, err := c.ClusterInfo(ctx).Result()
	repl, err2 := c.Info(ctx, "replication").Result()
	return err == nil && err2 == nil && strings.Contains(info, "cluster_state:ok") &&
		(strings.Contains(repl, "role:master") && strings.Contains(repl, "connected_slaves:1") ||
			strings.Contains(repl, "master_link_status:up"))
}

// killClusterMaster kills the master of the shard-th shard (in slot order), waits until its
// replica is promoted, restarts it (it rejoins as a replica) and waits until it is linked. It
// returns the shard's fault window.
func killClusterMaster(shardsOf func() ([]redis.ClusterShard, error), nodes []*clusterNode, shard int) (faultWindow, bool, error) {
	var w faultWindow
	shards, err := shardsOf()
	if err != nil {
		return w, false, err
	}
	sort.Slice(shards, func(i, j int) bool { return firstSlot(shards[i]) < firstSlot(shards[j]) })
	if shard >= len(shards) {
		return w, false, fmt.Errorf("%d shards", len(shards))
	}
	var master, replica *clusterNode
	for _, n := range shards[shard].Nodes {
		addr := net.JoinHostPort(n.IP, fmt.Sprint(n.Port))
		for _, cn := range nodes {
			if cn.addr != addr {
				continue
			}
			if n.Role == "master" {
				master = cn
			} else {
				replica = cn
			}
		}
	}
	if master == nil || replica == nil {
		return w, false, fmt.Errorf("shard %d: no master and replica among %v", shard, shards[shard].Nodes)
	}
	for _, r := range shards[shard].Slots {
		w.slots = append(w.slots, [2]int64{int64(r.Start), int64(r.End)})
	}
	w.from = time.Now()
	master.kill()
	promoted := false
	rc := redis.NewClient(&redis.Options{Addr: replica.addr, MaxRetries: -1})
	defer rc.Close()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		info, err := rc.Info(ctx, "replication").Result()
		cancel()
		if err == nil && strings.Contains(info, "role:master") {
			promoted, w.promoted = true, time.Now()
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Only now the old master comes back: restarted before the promotion, it would be a
	// master again, with none of its counts (no persistence).
	for attempt := 0; attempt < 40; attempt++ {
		if err := master.start(); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline) && !clusterNodeReady(master.addr); {
		time.Sleep(100 * time.Millisecond)
	}
	w.to = time.Now()
	return w, promoted, nil
}

func firstSlot(s redis.ClusterShard) int64 {
	if len(s.Slots) == 0 {
		return 1 << 20
	}
	return int64(s.Slots[0].Start)
}
