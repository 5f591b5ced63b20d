package main

import (
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docsgate/gateway/internal/redistest"
)

// These tests kill a Redis master under load and let Redis promote its replica (Sentinel, or
// the Cluster itself). They check that the gateway follows by itself, that every request is
// answered in bounded time and none is lost, and they measure how long counting stops and
// how far a tenant gets past its quota because replication is asynchronous.

// answerBound is the longest a request may take while Redis fails over: redis.timeout (100ms
// in these configs) plus a margin for the race detector and this 2-core machine. It is a
// correctness bound (no request waits on a dead Redis), not a performance target.
const answerBound = 100*time.Millisecond + 900*time.Millisecond

type outcome struct {
	at      time.Time
	took    time.Duration
	code    int
	project string
	failed  bool // no HTTP answer at all
}

// failoverLoad sends agent_job requests round-robin over projects from workers goroutines
// until stop closes, and returns every outcome.
func failoverLoad(p *proc, workers int, projects []string, stop <-chan struct{}) func() []outcome {
	var mu sync.Mutex
	var out []outcome
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: workers}}
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				proj := projects[i%len(projects)]
				req, _ := http.NewRequest("POST", "http://"+p.public+"/v2/agent/"+proj+"/job", strings.NewReader(`{"prompt":"x"}`))
				req.Header.Set("Authorization", "Bearer svc_failover")
				req.Header.Set("Content-Type", "application/json")
				start := time.Now()
				res, err := client.Do(req)
				o := outcome{at: start, took: time.Since(start), project: proj, failed: err != nil}
				if err == nil {
					o.code = res.StatusCode
					res.Body.Close()
				}
				mu.Lock()
				out = append(out, o)
				mu.Unlock()
			}
		}()
	}
	return func() []outcome { wg.Wait(); return out }
}

type failoverReport struct {
	requests, lost     int
	codes              map[int]int
	maxTook, p99Took   time.Duration
	lastFailure        time.Time // the last 503 after the kill
	overshoot          map[string]int
	unavailablePerProj map[string]int
}

func analyse(outs []outcome, quota int) failoverReport {
	r := failoverReport{codes: map[int]int{}, overshoot: map[string]int{}, unavailablePerProj: map[string]int{}}
	var took []time.Duration
	admitted := map[string]int{}
	for _, o := range outs {
		r.requests++
		if o.failed {
			r.lost++
			continue
		}
		r.codes[o.code]++
		took = append(took, o.took)
		switch o.code {
		case 201:
			admitted[o.project]++
		case 503:
			r.unavailablePerProj[o.project]++
			if o.at.After(r.lastFailure) {
				r.lastFailure = o.at
			}
		}
	}
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	if len(took) > 0 {
		r.maxTook = took[len(took)-1]
		r.p99Took = took[len(took)*99/100]
	}
	for p, n := range admitted {
		r.overshoot[p] = n - quota
	}
	return r
}

func (r failoverReport) maxOvershoot() int {
	m := 0
	for _, v := range r.overshoot {
		m = max(m, v)
	}
	return m
}

// untilExhausted waits until every project has been denied (429) after since, so that the
// admitted counts include whatever the failover let through.
func exhausted(outs []outcome, projects []string, since time.Time) bool {
	seen := map[string]int{}
	for _, o := range outs {
		if o.code == 429 && o.at.After(since) {
			seen[o.project]++
		}
	}
	for _, p := range projects {
		if seen[p] < 20 {
			return false
		}
	}
	return true
}

func failoverConfig(redis string, quota int) string {
	return fmt.Sprintf(`%s
limits:
  agent_job_per_project: {limit: %d, window: hour}
`, redis, quota)
}

// Sentinel: kill the master under load; the gateway follows the promotion by itself.
func TestSentinelFailoverUnderLoad(t *testing.T) {
	g := redistest.StartSentinelGroup(t, "gwfail")
	const quota = 1500
	redisCfg := fmt.Sprintf("redis:\n  addrs: [%s]\n  master_name: gwfail\n  timeout: 100ms\n  on_error: deny\n  breaker: {failures: 5, cooldown: 200ms}\n", quoteAll(g.Addrs()))
	p := startGateway(t, tokenUpstream(t), failoverConfig(redisCfg, quota))
	projects := []string{"s0", "s1", "s2", "s3"}
	outs, kill, promoted := runFailover(t, p, projects, quota, func() { g.Master.Stop(t) }, func() time.Time { return g.WaitPromoted(t, 30*time.Second) })
	r := analyse(outs, quota)
	report(t, "sentinel", r, kill, promoted)
	checkFailover(t, r, outs, kill)
}

// Cluster: kill one of three masters; its replica takes over and the gateway follows the new
// topology. Tenants whose keys live on the healthy masters see no error at all.
func TestClusterFailoverUnderLoad(t *testing.T) {
	c := redistest.StartClusterWithReplicas(t, 3)
	victim := c.MasterOf(t, "{c0}")
	replica := c.ReplicaOf(t, victim)
	var onVictim, healthy []string
	for i := 0; len(onVictim) < 2 || len(healthy) < 2; i++ {
		proj := fmt.Sprintf("c%d", i)
		if c.MasterOf(t, "{"+proj+"}") == victim {
			if len(onVictim) < 2 {
				onVictim = append(onVictim, proj)
			}
		} else if len(healthy) < 2 {
			healthy = append(healthy, proj)
		}
	}
	const quota = 1500
	redisCfg := fmt.Sprintf("redis:\n  addrs: [%s]\n  timeout: 100ms\n  on_error: deny\n  breaker: {failures: 1000000, cooldown: 200ms}\n", quoteAll(c.Addrs))
	p := startGateway(t, tokenUpstream(t), failoverConfig(redisCfg, quota))
	projects := append(append([]string{}, onVictim...), healthy...)
	outs, kill, promoted := runFailover(t, p, projects, quota, func() { victim.Stop(t) }, func() time.Time {
		rc := replica.Client(t)
		deadline := time.Now().Add(30 * time.Second)
		for {
			if info, err := rc.Info(t.Context(), "replication").Result(); err == nil && strings.Contains(info, "role:master") {
				return time.Now()
			}
			if time.Now().After(deadline) {
				t.Fatal("the replica never took over")
			}
			time.Sleep(20 * time.Millisecond)
		}
	})
	r := analyse(outs, quota)
	report(t, "cluster", r, kill, promoted)
	checkFailover(t, r, outs, kill)
	for _, h := range healthy {
		if n := r.unavailablePerProj[h]; n != 0 {
			t.Errorf("tenant %s on a healthy master got %d errors", h, n)
		}
	}
	if r.unavailablePerProj[onVictim[0]]+r.unavailablePerProj[onVictim[1]] == 0 {
		t.Errorf("the tenants of the killed master saw no error: was it killed?")
	}
}

// runFailover runs the load, kills the master after a second, waits for the promotion, and
// stops once counting has resumed and every project is exhausted.
func runFailover(t *testing.T, p *proc, projects []string, quota int, killMaster func(), waitPromoted func() time.Time) ([]outcome, time.Time, time.Time) {
	t.Helper()
	stop := make(chan struct{})
	wait := failoverLoad(p, 8, projects, stop)
	time.Sleep(time.Second)
	kill := time.Now()
	killMaster()
	promoted := waitPromoted()
	// Let counting resume, then run until every project is denied.
	deadline := time.Now().Add(90 * time.Second)
	for {
		time.Sleep(500 * time.Millisecond)
		close(stop)
		outs := wait()
		if exhausted(outs, projects, promoted) || time.Now().After(deadline) {
			return outs, kill, promoted
		}
		stop = make(chan struct{})
		more := failoverLoad(p, 8, projects, stop)
		prev := outs
		wait = func() []outcome { return append(prev, more()...) }
	}
}

func report(t *testing.T, name string, r failoverReport, kill, promoted time.Time) {
	t.Helper()
	resumed := "no error at all"
	if !r.lastFailure.IsZero() {
		resumed = fmt.Sprintf("%v after the kill, %v after the promotion", r.lastFailure.Sub(kill).Round(time.Millisecond), r.lastFailure.Sub(promoted).Round(time.Millisecond))
	}
	t.Logf("%s failover: %d requests, %d lost, codes %v; answer time p99 %v, max %v; promotion %v after the kill; last 503 %s; overshoot per project %v (max %d)",
		name, r.requests, r.lost, r.codes, r.p99Took.Round(time.Microsecond), r.maxTook.Round(time.Microsecond),
		promoted.Sub(kill).Round(time.Millisecond), resumed, r.overshoot, r.maxOvershoot())
}

func checkFailover(t *testing.T, r failoverReport, outs []outcome, kill time.Time) {
	t.Helper()
	if r.lost != 0 {
		t.Errorf("%d requests got no answer", r.lost)
	}
	for code := range r.codes {
		if code != 201 && code != 429 && code != 503 {
			t.Errorf("unexpected status %d (%d times)", code, r.codes[code])
		}
	}
	if r.maxTook > answerBound {
		t.Errorf("a request took %v, more than redis.timeout plus margin (%v)", r.maxTook, answerBound)
	}
	if r.codes[503] == 0 {
		t.Errorf("no 503 at all: the master was not in use?")
	}
	// Counting resumed: admissions and denials after the last failure.
	ok := 0
	for _, o := range outs {
		if o.at.After(r.lastFailure) && (o.code == 201 || o.code == 429) {
			ok++
		}
	}
	if ok == 0 {
		t.Errorf("counting never resumed after the failover")
	}
}
