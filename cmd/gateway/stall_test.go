package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/docsgate/gateway/internal/redistest"
)

// A Redis that stalls while coalesced batches are in flight, met from outside: 64 concurrent
// requests reach the binary while Redis is paused (CLIENT PAUSE), so the calls past the first
// few go out as pipelined batches that get no reply. Every request is still answered (503
// limiter_unavailable) within redis.timeout plus a margin, none is sent to Redis twice, and
// once Redis answers again requests are admitted. The same burst against the binary with
// redis.coalesce: false shows the batches were real: Redis reads far more often without them.
func TestRedisPausedDuringBatch(t *testing.T) {
	reads := map[bool]int64{}
	for _, coalesce := range []bool{true, false} {
		t.Run(fmt.Sprintf("coalesce=%t", coalesce), func(t *testing.T) {
			reads[coalesce] = pausedBurst(t, coalesce)
		})
	}
	if t.Failed() {
		return
	}
	t.Logf("Redis reads during the paused burst: %d coalesced, %d not", reads[true], reads[false])
	if reads[true]*2 > reads[false] {
		t.Fatalf("Redis read %d times for the coalesced burst against %d without coalescing: no batches formed", reads[true], reads[false])
	}
}

// pausedBurst runs the burst against a fresh gateway and returns how many reads Redis
// processed for it.
func pausedBurst(t *testing.T, coalesce bool) int64 {
	const timeout = 100 * time.Millisecond
	const margin = 300 * time.Millisecond // -race on two noisy cores
	const burst = 64
	srv := redistest.Start(t)
	upURL, _ := recordingUpstream(t)
	// The breaker stays closed through the burst, so every request really waits on Redis.
	p := startGateway(t, upURL, fmt.Sprintf("redis:\n  addrs: [%q]\n  timeout: 100ms\n  coalesce: %t\n  breaker: {failures: 100000, cooldown: 100ms}\n", srv.Addr, coalesce))
	client := hardClient(5 * time.Second)
	// Warm: the script loaded and the pool and the client's connections open. Under -race a
	// cold burst may see a few calls past the 100 ms timeout, so only the last round counts.
	var wg sync.WaitGroup
	for round := range 3 {
		var mu sync.Mutex
		codes := map[int]int{}
		for i := range burst {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := hardDo(client, "POST", "http://"+p.public+fmt.Sprintf("/v2/agent/warm-%d/job", i), "svc_k", hardAgentBody, nil)
				mu.Lock()
				codes[r.status]++
				mu.Unlock()
			}()
		}
		wg.Wait()
		if round == 2 && codes[201] < burst/2 {
			t.Fatalf("warm-up before the pause: %v", codes)
		}
	}
	stats := srv.Client(t)
	reads0 := redisInfoInt(t, stats, "stats", "total_reads_processed")
	scripts0 := redisScriptCalls(t, stats)
	if err := stats.Do(context.Background(), "client", "pause", "1500", "all").Err(); err != nil {
		t.Fatal(err)
	}
	paused := time.Now()
	results := make([]hardResult, burst)
	for i := range burst {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = hardDo(client, "POST", "http://"+p.public+fmt.Sprintf("/v2/agent/stall-%d/job", i), "svc_k", hardAgentBody, nil)
		}()
	}
	wg.Wait()
	var slowest time.Duration
	for i, r := range results {
		slowest = max(slowest, r.took)
		if r.err != nil || r.status != 503 || !strings.Contains(r.body, "limiter_unavailable") {
			t.Errorf("request %d during the pause: %d %s %v", i, r.status, r.body, r.err)
		}
		if r.took > timeout+margin {
			t.Errorf("request %d answered after %v, over redis.timeout %v + %v", i, r.took, timeout, margin)
		}
	}
	if time.Since(paused) > 1400*time.Millisecond {
		t.Fatalf("the burst took %v: Redis was no longer paused for all of it", time.Since(paused))
	}
	t.Logf("slowest answer during the pause %v", slowest)
	// Once the pause is over Redis has read whatever was sent to it during it.
	time.Sleep(time.Until(paused.Add(1700 * time.Millisecond)))
	reads := redisInfoInt(t, stats, "stats", "total_reads_processed") - reads0
	// After the pause: admitted again.
	deadline := time.Now().Add(10 * time.Second)
	attempts := 0
	for {
		attempts++
		r := hardDo(client, "POST", "http://"+p.public+"/v2/agent/after/job", "svc_k", hardAgentBody, nil)
		if r.status == 201 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no request admitted after the pause: %d %s", r.status, r.body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A request whose call was sent before its deadline runs once when Redis wakes (counted,
	// never admitted); one whose deadline passed while queued is never sent. None runs twice.
	scripts := redisScriptCalls(t, stats) - scripts0
	if scripts > burst+int64(attempts) {
		t.Fatalf("%d script calls for %d requests during the pause and %d after", scripts, burst, attempts)
	}
	// The reads of the burst and of this test's own PAUSE and INFO commands.
	return reads
}

// redisInfoInt is one integer field of an INFO section.
func redisInfoInt(t *testing.T, c *redis.Client, section, field string) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), section).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && k == field {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no %s in INFO %s", field, section)
	return 0
}

// redisScriptCalls is the number of EVAL and EVALSHA calls Redis has run.
func redisScriptCalls(t *testing.T, c *redis.Client) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "cmdstat_evalsha" && name != "cmdstat_eval") {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		c, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			t.Fatalf("commandstats %q: %v", line, err)
		}
		n += c
	}
	return n
}
