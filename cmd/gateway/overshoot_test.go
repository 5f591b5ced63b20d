package main

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/docsgate/gateway/internal/redistest"
)

// replicationProxy forwards TCP to a Redis master. Once cut, it silently drops every byte of
// the replication connections (those whose client sent REPLCONF) in both directions, keeping
// them open: a replication link that stalls without breaking, as under a network partition.
// Other connections (Sentinels, clients) pass untouched.
type replicationProxy struct {
	ln  net.Listener
	cut atomic.Bool
}

func newReplicationProxy(t *testing.T, target string) *replicationProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &replicationProxy{ln: ln}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			repl := new(atomic.Bool)
			go p.pipe(u, c, repl, true)
			go p.pipe(c, u, repl, false)
		}
	}()
	return p
}

func (p *replicationProxy) pipe(dst, src net.Conn, repl *atomic.Bool, fromClient bool) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32*1024)
	for {
		n, err := src.Read(buf)
		if fromClient && n > 0 && strings.Contains(strings.ToUpper(string(buf[:n])), "REPLCONF") {
			repl.Store(true)
		}
		if n > 0 && !(repl.Load() && p.cut.Load()) {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Counting across a failover: counts the dying master admitted but never replicated are lost
// with it, and the tenant gets that many requests past its quota. With redis.wait_replicas: 1
// no request is admitted on a count the replica does not hold, and the overshoot is zero.
//
// The two runs go at once: each has its own Sentinel group and gateway, and mostly waits on
// Sentinel (its peers finding each other, the master's 1 s down-after, the election), and
// their calls' redis.timeout (200 ms) is far above what two such runs take at once.
func TestFailoverOvershoot(t *testing.T) {
	for _, wait := range []int{0, 1} {
		t.Run(fmt.Sprintf("wait_replicas=%d", wait), func(t *testing.T) {
			t.Parallel()
			var proxy *replicationProxy
			g := redistest.StartSentinelGroupVia(t, "gwshoot", func(master string) string {
				proxy = newReplicationProxy(t, master)
				return proxy.ln.Addr().String()
			})
			const quota = 200
			p := startGateway(t, tokenUpstream(t), fmt.Sprintf(`redis:
  addrs: [%s]
  master_name: gwshoot
  timeout: 200ms
  wait_replicas: %d
  breaker: {failures: 1000000, cooldown: 100ms}
limits:
  agent_job_per_project: {limit: %d, window: hour}
`, quoteAll(g.Addrs()), wait, quota))
			client := &http.Client{Timeout: 5 * time.Second}
			codes := map[int]int{}
			var mu sync.Mutex
			askSeq := func(n int) {
				for range n {
					req, _ := http.NewRequest("POST", "http://"+p.public+"/v2/agent/shoot/job", strings.NewReader(`{"prompt":"x"}`))
					req.Header.Set("Authorization", "Bearer svc_shoot")
					req.Header.Set("Content-Type", "application/json")
					res, err := client.Do(req)
					if err != nil {
						t.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, res.Body)
					res.Body.Close()
					mu.Lock()
					codes[res.StatusCode]++
					mu.Unlock()
				}
			}
			// ask sends n requests, 10 at a time.
			ask := func(n int) {
				var wg sync.WaitGroup
				for w := range 10 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						k := n / 10
						if w < n%10 {
							k++
						}
						askSeq(k)
					}()
				}
				wg.Wait()
			}
			phase := func(name string, f func()) {
				mu.Lock()
				before := map[int]int{}
				for k, v := range codes {
					before[k] = v
				}
				mu.Unlock()
				f()
				mu.Lock()
				diff := map[int]int{}
				for k, v := range codes {
					if v != before[k] {
						diff[k] = v - before[k]
					}
				}
				mu.Unlock()
				t.Logf("%s: %v", name, diff)
			}
			phase("replicated", func() { ask(100) })
			proxy.cut.Store(true)
			phase("replication cut", func() { ask(100) })
			g.Master.Stop(t)
			g.WaitPromoted(t, 30*time.Second)
			// A new replica joins the promoted master, as an orchestrator replaces the dead
			// node; until then, decisions with wait_replicas fail (503).
			redistest.StartReplica(t, g.Replica)
			// Ask until the promoted master denies for good.
			phase("after the failover", func() {
				deadline := time.Now().Add(30 * time.Second)
				for time.Now().Before(deadline) {
					mu.Lock()
					done := codes[429] >= 20
					mu.Unlock()
					if done {
						break
					}
					ask(10)
				}
			})
			overshoot := codes[201] - quota
			t.Logf("wait_replicas=%d: codes %v: %d admitted for a quota of %d (overshoot %d)", wait, codes, codes[201], quota, overshoot)
			switch wait {
			case 0:
				if overshoot != 100 {
					t.Fatalf("without waiting, the 100 unreplicated counts should be lost: overshoot %d", overshoot)
				}
			default:
				// Never past the quota. (Below it is possible: a decision the new replica had
				// not acknowledged yet fails with 503 while its count stays on the master.)
				if overshoot > 0 {
					t.Fatalf("with wait_replicas no request may pass the quota, got %d past it", overshoot)
				}
				if codes[503] < 100 {
					t.Fatalf("the unreplicated decisions must fail (503), got %v", codes)
				}
			}
		})
	}
}
