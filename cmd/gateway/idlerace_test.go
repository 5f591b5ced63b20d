package main

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// Issue 23, section 3, idle close races: an upstream that closes idle keep-alive connections
// after 300 ms, and POSTs spaced 280-320 ms apart, so that some of them are written just as
// the upstream closes the connection they go out on. Both transports, with
// upstream.idle_timeout below the upstream's and with the default, each against its own
// upstream, all at once; every request is counted at the upstream.

// idleUpstream is a real net/http server whose keep-alive idle timeout is idle; it counts the
// deliveries of each request by the id in its body.
type idleUpstream struct {
	URL string

	mu    sync.Mutex
	seen  map[string]int
	conns int
}

func newIdleUpstream(t *testing.T, idle time.Duration) *idleUpstream {
	t.Helper()
	u := &idleUpstream{seen: map[string]int{}}
	srv := &http.Server{
		IdleTimeout: idle,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			var body struct{ Prompt string }
			if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
				http.Error(w, err.Error(), 400)
				return
			}
			u.mu.Lock()
			u.seen[body.Prompt]++
			u.mu.Unlock()
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(201)
			fmt.Fprintf(w, `{"id":%q,"status":"active"}`, body.Prompt)
		}),
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				u.mu.Lock()
				u.conns++
				u.mu.Unlock()
			}
		},
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	u.URL = "http://" + ln.Addr().String()
	return u
}

// idleRaceResult is what one variant saw.
type idleRaceResult struct {
	sent, failed int
	failures     []string // the first few, for the log
	duplicates   []string
	connections  int
}

// runIdleRace sends n POSTs through the gateway one after the other, each 280-320 ms after
// the previous answer, and checks every answer against the upstream's count.
func runIdleRace(t *testing.T, p *proc, up *idleUpstream, n int, rng *rand.Rand) idleRaceResult {
	client := hardClient(10 * time.Second)
	var r idleRaceResult
	answered := map[string]bool{}
	for i := range n {
		id := fmt.Sprintf("idle-%d", i)
		res := hardDo(client, "POST", fmt.Sprintf("http://%s/v2/agent/%s/job", p.public, id), "svc_idle", `{"prompt":"`+id+`"}`, nil)
		r.sent++
		switch {
		case res.status == 201 && res.err == nil && strings.Contains(res.body, `"id":"`+id+`"`):
			answered[id] = true
		default:
			r.failed++
			if len(r.failures) < 5 {
				r.failures = append(r.failures, fmt.Sprintf("%s: %d %q %v", id, res.status, res.body, res.err))
			}
		}
		time.Sleep(280*time.Millisecond + time.Duration(rng.IntN(40_001))*time.Microsecond)
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	for id, c := range up.seen {
		if c > 1 {
			r.duplicates = append(r.duplicates, fmt.Sprintf("%s delivered %d times", id, c))
		}
	}
	for id := range answered {
		if up.seen[id] != 1 {
			t.Errorf("%s answered 201 but delivered %d times", id, up.seen[id])
		}
	}
	r.connections = up.conns
	return r
}

func TestUpstreamIdleCloseRace(t *testing.T) {
	// 100 requests a variant, the four variants at once against their own upstreams: about
	// 30 s in all. With the default idle_timeout net/http's Transport failed 1, 1, 3, 6, 5 and
	// 1 of 100 in six runs on a loaded 2-core machine, and 0 in one (the pool without learning
	// the upstream's clock 2, 2 and 7; with it 0 every time but once, 1 before it had learned):
	// at 100 the race shows in almost every run, and about a quarter of the requests go out
	// within 5 ms of the upstream's closing moment.
	const n = 100
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	type variant struct {
		transport, idle string // idle "" keeps the default
	}
	variants := []variant{{"pool", "250ms"}, {"standard", "250ms"}, {"pool", ""}, {"standard", ""}}
	results := make([]idleRaceResult, len(variants))
	var wg sync.WaitGroup
	for i, v := range variants {
		up := newIdleUpstream(t, 300*time.Millisecond)
		extra := fmt.Sprintf("  transport: %s\n", v.transport)
		if v.idle != "" {
			extra += fmt.Sprintf("  idle_timeout: %s\n", v.idle)
		}
		p := startGatewayRaw(t, fmt.Sprintf("upstream:\n  url: %q\n%s", up.URL, extra))
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = runIdleRace(t, p, up, n, rand.New(rand.NewPCG(seed, uint64(i))))
		}()
	}
	wg.Wait()
	failed := map[variant]int{}
	for i, v := range variants {
		r := results[i]
		failed[v] = r.failed
		t.Logf("%s, idle_timeout %q: %d of %d failed, %d upstream connections %v", v.transport, v.idle, r.failed, r.sent, r.connections, r.failures)
		if len(r.duplicates) > 0 {
			t.Errorf("%s, idle_timeout %q: delivered twice: %v", v.transport, v.idle, r.duplicates)
		}
		if v.idle != "" && r.failed > 0 {
			t.Errorf("%s with idle_timeout %s, below the upstream's 300 ms: %d requests failed: %v", v.transport, v.idle, r.failed, r.failures)
		}
	}
	// The pool learns the upstream's clock from the first close it meets, a failed request's
	// included, and then retires connections before it: at most that one request fails in
	// guessLife (a minute, longer than this run). net/http's Transport goes on failing one
	// now and then (0 to 7 in 100, most often 1 to 3): comparing the two would fail on the
	// runs where it happened to fail none.
	if pool, std := failed[variant{"pool", ""}], failed[variant{"standard", ""}]; pool > 1 {
		t.Errorf("default idle_timeout: the pool failed %d requests, at most one may (net/http's Transport failed %d)", pool, std)
	}
}

// upstream.idle_timeout reaches both transports: against an upstream that keeps idle
// connections a minute, a connection idle about 300 ms is closed by the gateway under
// idle_timeout: 250ms, and reused under the default.
func TestUpstreamIdleTimeoutApplied(t *testing.T) {
	for _, tr := range transports {
		for _, c := range []struct {
			idle  string
			conns int
		}{{"250ms", 2}, {"", 1}} {
			up := newIdleUpstream(t, time.Minute)
			extra := fmt.Sprintf("  transport: %s\n", tr)
			if c.idle != "" {
				extra += fmt.Sprintf("  idle_timeout: %s\n", c.idle)
			}
			p := startGatewayRaw(t, fmt.Sprintf("upstream:\n  url: %q\n%s", up.URL, extra))
			r := runIdleRace(t, p, up, 2, rand.New(rand.NewPCG(1, 2)))
			if r.failed > 0 || r.connections != c.conns {
				t.Errorf("%s, idle_timeout %q: %d failed, %d upstream connections for two requests 280-320 ms apart, want %d", tr, c.idle, r.failed, r.connections, c.conns)
			}
		}
	}
}
