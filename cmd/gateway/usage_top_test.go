package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docsgate/gateway/internal/redistest"
)

// tokenUpstream answers assistant requests with an AI SDK data stream whose usage the request
// chooses through its fp: "u-P-C-E-full" sends E finish-step parts of P prompt and C
// completion tokens each, then a finish message with their total; "u-P-C-E-cut" breaks the
// connection after the E parts. Anything else sends no usage at all.
func tokenUpstream(t *testing.T) string {
	return serveHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			FP string `json:"fp"`
		}
		_ = json.NewDecoder(r.Body).Decode(&body)
		if !strings.HasPrefix(r.URL.Path, "/discovery/") {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(201)
			fmt.Fprint(w, `{"id":"j"}`)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fl := w.(http.Flusher)
		fmt.Fprint(w, "f:{\"messageId\":\"m\"}\n0:\"hi\"\n")
		fl.Flush()
		var p, c, e int
		var how string
		if _, err := fmt.Sscanf(strings.ReplaceAll(body.FP, "-", " "), "u %d %d %d %s", &p, &c, &e, &how); err != nil {
			fmt.Fprint(w, "e:{\"finishReason\":\"stop\"}\nd:{\"finishReason\":\"stop\"}\n")
			return
		}
		for range e {
			fmt.Fprintf(w, "e:{\"finishReason\":\"stop\",\"usage\":{\"promptTokens\":%d,\"completionTokens\":%d},\"isContinued\":false}\n", p, c)
			fl.Flush()
		}
		if how == "cut" {
			panic(http.ErrAbortHandler) // the connection breaks without a finish message
		}
		fmt.Fprintf(w, "d:{\"finishReason\":\"stop\",\"usage\":{\"promptTokens\":%d,\"completionTokens\":%d}}\n", p*e, c*e)
	}))
}

type topJSON struct {
	Limit   string `json:"limit"`
	Window  string `json:"window"`
	Unit    string `json:"unit"`
	Tenants []struct {
		ID        string    `json:"id"`
		Label     string    `json:"label"`
		Org       string    `json:"org"`
		Used      int64     `json:"used"`
		Limit     int64     `json:"limit"`
		Remaining int64     `json:"remaining"`
		Fraction  float64   `json:"fraction"`
		Reset     time.Time `json:"reset"`
		Plan      string    `json:"plan"`
	} `json:"tenants"`
}

func getTop(t *testing.T, p *proc, query string) topJSON {
	t.Helper()
	code, body := adminGet(t, p, "/usage/top"+query, "")
	if code != 200 {
		t.Fatalf("/usage/top%s: %d %s", query, code, body)
	}
	var out topJSON
	if err := json.Unmarshal([]byte(body), &out); err != nil {
		t.Fatalf("/usage/top%s: %v: %s", query, err, body)
	}
	return out
}

type wantTenant struct {
	id        string
	used, lim int64
	plan      string
}

func checkTop(t *testing.T, got topJSON, name, window, unit string, want []wantTenant) {
	t.Helper()
	if got.Limit != name || got.Window != window || got.Unit != unit {
		t.Fatalf("top %s: header %q %q %q", name, got.Limit, got.Window, got.Unit)
	}
	if len(got.Tenants) != len(want) {
		t.Fatalf("top %s: %d tenants, want %d: %+v", name, len(got.Tenants), len(want), got.Tenants)
	}
	for i, w := range want {
		g := got.Tenants[i]
		if g.ID != w.id || g.Used != w.used || g.Limit != w.lim || g.Remaining != max(w.lim-w.used, 0) ||
			g.Fraction != float64(w.used)/float64(w.lim) || g.Plan != w.plan {
			t.Fatalf("top %s #%d: %+v, want %+v", name, i, g, w)
		}
		if !g.Reset.After(time.Now()) || g.Reset.Nanosecond() != 0 {
			t.Fatalf("top %s #%d: reset %v", name, i, g.Reset)
		}
	}
}

// Tenants driven to known usages on every store are listed by /usage/top in order with exact
// numbers; streamed answers' tokens are counted from the usage the upstream sent (also when
// the stream breaks off after some e: parts), and a tokens limit denies once spent.
func TestUsageTopAndTokens(t *testing.T) {
	t.Parallel()
	up := tokenUpstream(t)
	const cfg = `
orgs:
  acme: {domains: [acme-docs], plan: gold}
  globex: [globex-docs]
  initech: [initech-docs]
  umbrella: [umbrella-docs]
  hooli: [hooli-docs]
plans:
  gold:
    assistant_per_org: {limit: 40}
limits:
  assistant_per_org: {limit: 10, window: hour}
  assistant_tokens_per_org: {limit: 1000, window: month, by: org, unit: tokens}
routes:
  - name: assistant_message
    limits: [assistant_per_key, assistant_per_org, assistant_per_ip, assistant_tokens_per_org]
`
	for _, st := range everyStore() {
		t.Run(st.name, func(t *testing.T) {
			p := startGateway(t, up, st.start(t)+cfg)
			ask := func(org, key, fp string) *http.Response {
				return send(t, p, "POST", "/discovery/v1/assistant/"+org+"-docs/message", "svc_dsc_"+key, `{"fp":"`+fp+`","messages":[{"id":"1","role":"user","content":"How do I rotate my API key?"}]}`)
			}
			for i := range 9 {
				if res := ask("acme", "acmekey1", "u-10-20-2-full"); res.StatusCode != 200 {
					t.Fatalf("acme %d: %d", i, res.StatusCode)
				}
			}
			for range 8 {
				ask("globex", "globexkey", "plain")
			}
			for range 10 {
				ask("initech", "initechkey", "plain")
			}
			res := ask("initech", "initechkey", "plain")
			if res.StatusCode != 429 {
				t.Fatalf("initech over its limit: %d", res.StatusCode)
			}
			// hooli's stream breaks after two e: parts: their tokens were spent and count.
			ask("hooli", "hoolikey1", "u-6-11-2-cut")

			// acme: 9 answers x 2 steps x (10+20) = 540 tokens; hooli 2 x (6+11) = 34.
			waitTokens := func(org string, want int64) {
				t.Helper()
				deadline := time.Now().Add(5 * time.Second)
				for {
					for _, tn := range getTop(t, p, "?limit=assistant_tokens_per_org&n=1000").Tenants {
						if tn.ID == org && tn.Used == want {
							return
						}
					}
					if time.Now().After(deadline) {
						t.Fatalf("tokens of %s never reached %d: %+v", org, want, getTop(t, p, "?limit=assistant_tokens_per_org"))
					}
					time.Sleep(20 * time.Millisecond)
				}
			}
			waitTokens("acme", 540)
			waitTokens("hooli", 34)

			checkTop(t, getTop(t, p, "?limit=assistant_per_org"), "assistant_per_org", "hour", "requests", []wantTenant{
				{id: "initech", used: 10, lim: 10}, {id: "globex", used: 8, lim: 10},
				{id: "acme", used: 9, lim: 40, plan: "gold"}, {id: "hooli", used: 1, lim: 10},
			})
			checkTop(t, getTop(t, p, "?limit=assistant_per_org&n=2"), "assistant_per_org", "hour", "requests", []wantTenant{
				{id: "initech", used: 10, lim: 10}, {id: "globex", used: 8, lim: 10},
			})
			// globex and initech got answers without usage: each is charged the estimate, 7
			// tokens for its 27 bytes of conversation text and 1 for its 2 bytes of answer.
			waitTokens("initech", 80)
			waitTokens("globex", 64)
			checkTop(t, getTop(t, p, "?limit=assistant_tokens_per_org"), "assistant_tokens_per_org", "month", "tokens", []wantTenant{
				{id: "acme", used: 540, lim: 1000, plan: "gold"}, {id: "initech", used: 80, lim: 1000},
				{id: "globex", used: 64, lim: 1000}, {id: "hooli", used: 34, lim: 1000},
			})
			if ip := getTop(t, p, "?limit=assistant_per_ip"); len(ip.Tenants) != 1 || ip.Tenants[0].ID != "127.0.0.1" || ip.Tenants[0].Used != 28 {
				t.Fatalf("per ip: %+v", ip)
			}

			// Every enabled limit at once, in name order.
			code, body := adminGet(t, p, "/usage/top", "")
			var all struct {
				Limits []topJSON `json:"limits"`
			}
			if code != 200 || json.Unmarshal([]byte(body), &all) != nil {
				t.Fatalf("/usage/top: %d %s", code, body)
			}
			var names []string
			for _, l := range all.Limits {
				names = append(names, l.Limit)
			}
			if strings.Join(names, ",") != "agent_job_per_project,assistant_per_ip,assistant_per_key,assistant_per_org,assistant_tokens_per_org" {
				t.Fatalf("limits listed: %v", names)
			}
			// Keys are listed by digest, never by key.
			if strings.Contains(body, "acmekey1") || !strings.Contains(body, sha256hex("svc_dsc_acmekey1")) {
				t.Fatalf("per-key listing: %s", body)
			}

			// The usage API shows the tokens too.
			code, body = adminGet(t, p, "/usage/orgs/acme", "")
			if code != 200 || !strings.Contains(body, `{"name":"assistant_tokens_per_org","unit":"tokens","limit":1000,"used":540,"reserved":0,"remaining":460,`) {
				t.Fatalf("/usage/orgs/acme: %d %s", code, body)
			}

			// Bad input.
			for q, want := range map[string]int{"?limit=nope": 404, "?n=0": 400, "?n=1001": 400, "?n=abc": 400, "?n=1&n=2": 400, "?limit=": 400} {
				code, body := adminGet(t, p, "/usage/top"+q, "")
				if code != want || !strings.Contains(body, `"code":`) {
					t.Fatalf("/usage/top%s: %d %s, want %d", q, code, body, want)
				}
				if want == 404 && !strings.Contains(body, `"code":"unknown_limit"`) {
					t.Fatalf("unknown limit: %s", body)
				}
			}

			// A tokens limit denies once spent: two answers of 950 tokens run past 1000 (the
			// second is admitted with 50 left, which counts as near the limit).
			// Each answer's tokens are debited just after it ends: the second request is sent
			// once the first's are counted, so that it sees 50 left.
			for i := range 2 {
				if res := ask("umbrella", "umbrellakey", "u-150-800-1-full"); res.StatusCode != 200 {
					t.Fatalf("umbrella: %d", res.StatusCode)
				}
				waitTokens("umbrella", int64(950*(i+1)))
			}
			res = ask("umbrella", "umbrellakey", "u-150-800-1-full")
			if res.StatusCode != 429 {
				t.Fatalf("spent tokens limit: %d", res.StatusCode)
			}
			retry := res.Header.Get("Retry-After")
			if retry == "" || !strings.Contains(res.Header.Get("RateLimit"), `"assistant_tokens_per_org";r=0;t=`+retry) {
				t.Fatalf("429 headers: Retry-After %q RateLimit %q", retry, res.Header.Get("RateLimit"))
			}
			if !strings.Contains(res.Header.Get("RateLimit-Policy"), `"assistant_tokens_per_org";q=1000;w=2592000`) {
				t.Fatalf("policy: %q", res.Header.Get("RateLimit-Policy"))
			}

			// Metrics: the sums the upstream reported, prompt and completion apart.
			m := scrape(t, p)
			for series, want := range map[string]float64{
				`gateway_stream_tokens_total{kind="prompt",org="acme",route="assistant_message"}`:      180,
				`gateway_stream_tokens_total{kind="completion",org="acme",route="assistant_message"}`:  360,
				`gateway_stream_tokens_total{kind="prompt",org="hooli",route="assistant_message"}`:     12,
				`gateway_stream_tokens_total{kind="completion",org="hooli",route="assistant_message"}`: 22,
				`gateway_stream_tokens_total{kind="prompt",org="umbrella",route="assistant_message"}`:  300,
			} {
				if m[series] != want {
					t.Errorf("%s = %v, want %v", series, m[series], want)
				}
			}
			// The second umbrella request (950 of 1000 spent) and the denied third one.
			if got := m[`gateway_ratelimit_tokens_near_limit_total{limit="assistant_tokens_per_org",route="assistant_message"}`]; got != 2 {
				t.Errorf("near-limit count of the tokens limit: %v, want 2", got)
			}
		})
	}
}

func quoteAll(ss []string) string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = fmt.Sprintf("%q", s)
	}
	return strings.Join(q, ", ")
}

// The request path sends nothing new to Redis: MONITOR sees exactly one script call per
// limited request and no other command, while /usage/top's reads happen only when asked.
func TestUsageTopCostsNothingOnRequestPath(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	// redis.timeout 2s: exact counts are checked, not the timeout (exactTimeout).
	p := startGateway(t, tokenUpstream(t), fmt.Sprintf("redis: {addrs: [%q], timeout: 2s}\norgs: {acme: [acme-docs]}\n", srv.Addr))
	// Warm up (script preload, connections) before watching.
	send(t, p, "POST", "/v2/agent/warm/job", "svc_a", `{"prompt":"x"}`)

	lines, stop := watchMonitor(t, srv.Addr)

	const n = 20
	sendMixed(t, p, n)
	stop()
	scripts, other := splitMonitor(lines)
	if len(scripts) != 2*n || len(other) != 0 {
		t.Fatalf("MONITOR saw %d script calls (want %d) and other commands: %v", len(scripts), 2*n, other)
	}
}

// sendMixed sends n agent jobs (each to a project of its own) and n assistant answers with
// usage, then waits for their commands to reach MONITOR.
func sendMixed(t *testing.T, p *proc, n int) {
	t.Helper()
	for i := range n {
		send(t, p, "POST", fmt.Sprintf("/v2/agent/p%d/job", i), "svc_a", `{"prompt":"x"}`)
		send(t, p, "POST", "/discovery/v1/assistant/acme-docs/message", "svc_dsc_k", `{"fp":"u-1-2-1-full","messages":[]}`)
	}
	time.Sleep(300 * time.Millisecond)
}

// watchMonitor runs MONITOR on Redis at addr from now on: lines receives what Redis runs, and
// stop ends the watch and closes lines.
func watchMonitor(t *testing.T, addr string) (lines chan string, stop func()) {
	ctx, cancel := context.WithCancel(t.Context())
	lines = make(chan string, 10000)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		monitorLines(ctx, t, addr, lines)
	}()
	time.Sleep(200 * time.Millisecond) // MONITOR is on
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			wg.Wait()
			close(lines)
		})
	}
	t.Cleanup(stop)
	return lines, stop
}

// What a MONITOR line is.
const (
	monitorScript = iota // a script call (EVALSHA) from a client
	monitorInner         // what a script itself runs
	monitorPoll          // the store's timed read of which limits have run-time quotas
	monitorDial          // a new connection's handshake (HELLO, CLIENT SETINFO, AUTH, SELECT)
	monitorOther         // any other command
)

// monitorKind tells a MONITOR line's kind. The quota flags' read (limits/quota_redis.go) runs
// every 250 ms on a timer, whatever the traffic, never on a request's path. A handshake is a
// connection's, not a request's: go-redis's pool may dial one more in a burst even after a
// warm-up (seen on a busy machine).
func monitorKind(l string) int {
	lower := strings.ToLower(l)
	switch {
	case strings.Contains(l, "[0 lua]"):
		return monitorInner
	case strings.Contains(lower, `"zrangebyscore" "gw:{quota}:limits"`):
		return monitorPoll
	case strings.Contains(lower, `] "hello"`), strings.Contains(lower, `] "client" "setinfo"`),
		strings.Contains(lower, `] "client" "setname"`), strings.Contains(lower, `] "auth"`), strings.Contains(lower, `] "select"`):
		return monitorDial
	case strings.Contains(lower, `"evalsha"`):
		return monitorScript
	}
	return monitorOther
}

// splitMonitor reads lines to their end: the script calls, and the commands other than the
// scripts' own and the store's timed poll.
func splitMonitor(lines <-chan string) (scripts, other []string) {
	for l := range lines {
		switch monitorKind(l) {
		case monitorScript:
			scripts = append(scripts, l)
		case monitorOther:
			other = append(other, l)
		}
	}
	return scripts, other
}

// monitorLines runs MONITOR on its own connection and sends each line until ctx ends.
func monitorLines(ctx context.Context, t *testing.T, addr string, out chan<- string) {
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		t.Error(err)
		return
	}
	defer conn.Close()
	go func() { <-ctx.Done(); conn.Close() }()
	if _, err := io.WriteString(conn, "MONITOR\r\n"); err != nil {
		t.Error(err)
		return
	}
	r := bufio.NewReader(conn)
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		line = strings.TrimSpace(line)
		if line == "+OK" {
			continue
		}
		out <- line
	}
}
