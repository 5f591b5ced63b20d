package main

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docsgate/gateway/internal/redistest"
)

// recordingUpstream counts what reaches it and answers like the platform.
func recordingUpstream(t *testing.T) (string, func() int) {
	t.Helper()
	var mu sync.Mutex
	n := 0
	srvURL := serveHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		mu.Lock()
		n++
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(201)
		_, _ = io.WriteString(w, `{"id":"j","status":"active"}`)
	}))
	return srvURL, func() int { mu.Lock(); defer mu.Unlock(); return n }
}

// burst sends n concurrent requests spread over the gateways and counts the statuses.
func burst(t *testing.T, gws []*proc, n int, path, key, body string, header http.Header) map[int]int {
	t.Helper()
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	return concurrently(n, func(i int) int {
		req, _ := http.NewRequest("POST", "http://"+gws[i%len(gws)].public+path, strings.NewReader(body))
		for k, v := range header {
			req.Header[k] = v
		}
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		res, err := client.Do(req)
		if err != nil {
			return 0
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode
	})
}

// concurrently runs do(0) to do(n-1) at once and counts what they return.
func concurrently[K comparable](n int, do func(i int) K) map[K]int {
	var mu sync.Mutex
	counts := map[K]int{}
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			k := do(i)
			mu.Lock()
			counts[k]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	return counts
}

// Two gateway binaries sharing one real Redis admit exactly the limit between them, and one
// script call decides each admitted or denied request.
func TestReplicasShareRedis(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	client := srv.Client(t)
	upURL, upCount := recordingUpstream(t)
	cfg := fmt.Sprintf(`redis:
  addrs: [%q]
  timeout: 2s # exactness, not latency: 100 concurrent requests under -race are slow
limits:
  agent_job_per_project: {limit: 30}
  assistant_per_org: {limit: 40}
client_ip:
  trusted_proxies: ["127.0.0.1"]
`, srv.Addr)
	a := startGateway(t, upURL, cfg)
	b := startGateway(t, upURL, cfg)
	gws := []*proc{a, b}

	// Warm up: each replica loads the script once (EVALSHA, NOSCRIPT, EVAL) on first use.
	burst(t, gws, 2, "/v2/agent/warmup/job", "svc_replica", `{"prompt":"x"}`, nil)
	before := redistest.ScriptCalls(t, client)
	codes := burst(t, gws, 100, "/v2/agent/shared/job", "svc_replica", `{"prompt":"x"}`, nil)
	if codes[201] != 30 || codes[429] != 70 {
		t.Fatalf("agent_job burst over two replicas: %v, want 30 admitted, 70 denied", codes)
	}
	if calls := redistest.ScriptCalls(t, client) - before; calls != 100 {
		t.Fatalf("%d Redis script calls for 100 limited requests, want 100", calls)
	}

	// Assistant requests from varied client IPs through a trusted proxy: only the org limit bites.
	var wg sync.WaitGroup
	var mu sync.Mutex
	total := map[int]int{}
	for i := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := http.Header{"X-Forwarded-For": {fmt.Sprintf("198.51.100.%d", i+1)}}
			c := burst(t, gws, 20, "/discovery/v1/assistant/acme-docs/message", "svc_dsc_replica", `{"fp":"a","messages":[]}`, h)
			mu.Lock()
			for k, v := range c {
				total[k] += v
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	if total[201] != 40 || total[429] != 40 {
		t.Fatalf("assistant burst: %v, want 40 admitted", total)
	}
	if got := upCount(); got != 2+70 {
		t.Fatalf("upstream saw %d requests, want exactly the 2 warm-ups and 70 admitted", got)
	}
}

// Redis killed mid-run and restarted, under both on_error modes.
func TestRedisKilledAndRestarted(t *testing.T) {
	for _, mode := range []string{"deny", "allow"} {
		t.Run(mode, func(t *testing.T) {
			srv := redistest.Start(t)
			upURL, _ := recordingUpstream(t)
			p := startGateway(t, upURL, fmt.Sprintf("redis:\n  addrs: [%q]\n  on_error: %s\n  timeout: 1s\n", srv.Addr, mode))
			gws := []*proc{p}
			if c := burst(t, gws, 5, "/v2/agent/p/job", "svc_k", `{"prompt":"x"}`, nil); c[201] != 5 {
				t.Fatalf("before: %v", c)
			}
			srv.Stop(t)
			start := time.Now()
			c := burst(t, gws, 20, "/v2/agent/p/job", "svc_k", `{"prompt":"x"}`, nil)
			if took := time.Since(start); took > 5*time.Second {
				t.Fatalf("20 requests with Redis down took %v", took)
			}
			want := map[string]int{"deny": 503, "allow": 201}[mode]
			if c[want] != 20 {
				t.Fatalf("Redis down, on_error %s: %v, want all %d", mode, c, want)
			}
			// The node's breaker is open, and the replica stays ready either way.
			waitMetric(t, p, `gateway_ratelimit_breaker_open{node="`+srv.Addr+`"}`, time.Second, func(v float64) bool { return v == 1 })
			res, err := http.Get("http://" + p.admin + "/readyz")
			if err != nil || res.StatusCode != 200 {
				t.Fatalf("readyz with the breaker open: %v %v", err, res)
			}
			res.Body.Close()
			srv.Restart(t)
			deadline := time.Now().Add(10 * time.Second)
			for {
				if limitedOK(t, p) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("no recovery after Redis restarted")
				}
				time.Sleep(200 * time.Millisecond)
			}
			// Exactness resumes: the restarted Redis lost its counters (no persistence), so a
			// fresh project admits exactly 100.
			if c := burst(t, gws, 120, "/v2/agent/fresh/job", "svc_k", `{"prompt":"x"}`, nil); c[201] != 100 || c[429] != 20 {
				t.Fatalf("after restart: %v", c)
			}
		})
	}
}

// limitedOK sends one agent job and reports whether the limiter decided it (a 201 carrying
// RateLimit headers, not one let through by on_error: allow).
func limitedOK(t *testing.T, p *proc) bool {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://"+p.public+"/v2/agent/probe/job", strings.NewReader(`{"prompt":"x"}`))
	req.Header.Set("Authorization", "Bearer svc_k")
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return false
	}
	res.Body.Close()
	return res.StatusCode == 201 && res.Header.Get("RateLimit") != ""
}

// Two gateway binaries on a real 3-master Redis Cluster (several addrs: go-redis's cluster
// client): a burst admits exactly the limit, and an assistant request, whose three counters
// live on different nodes, stays all-or-nothing.
func TestReplicasOnRedisCluster(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	upURL, upCount := recordingUpstream(t)
	addrs := make([]string, len(cl.Addrs))
	for i, a := range cl.Addrs {
		addrs[i] = fmt.Sprintf("%q", a)
	}
	cfg := fmt.Sprintf("redis:\n  addrs: [%s]\n  timeout: 2s\nlimits:\n  agent_job_per_project: {limit: 20}\n  assistant_per_org: {limit: 15}\n",
		strings.Join(addrs, ", "))
	gws := []*proc{startGateway(t, upURL, cfg), startGateway(t, upURL, cfg)}
	if c := burst(t, gws, 50, "/v2/agent/cluster/job", "svc_c", `{"prompt":"x"}`, nil); c[201] != 20 || c[429] != 30 {
		t.Fatalf("agent_job on the cluster: %v, want 20 admitted", c)
	}
	if c := burst(t, gws, 40, "/discovery/v1/assistant/acme/message", "svc_dsc_c", `{"fp":"a","messages":[]}`, nil); c[201] != 15 || c[429] != 25 {
		t.Fatalf("assistant on the cluster: %v, want 15 admitted", c)
	}
	// The org denied 25 times; the key's monthly counter must show only the 15 admitted.
	req, _ := http.NewRequest("POST", "http://"+gws[0].public+"/discovery/v1/assistant/other-org/message", strings.NewReader(`{"fp":"a","messages":[]}`))
	req.Header.Set("Authorization", "Bearer svc_dsc_c")
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if rl := res.Header.Get("RateLimit"); !strings.Contains(rl, `"assistant_per_key";r=9984;`) {
		t.Fatalf("RateLimit = %q: denied requests consumed the key's quota", rl)
	}
	if got := upCount(); got != 20+15+1 {
		t.Fatalf("upstream saw %d requests", got)
	}
}

// Through Sentinel (master_name set): the gateway finds the master and limits exactly.
func TestRedisSentinel(t *testing.T) {
	t.Parallel()
	master := redistest.Start(t)
	sentinel := redistest.StartSentinel(t, "gwmaster", master)
	upURL, _ := recordingUpstream(t)
	p := startGateway(t, upURL, fmt.Sprintf("redis:\n  addrs: [%q]\n  master_name: gwmaster\n  timeout: 2s\nlimits:\n  agent_job_per_project: {limit: 10}\n", sentinel.Addr))
	if c := burst(t, []*proc{p}, 25, "/v2/agent/s/job", "svc_s", `{"prompt":"x"}`, nil); c[201] != 10 || c[429] != 15 {
		t.Fatalf("via sentinel: %v, want 10 admitted", c)
	}
	keys, err := master.Client(t).Keys(t.Context(), "gw:agent_job_per_project:*").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("counters on the master: %q %v", keys, err)
	}
}
