package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docsgate/gateway/internal/redistest"
)

// Public budgets an anonymous visitor holds the key of: what one request can make a tenant
// pay. The attacker's bodies and upstreams are real: a 1 MB body then a reset, an upstream
// that sends headers and no text, an early usage report followed by a long answer.

// burnUpstream answers both assistant protocols by the request's fp:
//   - "hang": reads the body and never answers (until the request is cancelled);
//   - "silent": sends the stream's headers and its start, then no text;
//   - "early": reports a usage of 1 token at once, then burnText bytes of answer text in
//     1,000-byte parts, then the finish with the real usage (1 + burnText/4 tokens).
//
// It notes each request it received by its path (the org's domain is in it).
type burnUpstream struct {
	url string
	mu  sync.Mutex
	got map[string]bool
}

const burnText = 400_000

func newBurnUpstream(t *testing.T) *burnUpstream {
	u := &burnUpstream{got: map[string]bool{}}
	u.url = serveHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			FP string `json:"fp"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			t.Errorf("upstream: %v", err)
		}
		_, _ = io.Copy(io.Discard, r.Body)
		u.mu.Lock()
		u.got[r.URL.Path] = true
		u.mu.Unlock()
		v2 := strings.Contains(r.URL.Path, "/v2/")
		fl := w.(http.Flusher)
		part := func(v1, v2part string) {
			if v2 {
				fmt.Fprintf(w, "data: %s\n\n", v2part)
			} else {
				fmt.Fprintf(w, "%s\n", v1)
			}
		}
		if body.FP == "hang" {
			<-r.Context().Done()
			return
		}
		if v2 {
			w.Header().Set("Content-Type", "text/event-stream")
			w.Header().Set("X-Vercel-AI-UI-Message-Stream", "v1")
		} else {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Header().Set("X-Vercel-AI-Data-Stream", "v1")
		}
		part(`f:{"messageId":"m"}`, `{"type":"start","messageId":"m"}`)
		fl.Flush()
		if body.FP == "silent" {
			<-r.Context().Done()
			return
		}
		// An early report: v1 a finished first step, v2 the message's metadata.
		part(`e:{"finishReason":"tool-calls","usage":{"promptTokens":1,"completionTokens":0},"isContinued":false}`,
			`{"type":"message-metadata","messageMetadata":{"usage":{"inputTokens":1,"outputTokens":0}}}`)
		text := strings.Repeat("x", 1000)
		for range burnText / len(text) {
			part(`0:"`+text+`"`, `{"type":"text-delta","id":"t","delta":"`+text+`"}`)
			fl.Flush()
			if r.Context().Err() != nil {
				return
			}
		}
		part(fmt.Sprintf(`d:{"finishReason":"stop","usage":{"promptTokens":1,"completionTokens":%d}}`, burnText/4),
			fmt.Sprintf(`{"type":"finish","finishReason":"stop","messageMetadata":{"usage":{"inputTokens":1,"outputTokens":%d}}}`, burnText/4))
		if v2 {
			part("", "[DONE]")
		}
	}))
	return u
}

func (u *burnUpstream) received(path string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.got[path]
}

// burnBody is an assistant body of the version's shape with the given message text and a
// filter of filler bytes.
func burnBody(v2 bool, fp, text string, filler int) string {
	msg := `{"id":"1","role":"user","content":"` + text + `"}`
	if v2 {
		msg = `{"id":"1","role":"user","parts":[{"type":"text","text":"` + text + `"}]}`
	}
	return `{"fp":"` + fp + `","messages":[` + msg + `],"filter":{"p":"` + strings.Repeat("x", filler) + `"}}`
}

// orgLimitUsage reads limit name of org from the admin API of p.
func orgLimitUsage(t *testing.T, p *proc, org, name string) orgUsage {
	t.Helper()
	code, body := adminGet(t, p, "/usage/orgs/"+org, "")
	if code == 401 { // a config with admin_token: reads need it too
		code, body = adminGet(t, p, "/usage/orgs/"+org, adminToken)
	}
	if code != 200 {
		t.Fatalf("/usage/orgs/%s: %d %s", org, code, body)
	}
	var out struct {
		Limits []orgUsage `json:"limits"`
	}
	if err := json.Unmarshal([]byte(body), &out); err != nil {
		t.Fatal(err)
	}
	for _, l := range out.Limits {
		if l.Name == name {
			return l
		}
	}
	t.Fatalf("/usage/orgs/%s has no %s: %s", org, name, body)
	return orgUsage{}
}

// settledUsage waits until none of org's limits holds anything any more and their use has
// stayed the same for a moment (the settle and the debit run after the answer), and returns
// each limit's use by name.
func settledUsage(t *testing.T, p *proc, org string) map[string]int64 {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	var last map[string]int64
	since := time.Now()
	for {
		code, body := adminGet(t, p, "/usage/orgs/"+org, "")
		var out struct {
			Limits []orgUsage `json:"limits"`
		}
		if code != 200 || json.Unmarshal([]byte(body), &out) != nil {
			t.Fatalf("/usage/orgs/%s: %d %s", org, code, body)
		}
		used, held := map[string]int64{}, false
		for _, l := range out.Limits {
			used[l.Name] = l.Used
			held = held || l.Reserved != 0
		}
		if held || fmt.Sprint(used) != fmt.Sprint(last) {
			last, since = used, time.Now()
		} else if time.Since(since) > 300*time.Millisecond {
			return used
		}
		if time.Now().After(deadline) {
			t.Fatalf("the limits of %s never settled: %s", org, body)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

const burnConfig = `
limits:
  burn_held: {limit: 10000000, window: month, by: org, unit: tokens, reserve: 100}
  burn_debited: {limit: 10000000, window: month, by: org, unit: tokens}
  burn_small: {limit: 10000000, window: month, by: org, unit: tokens, estimate_max: 10}
routes:
  - name: assistant_message
    limits: [burn_held, burn_debited, burn_small]
  - name: assistant_message_v2
    limits: [burn_held, burn_debited, burn_small]
`

// One request that ends before any answer text passed, gone before the upstream's headers or
// after them, is charged at most its conversation's prompt: never for a filter it filled, at
// most the reserve where the limit holds one, at most estimate_max (default 4,096; 10 on a
// third limit) where not.
// An early usage report never lowers what a cut answer costs. Both protocols, both upstream
// transports, the default estimate_max.
func TestBurnOneRequest(t *testing.T) {
	t.Parallel()
	up := newBurnUpstream(t)
	srv := redistest.Start(t)
	store := fmt.Sprintf("redis: {addrs: [%q], timeout: 2s}\n", srv.Addr)
	const big = 1_000_000 - 400 // under max_body_bytes with the JSON around it
	for _, tr := range []string{"pool", "standard"} {
		t.Run(tr, func(t *testing.T) {
			t.Parallel() // mostly waiting: the two transports' gateways take turns
			p := startGateway(t, up.url, "  transport: "+tr+"\n"+store+burnConfig)
			client := hardClient(30 * time.Second)
			for _, v := range []string{"v1", "v2"} {
				v2 := v == "v2"
				for _, c := range []struct {
					fp            string
					text          string
					filler        int
					held, debited int64 // what each limit is charged
				}{
					// A 1 MB filter and a 5-byte question: 2 tokens of prompt, nothing for the filter.
					{"hang", "hello", big, 2, 2},
					{"silent", "hello", big, 2, 2},
					// A 1 MB question: capped by the reserve (100) or estimate_max (4,096).
					{"hang", strings.Repeat("q", big), 0, 100, 4096},
					{"silent", strings.Repeat("q", big), 0, 100, 4096},
				} {
					org := fmt.Sprintf("%s-%s-%s-%d", tr, v, c.fp, len(c.text))
					path := "/discovery/" + v + "/assistant/" + org + "/message"
					ctx, cancel := context.WithCancel(context.Background())
					req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+p.public+path, strings.NewReader(burnBody(v2, c.fp, c.text, c.filler)))
					req.Header.Set("Authorization", "Bearer svc_dsc_burn")
					req.Header.Set("Content-Type", "application/json")
					got := make(chan int, 1)
					go func() {
						res, err := client.Do(req)
						if err != nil {
							got <- 0
							return
						}
						got <- res.StatusCode
						_, _ = io.Copy(io.Discard, res.Body)
						res.Body.Close()
					}()
					deadline := time.Now().Add(10 * time.Second)
					for !up.received(path) {
						if time.Now().After(deadline) {
							t.Fatalf("%s: the upstream never got the request", org)
						}
						time.Sleep(10 * time.Millisecond)
					}
					if c.fp == "silent" {
						if s := <-got; s != 200 {
							t.Fatalf("%s: status %d", org, s)
						}
					}
					time.Sleep(500 * time.Millisecond)
					cancel() // the client resets
					used := settledUsage(t, p, org)
					if used["burn_held"] != c.held {
						t.Errorf("%s: the limit with a reserve was charged %d, want %d", org, used["burn_held"], c.held)
					}
					if used["burn_debited"] != c.debited {
						t.Errorf("%s: the limit without one was charged %d, want %d", org, used["burn_debited"], c.debited)
					}
					if used["burn_small"] != min(c.debited, 10) {
						t.Errorf("%s: the limit with estimate_max 10 was charged %d, want %d", org, used["burn_small"], min(c.debited, 10))
					}
				}

				// An early report of 1 token, then a long answer the client reads 120 KB of: the
				// charge is the estimate of what passed, never the report; read whole, the
				// answer is charged its final usage.
				for _, whole := range []bool{false, true} {
					org := fmt.Sprintf("%s-%s-early-%v", tr, v, whole)
					req, _ := http.NewRequest("POST", "http://"+p.public+"/discovery/"+v+"/assistant/"+org+"/message", strings.NewReader(burnBody(v2, "early", "hello", 0)))
					req.Header.Set("Authorization", "Bearer svc_dsc_burn")
					req.Header.Set("Content-Type", "application/json")
					res, err := client.Do(req)
					if err != nil || res.StatusCode != 200 {
						t.Fatalf("%s: %v %v", org, res, err)
					}
					var n int64
					if whole {
						n, _ = io.Copy(io.Discard, res.Body)
					} else {
						n, _ = io.CopyN(io.Discard, res.Body, 120_000)
					}
					res.Body.Close()
					all := settledUsage(t, p, org)
					for _, name := range []string{"burn_held", "burn_debited", "burn_small"} {
						used := all[name]
						switch {
						case whole && used != 1+burnText/4:
							t.Errorf("%s %s: the whole answer (%d bytes) was charged %d, want its usage %d", org, name, n, used, 1+burnText/4)
						case !whole && (used < 110_000/4 || used > 2+burnText/4):
							// At least the text the client read (its framing aside), at most
							// all the text the upstream sent.
							t.Errorf("%s %s: a client that read %d bytes was charged %d", org, name, n, used)
						}
					}
				}
			}
		})
	}
}

// visitorAsk sends an assistant request of acme for the visitor at ip (through a trusted
// proxy's X-Forwarded-For) and returns the response unread.
func visitorAsk(t *testing.T, p *proc, ip, fp string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://"+p.public+"/discovery/v1/assistant/acme-docs/message",
		strings.NewReader(`{"fp":"`+fp+`","messages":[{"id":"1","role":"user","content":"hi"}]}`))
	req.Header.Set("Authorization", "Bearer svc_dsc_visitor")
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Forwarded-For", ip)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// A per-visitor tokens budget: a tokens limit by ip, counted across replicas, IPv6 clients by
// their /64 as for requests limits.
func TestTokensPerIPAcrossReplicas(t *testing.T) {
	t.Parallel()
	up := tokenUpstream(t)
	srv := redistest.Start(t)
	cfg := fmt.Sprintf("redis: {addrs: [%q], timeout: 2s}\n", srv.Addr) + `client_ip: {trusted_proxies: ["127.0.0.1"]}
limits:
  tokens_per_ip: {limit: 50, window: hour, by: ip, unit: tokens}
routes:
  - name: assistant_message
    limits: [tokens_per_ip]
`
	// One replica on each upstream transport.
	a, b := startGateway(t, up, "  transport: pool\n"+cfg), startGateway(t, up, "  transport: standard\n"+cfg)
	ask := func(p *proc, ip string) int {
		t.Helper()
		res := visitorAsk(t, p, ip, "u-10-20-1-full")
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode
	}
	ipUsed := func(ip string) int64 {
		t.Helper()
		code, body := adminGet(t, a, "/usage/ips/"+ip, "")
		var out struct {
			Limits []orgUsage `json:"limits"`
		}
		if code != 200 || json.Unmarshal([]byte(body), &out) != nil {
			t.Fatalf("/usage/ips/%s: %d %s", ip, code, body)
		}
		for _, l := range out.Limits {
			if l.Name == "tokens_per_ip" {
				return l.Used
			}
		}
		t.Fatalf("/usage/ips/%s has no tokens_per_ip: %s", ip, body)
		return 0
	}
	waitIP := func(ip string, want int64) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for ipUsed(ip) != want {
			if time.Now().After(deadline) {
				t.Fatalf("%s: used %d, want %d", ip, ipUsed(ip), want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	for _, c := range []struct{ first, second, other string }{
		{"203.0.113.7", "203.0.113.7", "203.0.113.8"},
		{"2001:db8:1:2::1", "2001:db8:1:2::ffff", "2001:db8:1:3::1"},
	} {
		if s := ask(a, c.first); s != 200 {
			t.Fatalf("%s on a: %d", c.first, s)
		}
		waitIP(c.first, 30)
		if s := ask(b, c.second); s != 200 {
			t.Fatalf("%s on b: %d", c.second, s)
		}
		waitIP(c.first, 60)
		// 60 of 50 spent, on whichever replica.
		for _, p := range []*proc{a, b} {
			if s := ask(p, c.second); s != 429 {
				t.Fatalf("%s past its budget: %d, want 429", c.second, s)
			}
		}
		if s := ask(b, c.other); s != 200 {
			t.Fatalf("%s, another visitor: %d", c.other, s)
		}
	}
}

// A per-visitor cap on answers in flight: a streams limit by ip, across replicas, IPv6 clients
// by their /64.
func TestStreamsPerIPAcrossReplicas(t *testing.T) {
	t.Parallel()
	up := newGatedUpstream(t)
	srv := redistest.Start(t)
	cfg := fmt.Sprintf("redis: {addrs: [%q], timeout: 2s}\n", srv.Addr) + `client_ip: {trusted_proxies: ["127.0.0.1"]}
limits:
  streams_per_ip: {limit: 1, by: ip, unit: streams}
routes:
  - name: assistant_message
    limits: [streams_per_ip]
`
	a, b := startGateway(t, up.url, "  transport: pool\n"+cfg), startGateway(t, up.url, "  transport: standard\n"+cfg)
	var open sync.WaitGroup
	ask := func(p *proc, ip string) int {
		t.Helper()
		res := visitorAsk(t, p, ip, "t-1-1")
		open.Add(1)
		go func() { // an admitted answer runs until the gate opens
			defer open.Done()
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
		}()
		return res.StatusCode
	}
	for _, c := range []struct{ first, second, other string }{
		{"203.0.113.7", "203.0.113.7", "203.0.113.8"},
		{"2001:db8:1:2::1", "2001:db8:1:2::ffff", "2001:db8:1:3::1"},
	} {
		if s := ask(a, c.first); s != 200 {
			t.Fatalf("%s on a: %d", c.first, s)
		}
		if s := ask(b, c.second); s != 429 {
			t.Fatalf("%s on b while %s streams on a: %d, want 429", c.second, c.first, s)
		}
		if s := ask(b, c.other); s != 200 {
			t.Fatalf("%s, another visitor: %d", c.other, s)
		}
		up.open()
		open.Wait()
	}
	// Every slot came back: the first visitor streams again.
	deadline := time.Now().Add(5 * time.Second)
	for ask(b, "203.0.113.7") != 200 {
		if time.Now().After(deadline) {
			t.Fatal("the slot never came back")
		}
		time.Sleep(50 * time.Millisecond)
	}
	up.open()
	open.Wait()
}
