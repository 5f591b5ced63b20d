package main

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/docsgate/gateway/internal/redistest"
)

// An invented-key flood in registry mode: 10,000 random svc_dsc_ keys from 100 client IPs
// against one replica. Each IP gets auth.failure_limit (30) lookups a minute, then 429
// too_many_auth_failures with no lookup at all: the flood costs Redis at most 30 GETs per IP,
// and a legitimate tenant on another IP keeps being served meanwhile.
func TestInventedKeyFlood(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	stats := srv.Client(t)
	up, _ := recordingUpstream(t)
	// redis.timeout 1s: the gateway here is a race-detector build sharing two cores with
	// Redis and the 21 senders, where a limiter call of the legitimate tenant sometimes waits
	// past the default 100 ms for a CPU, not for Redis. cache_ttl 1m: the legitimate key costs
	// one GET in all, so the flood's GETs can be counted exactly.
	cfg := fmt.Sprintf(`redis: {addrs: [%q], timeout: 1s}
auth: {mode: registry, cache_ttl: 1m}
client_ip: {trusted_proxies: ["127.0.0.1/32"]}
limits:
  assistant_per_ip: {limit: 1000000}
  assistant_per_org: {limit: 1000000}
`, srv.Addr)
	p := startGateway(t, up, cfg)
	cfgFile := writeConfig(t, fmt.Sprintf("upstream: {url: %q}\n%s", up, cfg))
	const legit = "svc_dsc_legitimatetenant0001legitimate"
	keysCLI(t, legit+"\n", "add", "-config", cfgFile, "--kind", "assistant", "--org", "acme", "--domain", "acme-docs")

	getsBefore := redistest.CommandCalls(t, stats, "get")
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 32}}
	send := func(ip, key string) (int, string, time.Duration) {
		req := assistantFrom(p.public, "acme-docs", key, ip)
		start := time.Now()
		res, err := client.Do(req)
		if err != nil {
			t.Error(err)
			return 0, "", 0
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		return res.StatusCode, string(body), time.Since(start)
	}

	// The legitimate tenant sends steadily from its own address while the flood runs.
	var stop atomic.Bool
	var legitTimes []time.Duration
	legitCodes := map[int]int{}
	var lwg sync.WaitGroup
	lwg.Add(1)
	go func() {
		defer lwg.Done()
		for !stop.Load() {
			code, _, took := send("192.0.2.200", legit)
			legitCodes[code]++
			legitTimes = append(legitTimes, took)
			time.Sleep(5 * time.Millisecond)
		}
	}()

	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	for w := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < 10000; i += 20 {
				var b [12]byte
				_, _ = rand.Read(b[:])
				code, body, _ := send(fmt.Sprintf("198.51.100.%d", i%100), "svc_dsc_"+hex.EncodeToString(b[:]))
				mu.Lock()
				codes[code]++
				mu.Unlock()
				if code == 429 && !strings.Contains(body, `"code":"too_many_auth_failures"`) {
					t.Errorf("429 body %s", body)
				}
			}
		}()
	}
	wg.Wait()
	stop.Store(true)
	lwg.Wait()
	gets := redistest.CommandCalls(t, stats, "get") - getsBefore

	sort.Slice(legitTimes, func(i, j int) bool { return legitTimes[i] < legitTimes[j] })
	p50, p99 := legitTimes[len(legitTimes)/2], legitTimes[len(legitTimes)*99/100]
	t.Logf("flood of 10,000 invented keys from 100 IPs: answers %v; %d Redis GETs (%.3f per invented key); legitimate tenant: %d requests %v, p50 %v, p99 %v",
		codes, gets, float64(gets)/10000, len(legitTimes), legitCodes, p50, p99)
	if codes[401] != 100*30 || codes[429] != 10000-100*30 {
		t.Fatalf("answers %v: want 30 lookups (401) per IP, then 429", codes)
	}
	// One GET per looked-up invented key (3,000), plus the legitimate key's first lookup
	// (and a second one should a resubscription have cleared the cache meanwhile).
	if gets < 100*30+1 || gets > 100*30+2 {
		t.Fatalf("%d GETs for the flood, want 30 per IP (3,000) and the legitimate key's lookup", gets)
	}
	if legitCodes[201] != len(legitTimes) {
		t.Fatalf("the legitimate tenant was refused during the flood: %v", legitCodes)
	}
}
