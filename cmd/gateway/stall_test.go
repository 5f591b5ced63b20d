package main

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docsgate/gateway/internal/redistest"
)

// A Redis that stalls while coalesced batches are in flight, met from outside, against the
// binary with coalescing on and off. 64 concurrent requests reach it while Redis is paused
// (CLIENT PAUSE), so the calls past the first few go out as pipelined batches:
//   - a pause shorter than redis.timeout: every request is admitted and makes exactly one
//     script call (none lost, none sent twice), and with coalescing Redis gets several calls
//     per read (the batches are real), against about one without;
//   - a pause longer than redis.timeout: every request is answered 503 limiter_unavailable
//     within redis.timeout plus a margin, none of them is counted, and once Redis answers
//     again requests are admitted.
func TestRedisPausedDuringBatch(t *testing.T) {
	perRead := map[bool]float64{}
	for _, coalesce := range []bool{true, false} {
		t.Run(fmt.Sprintf("coalesce=%t", coalesce), func(t *testing.T) {
			perRead[coalesce] = pausedBursts(t, coalesce)
		})
	}
	if t.Failed() {
		return
	}
	t.Logf("script calls per Redis read during the short pause: %.1f coalesced, %.1f not", perRead[true], perRead[false])
	if perRead[true] < 2 || perRead[true] < 2*perRead[false] {
		t.Fatalf("%.1f script calls per Redis read coalesced against %.1f without: no batches formed", perRead[true], perRead[false])
	}
}

const (
	stallBurst   = 64
	stallTimeout = 400 * time.Millisecond // well past the short pause, under -race beside other packages
	// On the gateway's own clock (its access log), so a stall of the test client or of the
	// machine between the two does not count; -race on two noisy cores.
	stallMargin = 300 * time.Millisecond
)

// pausedBursts runs both pauses against a fresh gateway and returns the script calls per
// Redis read during the short one.
func pausedBursts(t *testing.T, coalesce bool) float64 {
	srv := redistest.Start(t)
	upURL, _ := recordingUpstream(t)
	// The breaker stays closed through the bursts, so every request really waits on Redis.
	p := startGateway(t, upURL, fmt.Sprintf("redis:\n  addrs: [%q]\n  timeout: %s\n  coalesce: %t\n  breaker: {failures: 100000, cooldown: 100ms}\n",
		srv.Addr, stallTimeout, coalesce))
	client := hardClient(10 * time.Second)
	t.Cleanup(client.CloseIdleConnections)
	// Warm: the script loaded and the pool and the client's connections open. Under -race a
	// cold burst may see a few calls past the timeout, so only the last round counts.
	for round := range 3 {
		codes := map[int]int{}
		for _, r := range stallRequests(client, p, fmt.Sprintf("warm%d", round)) {
			codes[r.status]++
		}
		if round == 2 && codes[201] < stallBurst/2 {
			t.Fatalf("warm-up: %v", codes)
		}
	}
	stats := srv.Client(t)

	// Short pause: the calls wait in batches, then run.
	reads0 := redistest.InfoInt(t, stats, "stats", "total_reads_processed")
	scripts0 := redistest.ScriptCalls(t, stats)
	if err := stats.Do(context.Background(), "client", "pause", "80", "all").Err(); err != nil {
		t.Fatal(err)
	}
	for i, r := range stallRequests(client, p, "short") {
		if r.status != 201 {
			t.Errorf("request %d during the short pause: %d %s %v", i, r.status, r.body, r.err)
		}
	}
	// This test's own commands: the INFO commandstats and CLIENT PAUSE above, the INFO below.
	reads := redistest.InfoInt(t, stats, "stats", "total_reads_processed") - reads0 - 3
	if calls := redistest.ScriptCalls(t, stats) - scripts0; calls != stallBurst {
		t.Fatalf("%d script calls for %d requests admitted during the short pause", calls, stallBurst)
	}
	if reads < 1 {
		t.Fatalf("%d Redis reads for %d script calls", reads, stallBurst)
	}

	// Long pause: every call times out.
	scripts0 = redistest.ScriptCalls(t, stats)
	const pause = 3 * time.Second
	if err := stats.Do(context.Background(), "client", "pause", strconv.Itoa(int(pause/time.Millisecond)), "all").Err(); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	for i, r := range stallRequests(client, p, "long") {
		if r.err != nil || r.status != 503 || !strings.Contains(r.body, "limiter_unavailable") {
			t.Errorf("request %d during the long pause: %d %s %v", i, r.status, r.body, r.err)
		}
	}
	if took := time.Since(paused); took > pause-500*time.Millisecond {
		t.Fatalf("the burst took %v: Redis was not paused for all of it", took)
	}
	// A request's log line is written after its answer: wait for the last ones.
	var slowest float64
	n := 0
	for logWait := time.Now().Add(2 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		slowest, n = 0, 0
		for _, e := range accessLines(p) {
			if path, _ := e["path"].(string); strings.HasPrefix(path, "/v2/agent/long-") {
				n++
				d, _ := e["duration"].(float64)
				slowest = max(slowest, d)
			}
		}
		if n >= stallBurst || time.Now().After(logWait) {
			break
		}
	}
	if n != stallBurst {
		t.Fatalf("%d access-log lines for the %d requests of the long pause", n, stallBurst)
	}
	if bound := (stallTimeout + stallMargin).Seconds(); slowest > bound {
		t.Errorf("slowest request during the long pause took %.3fs in the gateway, over redis.timeout %v + %v", slowest, stallTimeout, stallMargin)
	}
	t.Logf("slowest answer during the long pause %.0f ms", slowest*1000)
	// The gateway closes a connection whose call timed out, and Redis drops a closed client's
	// pending commands; a call still queued at its deadline is never sent. So a request
	// refused during the stall consumed nothing.
	time.Sleep(time.Until(paused.Add(pause + 200*time.Millisecond)))
	if calls := redistest.ScriptCalls(t, stats) - scripts0; calls != 0 {
		t.Errorf("%d script calls ran for the %d requests refused during the long pause", calls, stallBurst)
	}
	// After the pause: admitted again.
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := hardDo(client, "POST", "http://"+p.public+"/v2/agent/after/job", "svc_k", hardAgentBody, nil)
		if r.status == 201 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no request admitted after the pause: %d %s", r.status, r.body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return float64(stallBurst) / float64(reads)
}

// stallRequests sends stallBurst agent_job requests at once, each to its own project.
func stallRequests(client *http.Client, p *proc, name string) []hardResult {
	results := make([]hardResult, stallBurst)
	var wg sync.WaitGroup
	for i := range stallBurst {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = hardDo(client, "POST", "http://"+p.public+fmt.Sprintf("/v2/agent/%s-%d/job", name, i), "svc_k", hardAgentBody, nil)
		}()
	}
	wg.Wait()
	return results
}
