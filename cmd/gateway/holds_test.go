package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/docsgate/gateway/internal/redistest"
)

// gatedUpstream answers assistant requests with an AI SDK data stream that sends its first
// text at once and then waits for the test to open the gate; it then finishes with the usage
// the request's fp chose ("t-P-C": P prompt and C completion tokens); "status-N" answers
// status N at once, "abort" breaks the connection before answering. It counts the answers
// in flight at the upstream, and their peak.
type gatedUpstream struct {
	url            string
	inflight, peak atomic.Int64
	mu             sync.Mutex
	gate           chan struct{}
}

func newGatedUpstream(t *testing.T) *gatedUpstream {
	u := &gatedUpstream{gate: make(chan struct{})}
	u.url = serveHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := u.inflight.Add(1)
		defer u.inflight.Add(-1)
		for {
			p := u.peak.Load()
			if n <= p || u.peak.CompareAndSwap(p, n) {
				break
			}
		}
		var body struct {
			FP string `json:"fp"`
		}
		_ = json.NewDecoder(r.Body).Decode(&body)
		var status int
		switch {
		case body.FP == "abort": // the connection breaks before any answer
			panic(http.ErrAbortHandler)
		case strings.HasPrefix(body.FP, "status-"):
			_, _ = fmt.Sscanf(body.FP, "status-%d", &status)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			fmt.Fprint(w, `{"error":"no"}`)
			return
		}
		u.mu.Lock()
		gate := u.gate
		u.mu.Unlock()
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprint(w, "f:{\"messageId\":\"m\"}\n0:\"hi\"\n")
		w.(http.Flusher).Flush()
		select {
		case <-gate:
		case <-r.Context().Done():
			return
		}
		var p, c int
		if _, err := fmt.Sscanf(strings.ReplaceAll(body.FP, "-", " "), "t %d %d", &p, &c); err != nil {
			t.Errorf("bad fp %q", body.FP)
		}
		fmt.Fprintf(w, "d:{\"finishReason\":\"stop\",\"usage\":{\"promptTokens\":%d,\"completionTokens\":%d}}\n", p, c)
	}))
	return u
}

// open lets the answers waiting at the gate finish; later ones wait at a new gate.
func (u *gatedUpstream) open() {
	u.mu.Lock()
	defer u.mu.Unlock()
	close(u.gate)
	u.gate = make(chan struct{})
}

// streamResult is what a client saw of one streamed request.
type streamResult struct {
	status     int
	retryAfter string
	rateLimit  string // the RateLimit header
	code       string
	limit      string
}

// startStreams sends n assistant requests of acme at once, spread over the replicas, and
// returns once every one has its status; the admitted ones keep reading their streams until
// they end (done).
func startStreams(t *testing.T, ps []*proc, n int, fp string) (results []streamResult, done *sync.WaitGroup) {
	t.Helper()
	return startStreamsTo(t, ps, n, "acme-docs", fp)
}

// startStreamsTo is startStreams for the assistant of domain.
func startStreamsTo(t *testing.T, ps []*proc, n int, domain, fp string) (results []streamResult, done *sync.WaitGroup) {
	t.Helper()
	got := make(chan streamResult, n)
	done = &sync.WaitGroup{}
	for i := range n {
		done.Add(1)
		go func() {
			defer done.Done()
			p := ps[i%len(ps)]
			req, _ := http.NewRequest("POST", "http://"+p.public+"/discovery/v1/assistant/"+domain+"/message", strings.NewReader(`{"fp":"`+fp+`","messages":[]}`))
			req.Header.Set("Authorization", fmt.Sprintf("Bearer svc_dsc_key%d", i))
			req.Header.Set("Content-Type", "application/json")
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				got <- streamResult{}
				return
			}
			defer res.Body.Close()
			r := streamResult{status: res.StatusCode, retryAfter: res.Header.Get("Retry-After"), rateLimit: res.Header.Get("RateLimit")}
			if res.StatusCode != 200 {
				var e struct {
					Code  string `json:"code"`
					Limit string `json:"limit"`
				}
				_ = json.NewDecoder(res.Body).Decode(&e)
				r.code, r.limit = e.Code, e.Limit
			}
			got <- r
			_, _ = io.Copy(io.Discard, res.Body)
		}()
	}
	timeout := time.After(30 * time.Second)
	for range n {
		select {
		case r := <-got:
			results = append(results, r)
		case <-timeout:
			t.Fatalf("only %d of %d requests answered", len(results), n)
		}
	}
	return results, done
}

func countStatus(rs []streamResult, status int) int {
	n := 0
	for _, r := range rs {
		if r.status == status {
			n++
		}
	}
	return n
}

type orgUsage struct {
	Name      string `json:"name"`
	Unit      string `json:"unit"`
	Limit     int64  `json:"limit"`
	Used      int64  `json:"used"`
	Reserved  int64  `json:"reserved"`
	Remaining int64  `json:"remaining"`
}

// acmeUsage reads limit name of acme from the admin API of p.
func acmeUsage(t *testing.T, p *proc, name string) orgUsage {
	t.Helper()
	return orgLimitUsage(t, p, "acme", name)
}

// waitUsage polls until limit name of acme reads used and reserved (settling runs after the
// answer), failing with the last reading.
func waitUsage(t *testing.T, p *proc, name string, used, reserved int64, within time.Duration) orgUsage {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		u := acmeUsage(t, p, name)
		if u.Used == used && u.Reserved == reserved {
			return u
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: used %d reserved %d, want %d and %d", name, u.Used, u.Reserved, used, reserved)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// holdStores are the stores the binary tests run on: replicas gateways sharing one. As in
// TestReplicasShareRedis, redis.timeout is 2s: these tests prove exactness, not latency, and
// 40 concurrent requests on cold connections under -race on a shared 2-core machine are slow.
type holdStore struct {
	name     string
	replicas int
	redis    func(t *testing.T) string
}

func holdStores() []holdStore {
	return []holdStore{
		{"memory", 1, func(*testing.T) string { return "" }},
		{"redis", 2, func(t *testing.T) string {
			return fmt.Sprintf("redis: {addrs: [%q], timeout: 2s}\n", redistest.Start(t).Addr)
		}},
		{"cluster", 2, func(t *testing.T) string {
			return fmt.Sprintf("redis: {addrs: [%s], timeout: 2s}\n", quoteAll(redistest.StartCluster(t, 3).Addrs))
		}},
	}
}

const holdsConfig = `orgs: {acme: [acme-docs]}
limits:
  assistant_tokens_per_org: {limit: 1000, window: month, by: org, unit: tokens, reserve: 100}
routes:
  - name: assistant_message
    limits: [assistant_per_key, assistant_per_org, assistant_per_ip, assistant_tokens_per_org]
`

func startReplicas(t *testing.T, up string, st holdStore, cfg string) []*proc {
	store := st.redis(t)
	var ps []*proc
	for range st.replicas {
		ps = append(ps, startGateway(t, up, store+cfg))
	}
	return ps
}

// 40 concurrent slow streams from two replicas against 1,000 tokens with a reserve of 100
// and answers of 100 tokens: exactly 10 are admitted (10 at the upstream at once), the final
// use is exactly 1,000, and nothing more is admitted in the window.
func TestTokenReserveExactUnderConcurrency(t *testing.T) {
	t.Parallel()
	for _, st := range holdStores() {
		t.Run(st.name, func(t *testing.T) {
			up := newGatedUpstream(t)
			ps := startReplicas(t, up.url, st, holdsConfig)
			rs, done := startStreams(t, ps, 40, "t-40-60")
			if ok, denied := countStatus(rs, 200), countStatus(rs, 429); ok != 10 || denied != 30 {
				t.Fatalf("admitted %d and denied %d, want 10 and 30", ok, denied)
			}
			for _, r := range rs {
				if r.status == 429 && (r.code != "rate_limited" || r.limit != "assistant_tokens_per_org" || r.retryAfter != "1") {
					t.Fatalf("denial while tokens are held: %+v (want rate_limited, the limit, Retry-After 1)", r)
				}
			}
			if u := acmeUsage(t, ps[0], "assistant_tokens_per_org"); u.Used != 0 || u.Reserved != 1000 || u.Remaining != 0 {
				t.Fatalf("usage in flight: %+v", u)
			}
			// Each admission's RateLimit header shows the remaining net of every hold, its
			// own included: 900, 800, ..., 0, each once.
			seen := map[string]bool{}
			for _, r := range rs {
				if r.status == 200 {
					_, after, _ := strings.Cut(r.rateLimit, `"assistant_tokens_per_org";r=`)
					rem, _, _ := strings.Cut(after, ";")
					seen[rem] = true
				}
			}
			for rem := 0; rem <= 900; rem += 100 {
				if !seen[fmt.Sprint(rem)] {
					t.Fatalf("no admission saw remaining %d net of holds: %v", rem, seen)
				}
			}
			if peak := up.peak.Load(); peak != 10 {
				t.Fatalf("%d answers at the upstream at once, want 10", peak)
			}
			up.open()
			done.Wait()
			u := waitUsage(t, ps[len(ps)-1], "assistant_tokens_per_org", 1000, 0, 10*time.Second)
			t.Logf("%s: final use %d of 1000 (overshoot %d)", st.name, u.Used, u.Used-1000)
			rs, done = startStreams(t, ps, 4, "t-40-60")
			done.Wait()
			if countStatus(rs, 429) != 4 {
				t.Fatalf("a spent budget admitted: %+v", rs)
			}
			if r := rs[0]; r.retryAfter == "1" {
				t.Fatalf("a spent budget must retry at the window's end, not in 1 second: %+v", r)
			}
		})
	}
}

// Answers of 50 tokens against a reserve of 100: each settles half its hold back, so once
// the first answers finish more are admitted: 10, then 5, 2, 1 and 1, and the budget ends at
// 950 used with less than a reserve left.
func TestTokenReserveRefundsAdmitMore(t *testing.T) {
	t.Parallel()
	for _, st := range holdStores() {
		t.Run(st.name, func(t *testing.T) {
			up := newGatedUpstream(t)
			ps := startReplicas(t, up.url, st, holdsConfig)
			var waves []int
			used := int64(0)
			for range 8 {
				rs, done := startStreams(t, ps, 40, "t-20-30")
				n := countStatus(rs, 200)
				if n+countStatus(rs, 429) != 40 {
					t.Fatalf("unexpected answers: %+v", rs)
				}
				up.open()
				done.Wait()
				used += 50 * int64(n)
				waitUsage(t, ps[0], "assistant_tokens_per_org", used, 0, 10*time.Second)
				if n == 0 {
					break
				}
				waves = append(waves, n)
			}
			if fmt.Sprint(waves) != "[10 5 2 1 1]" || used != 950 {
				t.Fatalf("admitted by wave %v, used %d; want [10 5 2 1 1] and 950", waves, used)
			}
		})
	}
}

const streamsConfig = `orgs: {acme: [acme-docs]}
limits:
  assistant_streams_per_org: {limit: 5, by: org, unit: streams}
routes:
  - name: assistant_message
    limits: [assistant_per_key, assistant_per_org, assistant_per_ip, assistant_streams_per_org]
`

// A stream cap of 5 under 20 concurrent streams from two replicas: never more than 5 at the
// upstream, the others refused 429 rate_limited naming the limit with Retry-After: 1; the
// slots come back when the answers end.
func TestStreamsCapAtUpstream(t *testing.T) {
	t.Parallel()
	for _, st := range holdStores() {
		t.Run(st.name, func(t *testing.T) {
			up := newGatedUpstream(t)
			ps := startReplicas(t, up.url, st, streamsConfig)
			for wave := range 2 {
				rs, done := startStreams(t, ps, 20, "t-1-1")
				if ok := countStatus(rs, 200); ok != 5 {
					t.Fatalf("wave %d: admitted %d, want 5", wave, ok)
				}
				for _, r := range rs {
					if r.status != 200 && (r.status != 429 || r.code != "rate_limited" || r.limit != "assistant_streams_per_org" || r.retryAfter != "1") {
						t.Fatalf("wave %d: denial %+v", wave, r)
					}
				}
				if u := acmeUsage(t, ps[0], "assistant_streams_per_org"); u.Used != 5 || u.Remaining != 0 || u.Unit != "streams" {
					t.Fatalf("usage in flight: %+v", u)
				}
				for _, r := range rs {
					if !strings.Contains(r.rateLimit, `"assistant_streams_per_org";r=`) {
						t.Fatalf("no RateLimit for the streams limit: %+v", r)
					}
				}
				up.open()
				done.Wait()
				waitUsage(t, ps[0], "assistant_streams_per_org", 0, 0, 10*time.Second)
			}
			if peak := up.peak.Load(); peak != 5 {
				t.Fatalf("%d answers at the upstream at once, want 5", peak)
			}
		})
	}
}

// A replica killed with SIGKILL mid-stream leaves its token holds and stream slots behind;
// the other replica sees them held (it denies for the slots) until reserve_ttl, then they
// come back by themselves (what their answers had passed at their last refresh is charged by
// the tenant's next decision: TestKilledReplicaAnswersCharged).
func TestHoldsOfKilledReplicaComeBack(t *testing.T) {
	t.Parallel()
	for _, st := range holdStores()[1:] {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel() // each store its own servers, gateways and upstream; the ttl is waited out together
			up := newGatedUpstream(t)
			const ttl = 3 * time.Second
			ps := startReplicas(t, up.url, st, `orgs: {acme: [acme-docs]}
limits:
  assistant_tokens_per_org: {limit: 1000, window: month, by: org, unit: tokens, reserve: 100, reserve_ttl: 3s}
  assistant_streams_per_org: {limit: 5, by: org, unit: streams, reserve_ttl: 3s}
routes:
  - name: assistant_message
    limits: [assistant_per_key, assistant_per_org, assistant_per_ip, assistant_tokens_per_org, assistant_streams_per_org]
`)
			doomed, survivor := ps[0], ps[1]
			rs, done := startStreams(t, []*proc{doomed}, 5, "t-40-60")
			if countStatus(rs, 200) != 5 {
				t.Fatalf("admitted %+v", rs)
			}
			taken := time.Now()
			if err := doomed.cmd.Process.Kill(); err != nil { // SIGKILL: nothing is settled
				t.Fatal(err)
			}
			done.Wait()
			if u := acmeUsage(t, survivor, "assistant_tokens_per_org"); u.Reserved != 500 || u.Used != 0 {
				t.Fatalf("holds of the dead replica: %+v", u)
			}
			if u := acmeUsage(t, survivor, "assistant_streams_per_org"); u.Used != 5 {
				t.Fatalf("slots of the dead replica: %+v", u)
			}
			rs, done = startStreams(t, []*proc{survivor}, 1, "t-40-60")
			done.Wait()
			if r := rs[0]; r.status != 429 || r.limit != "assistant_streams_per_org" || r.retryAfter != "1" {
				t.Fatalf("the dead replica's slots must still deny: %+v", r)
			}
			waitUsage(t, survivor, "assistant_tokens_per_org", 0, 0, ttl+10*time.Second)
			waitUsage(t, survivor, "assistant_streams_per_org", 0, 0, time.Second)
			back := time.Since(taken)
			if back < ttl-500*time.Millisecond {
				t.Fatalf("the holds came back after %v, before reserve_ttl %v", back, ttl)
			}
			t.Logf("%s: holds and slots back %v after they were taken (reserve_ttl %v)", st.name, back.Round(10*time.Millisecond), ttl)
			rs, done = startStreams(t, []*proc{survivor}, 6, "t-40-60")
			up.open()
			done.Wait()
			if countStatus(rs, 200) != 5 {
				t.Fatalf("after reserve_ttl the survivor must admit 5 again: %+v", rs)
			}
		})
	}
}

// Holds cost no extra round trip: MONITOR sees exactly one script call per admission (the
// take, which also takes the hold and the slot) and one when the answer ends (the settle), and
// no other command.
func TestHoldsOneScriptCallPerAdmission(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	up := newGatedUpstream(t)
	// redis.timeout 2s: exact counts are checked, not the timeout (exactTimeout).
	p := startGateway(t, up.url, fmt.Sprintf("redis: {addrs: [%q], timeout: 2s}\n", srv.Addr)+`orgs: {acme: [acme-docs], globex: [globex-docs]}
limits:
  assistant_tokens_per_org: {limit: 1000, window: month, by: org, unit: tokens, reserve: 100}
  assistant_streams_per_org: {limit: 5, by: org, unit: streams}
routes:
  - name: assistant_message
    limits: [assistant_per_key, assistant_per_org, assistant_per_ip, assistant_tokens_per_org, assistant_streams_per_org]
`)
	lines, stop := watchMonitor(t, srv.Addr)
	// drain collects the commands until want script calls came (or 5 s passed), and 200 ms
	// more to catch any extra.
	drain := func(want int) (scripts, other []string) {
		quiet := time.Time{}
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
			if len(scripts) >= want && quiet.IsZero() {
				quiet = time.Now().Add(200 * time.Millisecond)
			}
			if !quiet.IsZero() && time.Now().After(quiet) {
				break
			}
			select {
			case l := <-lines:
				switch monitorKind(l) {
				case monitorScript:
					scripts = append(scripts, l)
				case monitorOther:
					other = append(other, l)
				}
			case <-time.After(10 * time.Millisecond):
			}
		}
		return scripts, other
	}
	for i := range 5 {
		rs, done := startStreams(t, []*proc{p}, 1, "t-40-60")
		if rs[0].status != 200 {
			t.Fatalf("request %d: %+v", i, rs[0])
		}
		scripts, other := drain(1)
		if len(scripts) != 1 || len(other) != 0 || !strings.Contains(scripts[0], "assistant_streams_per_org") || !strings.Contains(scripts[0], "assistant_tokens_per_org") {
			t.Fatalf("admission %d: script calls %v, other commands %v; want one script call with both limits", i, scripts, other)
		}
		up.open()
		done.Wait()
		scripts, other = drain(1)
		if len(scripts) != 1 || len(other) != 0 {
			t.Fatalf("end of answer %d: script calls %v, other commands %v; want one (the settle)", i, scripts, other)
		}
	}
	stop()
}

// A hold is settled by how the answer ended: released when the upstream refused or failed
// before any answer text (4xx, 5xx, a broken connection), charged the estimate when the
// client went away mid-stream (its body's and the passed text's tokens), and charged the
// answer's tokens when the answer ran past reserve_ttl, during which its hold stayed counted
// (refreshed) and did not expire.
func TestHoldSettlement(t *testing.T) {
	t.Parallel()
	up := newGatedUpstream(t)
	srv := redistest.Start(t)
	// redis.timeout 2s: exact counts are checked, not the timeout (exactTimeout).
	p := startGateway(t, up.url, fmt.Sprintf("redis: {addrs: [%q], timeout: 2s}\n", srv.Addr)+`orgs: {acme: [acme-docs]}
limits:
  assistant_tokens_per_org: {limit: 1000, window: month, by: org, unit: tokens, reserve: 100, reserve_ttl: 1s}
  assistant_streams_per_org: {limit: 1, by: org, unit: streams}
routes:
  - name: assistant_message
    limits: [assistant_per_key, assistant_per_org, assistant_per_ip, assistant_tokens_per_org, assistant_streams_per_org]
`)
	const name = "assistant_tokens_per_org"
	// The one slot comes back however the answer ended, or the next request would be refused.
	slotBack := func(why string) {
		t.Helper()
		if u := waitUsage(t, p, "assistant_streams_per_org", 0, 0, 5*time.Second); u.Remaining != 1 {
			t.Fatalf("%s: the slot must be back: %+v", why, u)
		}
	}
	for _, fp := range []string{"status-500", "status-403", "status-429", "status-400", "abort"} {
		rs, done := startStreams(t, []*proc{p}, 1, fp)
		done.Wait()
		if rs[0].status < 400 {
			t.Fatalf("%s: %+v", fp, rs[0])
		}
		if u := waitUsage(t, p, name, 0, 0, 5*time.Second); u.Remaining != 1000 {
			t.Fatalf("%s: the hold must be released: %+v", fp, u)
		}
		slotBack(fp)
	}

	// The client reads the first text and goes away: 32 bytes of conversation text (8 tokens)
	// and 2 of answer text (1 token) are charged, as for any stream without usage.
	req, _ := http.NewRequest("POST", "http://"+p.public+"/discovery/v1/assistant/acme-docs/message", strings.NewReader(`{"fp":"t-40-60","messages":[{"id":"1","role":"user","content":"0123456789abcdefghijklmnopqrstuv"}]}`))
	req.Header.Set("Authorization", "Bearer svc_dsc_gone")
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("%v %v", res, err)
	}
	buf := make([]byte, 64)
	if _, err := io.ReadAtLeast(res.Body, buf, len("f:{\"messageId\":\"m\"}\n0:\"hi\"\n")); err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	waitUsage(t, p, name, 9, 0, 5*time.Second)
	slotBack("client gone")

	// An answer that costs more than its reserve is charged all of it (150 for a hold of 100).
	rs, done := startStreams(t, []*proc{p}, 1, "t-70-80")
	if rs[0].status != 200 {
		t.Fatalf("%+v", rs[0])
	}
	up.open()
	done.Wait()
	waitUsage(t, p, name, 159, 0, 5*time.Second)
	slotBack("charged past the reserve")

	// An answer longer than reserve_ttl (1s): its hold stays counted while it lives (the
	// gateway refreshes it), and the settle charges its 100 tokens.
	rs, done = startStreams(t, []*proc{p}, 1, "t-40-60")
	if rs[0].status != 200 {
		t.Fatalf("%+v", rs[0])
	}
	time.Sleep(2500 * time.Millisecond)
	if u := acmeUsage(t, p, name); u.Used != 159 || u.Reserved != 100 {
		t.Fatalf("the hold of an answer in flight past reserve_ttl: %+v, want 100 reserved", u)
	}
	up.open()
	done.Wait()
	waitUsage(t, p, name, 259, 0, 5*time.Second)
	slotBack("finished")
	_, metrics := adminGet(t, p, "/metrics", "")
	if !strings.Contains(metrics, `gateway_ratelimit_holds_expired_total{limit="assistant_tokens_per_org"} 0`) {
		t.Fatalf("a refreshed hold counted as expired:\n%s", grepLines(metrics, "holds_expired"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// Holds and streams limits are refused where they mean nothing, each naming its key.
func TestHoldConfigRefused(t *testing.T) {
	t.Parallel()
	const up = "upstream: {url: 'http://127.0.0.1:1'}\norgs: {acme: [acme-docs]}\n"
	cases := []struct{ limits, want string }{
		{"s: {limit: 5, window: hour, by: org, unit: streams}", "limits.s.window: a streams limit counts answers in flight and has no window"},
		{"s: {limit: 5, by: org, unit: streams, algorithm: gcra}", "limits.s.algorithm: a streams limit has no algorithm"},
		{"s: {limit: 5, by: org, unit: stream}", `limits.s.unit: "stream" is not requests, tokens or streams`},
		{"r: {limit: 5, window: hour, by: org, reserve: 1}", "limits.r.reserve: only a tokens limit holds a reserve"},
		{"r: {limit: 5, window: hour, by: org, reserve_ttl: 1m}", "limits.r.reserve_ttl: only a tokens limit with a reserve or a streams limit"},
		{"t: {limit: 5, window: hour, by: org, unit: tokens, reserve_ttl: 1m}", "limits.t.reserve_ttl: only a tokens limit with a reserve or a streams limit"},
		{"t: {limit: 50, window: hour, by: org, unit: tokens, reserve: 51}", "limits.t.reserve: 51 is more than the limit (50)"},
		{"t: {limit: 50, window: hour, by: org, unit: tokens, reserve: -1}", "limits.t.reserve: must not be negative"},
		{"t: {limit: 50, window: hour, by: org, unit: tokens, reserve: 5, reserve_ttl: -1s}", "limits.t.reserve_ttl: -1s: must be at least 1s"},
		{"s: {limit: 5, by: org, unit: streams, reserve_ttl: 500ms}", "limits.s.reserve_ttl: 500ms: must be at least 1s"},
		{"t: {limit: 50, window: hour, by: org, unit: tokens, reserve: 5}\nplans: {gold: {t: {limit: 4}}}", "plans.gold.t.reserve: 5 is more than the limit (4)"},
		{"t: {limit: 50, window: hour, by: org, unit: tokens}\nplans: {gold: {t: {reserve: 60}}}", "plans.gold.t.reserve: 60 is more than the limit (50)"},
		{"s: {limit: 5, by: org, unit: streams}\nplans: {gold: {s: {window: hour}}}", "plans.gold.s.window: a streams limit counts answers in flight and has no window"},
		{"r: {limit: 5, window: hour, by: org, estimate_max: 10}", "limits.r.estimate_max: only a tokens limit charges an estimate"},
		{"t: {limit: 50, window: hour, by: org, unit: tokens, estimate_max: -1}", "limits.t.estimate_max: -1 is not a number of tokens from 0 to"},
		{"t: {limit: 50, window: hour, by: org, unit: tokens}\nplans: {gold: {t: {estimate_max: -5}}}", "plans.gold.t.estimate_max: -5 is not a number of tokens"},
		{"s: {limit: 5, by: org, unit: streams}\nplans: {gold: {s: {estimate_max: 9}}}", "plans.gold.s.estimate_max: only a tokens limit charges an estimate"},
		{"t: {limit: 50, window: hour, by: project, unit: tokens}", "limits.t.by: a tokens limit counts by org, key or ip, not project"},
	}
	for _, c := range cases {
		cfg := up + "limits:\n  " + c.limits + "\n"
		out, err := exec.Command(gatewayBin, "-check-config", "-config", writeConfig(t, cfg)).CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), c.want) {
			t.Errorf("%s: %v %s, want exit 2 naming %q", c.limits, err, out, c.want)
		}
	}
	// The example passes.
	ok := up + `limits:
  assistant_streams_per_org: {limit: 50, by: org, unit: streams, mode: shadow}
  assistant_tokens_per_org: {limit: 1000000, window: month, by: org, unit: tokens, reserve: 4000, reserve_ttl: 10m}
  assistant_tokens_per_ip: {limit: 100000, window: day, by: ip, unit: tokens, reserve: 4000, estimate_max: 1000}
plans: {gold: {assistant_tokens_per_org: {estimate_max: 8000}}}
routes:
  - name: assistant_message
    limits: [assistant_per_key, assistant_per_org, assistant_per_ip, assistant_tokens_per_org, assistant_tokens_per_ip, assistant_streams_per_org]
`
	if out, err := exec.Command(gatewayBin, "-check-config", "-config", writeConfig(t, ok)).CombinedOutput(); err != nil {
		t.Fatalf("the example is refused: %v %s", err, out)
	}
}

// /usage/top and the usage page show what answers in flight hold beside what they used, and
// the streams in flight.
func TestReservedInTopAndPage(t *testing.T) {
	t.Parallel()
	for _, st := range holdStores() {
		t.Run(st.name, func(t *testing.T) {
			up := newGatedUpstream(t)
			ps := startReplicas(t, up.url, st, `orgs: {acme: [acme-docs]}
limits:
  assistant_tokens_per_org: {limit: 1000, window: month, by: org, unit: tokens, reserve: 100}
  assistant_streams_per_org: {limit: 50, by: org, unit: streams, mode: shadow}
routes:
  - name: assistant_message
    limits: [assistant_per_key, assistant_per_org, assistant_per_ip, assistant_tokens_per_org, assistant_streams_per_org]
`)
			rs, done := startStreams(t, ps, 3, "t-20-30")
			if countStatus(rs, 200) != 3 {
				t.Fatalf("%+v", rs)
			}
			code, body := adminGet(t, ps[0], "/usage/top?limit=assistant_tokens_per_org", "")
			if code != 200 || !strings.Contains(body, `"id":"acme"`) || !strings.Contains(body, `"used":0,"reserved":300,"limit":1000,"remaining":700`) {
				t.Fatalf("/usage/top: %d %s", code, body)
			}
			code, body = adminGet(t, ps[0], "/usage/top?limit=assistant_streams_per_org", "")
			if code != 200 || !strings.Contains(body, `"unit":"streams"`) || !strings.Contains(body, `"used":3,"limit":50,"remaining":47`) {
				t.Fatalf("/usage/top streams: %d %s", code, body)
			}
			code, body = adminGet(t, ps[0], "/ui/", "")
			if code != 200 || !strings.Contains(body, "+300 reserved") || !strings.Contains(body, "streams in flight, by org") {
				t.Fatalf("usage page: %d %s", code, grepLines(body, "reserved"))
			}
			up.open()
			done.Wait()
			waitUsage(t, ps[0], "assistant_tokens_per_org", 150, 0, 10*time.Second)
			code, body = adminGet(t, ps[0], "/usage/top?limit=assistant_tokens_per_org", "")
			if code != 200 || !strings.Contains(body, `"used":150,"reserved":0,"limit":1000,"remaining":850`) {
				t.Fatalf("/usage/top after: %d %s", code, body)
			}
		})
	}
}

// A shadow tokens limit with a reserve never denies: while it has room each answer holds its
// reserve and is settled; once it has none, answers are admitted without a hold and debited
// after they end, so no token is lost to it.
func TestShadowReserveDebitsWithoutRoom(t *testing.T) {
	t.Parallel()
	up := newGatedUpstream(t)
	p := startGateway(t, up.url, `orgs: {acme: [acme-docs]}
limits:
  assistant_tokens_per_org: {limit: 200, window: month, by: org, unit: tokens, reserve: 100, mode: shadow}
routes:
  - name: assistant_message
    limits: [assistant_per_key, assistant_per_org, assistant_per_ip, assistant_tokens_per_org]
`)
	rs, done := startStreams(t, []*proc{p}, 4, "t-40-60")
	if countStatus(rs, 200) != 4 {
		t.Fatalf("a shadow limit denied: %+v", rs)
	}
	if u := acmeUsage(t, p, "assistant_tokens_per_org"); u.Reserved != 200 {
		t.Fatalf("two holds while in flight: %+v", u)
	}
	up.open()
	done.Wait()
	waitUsage(t, p, "assistant_tokens_per_org", 400, 0, 10*time.Second)
}
