package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"

	"github.com/docsgate/gateway/internal/browsertest"
	"github.com/docsgate/gateway/internal/codingtest"
	"github.com/docsgate/gateway/internal/redistest"
)

// cutUpstream speaks v1 or v2 by the path's version and answers with the text parts its
// request's fp names, "p-N-B-D": N parts of B ASCII bytes (B/4 tokens by estimate) D ms
// apart ("p-N-B-D-split": each part in two writes 1 ms apart, so that the gateway reads it
// in two), then the finish with the usage that matches the estimate (the prompt's bytes / 4,
// rounded up, and the text's). It counts the answers it finished and those whose client (the
// gateway) went away before the end.
type cutUpstream struct {
	url                 string
	finished, cancelled atomic.Int64
}

func newCutUpstream(t *testing.T) *cutUpstream {
	return newCutUpstreamWrapped(t, func(h http.Handler) http.Handler { return h })
}

// newCutUpstreamWrapped is newCutUpstream served through wrap.
func newCutUpstreamWrapped(t *testing.T, wrap func(http.Handler) http.Handler) *cutUpstream {
	u := &cutUpstream{}
	u.url = serveHTTP(t, wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			FP string `json:"fp"`
		}
		_ = json.NewDecoder(r.Body).Decode(&body)
		var n, b, d int
		split := strings.HasSuffix(body.FP, "-split")
		if _, err := fmt.Sscanf(strings.ReplaceAll(strings.TrimSuffix(body.FP, "-split"), "-", " "), "p %d %d %d", &n, &b, &d); err != nil {
			t.Errorf("bad fp %q", body.FP)
			return
		}
		f := frames{v2: strings.HasPrefix(r.URL.Path, "/discovery/v2/")}
		if f.v2 {
			w.Header().Set("Content-Type", "text/event-stream")
			w.Header().Set("X-Vercel-AI-UI-Message-Stream", "v1")
		} else {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			w.Header().Set("X-Vercel-AI-Data-Stream", "v1")
		}
		fl := w.(http.Flusher)
		send := func(s string) bool {
			if _, err := io.WriteString(w, s); err != nil {
				return false
			}
			fl.Flush()
			return r.Context().Err() == nil
		}
		for _, h := range f.head() {
			send(h)
		}
		text := strings.Repeat("a", b)
		for range n {
			part := f.text(text)
			if split {
				if !send(part[:len(part)/2]) {
					u.cancelled.Add(1)
					return
				}
				time.Sleep(time.Millisecond)
				part = part[len(part)/2:]
			}
			if !send(part) {
				u.cancelled.Add(1)
				return
			}
			if d > 0 {
				select {
				case <-time.After(time.Duration(d) * time.Millisecond):
				case <-r.Context().Done():
					u.cancelled.Add(1)
					return
				}
			}
		}
		prompt, completion := ceil4(len(scenarioQuestion)), ceil4(n*b)
		if f.v2 {
			send(f.event(`{"type":"text-end","id":"t1"}`) + f.event(`{"type":"finish-step"}`) +
				f.event(fmt.Sprintf(`{"type":"finish","finishReason":"stop","messageMetadata":{"usage":{"inputTokens":%d,"outputTokens":%d}}}`, prompt, completion)) +
				"data: [DONE]\n\n")
		} else {
			send(fmt.Sprintf(`e:{"finishReason":"stop","usage":{"promptTokens":%d,"completionTokens":%d},"isContinued":false}`+"\n", prompt, completion) +
				fmt.Sprintf(`d:{"finishReason":"stop","usage":{"promptTokens":%d,"completionTokens":%d}}`+"\n", prompt, completion))
		}
		u.finished.Add(1)
	})))
	return u
}

// waitCancelled waits until the upstream saw want answers go away before their end.
func (u *cutUpstream) waitCancelled(t *testing.T, want int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for u.cancelled.Load() < want {
		if time.Now().After(deadline) {
			t.Fatalf("the upstream saw %d answers cancelled, want %d (finished %d)", u.cancelled.Load(), want, u.finished.Load())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

const cutoffConfig = `admin_token: ` + adminToken + `
orgs: {acme: [acme-docs]}
limits:
  assistant_tokens_per_org: {limit: %d, window: month, by: org, unit: tokens, reserve: 100%s}
routes:
  - name: assistant_message
    limits: [assistant_tokens_per_org]
  - name: assistant_message_v2
    limits: [assistant_tokens_per_org]
`

// cutAnswer is what a raw client read of one streamed answer: its parts (lines on v1,
// events on v2), and how the body ended.
type cutAnswer struct {
	status int
	parts  []string
	err    error // the body's end: nil for a clean end of stream
	// encoding is the answer's Content-Encoding.
	encoding string
}

// texts counts the answer's text parts.
func (a cutAnswer) texts() int {
	n := 0
	for _, p := range a.parts {
		if strings.HasPrefix(p, "0:") || strings.Contains(p, `"type":"text-delta"`) {
			n++
		}
	}
	return n
}

// askCut sends one answer's request to p on v1 or v2 and reads it to its end.
func askCut(t *testing.T, p *proc, v2 bool, key, fp string) cutAnswer {
	t.Helper()
	return askCutAt(t, p, v2, "acme-docs", key, fp, nil)
}

// askCutAt is askCut for domain, with header added to the request. An answer in x-xor (the
// coding of the coded-answer tests the gateway cannot read) is read undone of it.
func askCutAt(t *testing.T, p *proc, v2 bool, domain, key, fp string, header http.Header) cutAnswer {
	t.Helper()
	version := "v1"
	if v2 {
		version = "v2"
	}
	req, _ := http.NewRequest("POST", "http://"+p.public+"/discovery/"+version+"/assistant/"+domain+"/message", strings.NewReader(scenarioBody(fp)))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header[k] = v
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return cutAnswer{err: err}
	}
	defer res.Body.Close()
	a := cutAnswer{status: res.StatusCode, encoding: res.Header.Get("Content-Encoding")}
	var body io.Reader = res.Body
	if a.encoding == "x-xor" {
		body = codingtest.XorReader(body)
	}
	br := bufio.NewReader(body)
	for {
		part, err := readPart(br, v2)
		if part != "" {
			a.parts = append(a.parts, part)
		}
		if err != nil {
			if err != io.EOF {
				a.err = err
			}
			return a
		}
	}
}

// The cut answer ends as a valid stream of its protocol: the text that passed, then the
// error and the finish parts, then a clean end; the upstream request is cancelled, the tenant
// is charged what passed (at most one part past the limit), the cutoff is counted and logged,
// and the next answer is refused. Without cutoff the same answer runs to its end.
func TestCutoffEndsAnswer(t *testing.T) {
	t.Parallel()
	for _, st := range holdStores() {
		t.Run(st.name, func(t *testing.T) {
			up := newCutUpstream(t)
			ps := startReplicas(t, up.url, st, fmt.Sprintf(cutoffConfig, 1000, ", cutoff: true"))
			m := scrape(t, ps[0])
			for _, route := range []string{"assistant_message", "assistant_message_v2"} {
				if v, ok := m[`gateway_stream_cutoffs_total{limit="assistant_tokens_per_org",route="`+route+`"}`]; !ok || v != 0 {
					t.Fatalf("the cutoff series of %s must exist at 0: %v %v", route, v, ok)
				}
			}
			// 6 prompt tokens, then 10 per part: the 100th part would take the answer to 1,006,
			// past the limit; it comes whole in its read, so it is dropped and the answer ends
			// after the 99th, at 996.
			prompt := int64(ceil4(len(scenarioQuestion)))
			for i, v2 := range []bool{false, true} {
				if i == 1 { // a new budget for the second protocol
					resetAcme(t, ps[0])
					waitUsage(t, ps[0], "assistant_tokens_per_org", 0, 0, 10*time.Second)
				}
				a := askCut(t, ps[len(ps)-1], v2, "svc_dsc_cut", "p-200-40-1")
				if a.status != 200 || a.err != nil {
					t.Fatalf("v2=%v: status %d, end %v", v2, a.status, a.err)
				}
				if n := a.texts(); n != 99 {
					t.Fatalf("v2=%v: %d text parts passed, want 99", v2, n)
				}
				tail := strings.Join(a.parts[len(a.parts)-3:], "")
				var want string
				if v2 {
					want = "data: {\"type\":\"error\",\"errorText\":\"The answer was cut off: the token budget ran out.\"}\n\n" +
						"data: {\"type\":\"finish\",\"finishReason\":\"error\",\"messageMetadata\":{\"gateway\":{\"cutoff\":\"assistant_tokens_per_org\"}}}\n\n" +
						"data: [DONE]\n\n"
				} else {
					want = "3:\"The answer was cut off: the token budget ran out.\"\n" +
						fmt.Sprintf("e:{\"finishReason\":\"error\",\"usage\":{\"promptTokens\":%d,\"completionTokens\":990},\"isContinued\":false}\n", prompt) +
						fmt.Sprintf("d:{\"finishReason\":\"error\",\"usage\":{\"promptTokens\":%d,\"completionTokens\":990}}\n", prompt)
				}
				if tail != want {
					t.Fatalf("v2=%v: the answer ends with\n%q\nwant\n%q", v2, tail, want)
				}
				up.waitCancelled(t, int64(i+1))
				u := waitUsage(t, ps[0], "assistant_tokens_per_org", 990+prompt, 0, 10*time.Second)
				t.Logf("%s v2=%v: charged %d of %d", st.name, v2, u.Used, u.Limit)
				if a := askCut(t, ps[0], v2, "svc_dsc_cut", "p-10-40-0"); a.status != 429 {
					t.Fatalf("v2=%v: a spent budget admitted: %d", v2, a.status)
				}
			}
			var cuts float64
			for _, p := range ps {
				m := scrape(t, p)
				cuts += m[`gateway_stream_cutoffs_total{limit="assistant_tokens_per_org",route="assistant_message"}`] +
					m[`gateway_stream_cutoffs_total{limit="assistant_tokens_per_org",route="assistant_message_v2"}`]
			}
			if cuts != 2 {
				t.Fatalf("gateway_stream_cutoffs_total: %v, want 2", cuts)
			}
			logs := ps[len(ps)-1].out.String()
			if n := strings.Count(logs, `"cutoff":"assistant_tokens_per_org"`); n != 2 {
				t.Fatalf("%d access-log lines name the cutoff, want 2:\n%s", n, grepLines(logs, `"cutoff"`))
			}
			if !strings.Contains(grepLines(logs, `"cutoff"`), `"finish_reason":"error"`) {
				t.Fatalf("a cut answer's finish is error:\n%s", grepLines(logs, `"cutoff"`))
			}
		})
	}
}

// Without cutoff nothing changes: the answer that would have been cut runs to its end and
// is charged whole, past the limit.
func TestCutoffOffRunsToTheEnd(t *testing.T) {
	t.Parallel()
	up := newCutUpstream(t)
	p := startGateway(t, up.url, fmt.Sprintf(cutoffConfig, 1000, ""))
	if _, ok := scrape(t, p)[`gateway_stream_cutoffs_total{limit="assistant_tokens_per_org",route="assistant_message"}`]; ok {
		t.Fatal("a limit without cutoff has no cutoff series")
	}
	for _, v2 := range []bool{false, true} {
		a := askCut(t, p, v2, "svc_dsc_cut", "p-200-40-0")
		if a.status != 200 || a.err != nil || a.texts() != 200 || strings.Contains(strings.Join(a.parts, ""), "cut off") {
			t.Fatalf("v2=%v: status %d, %d text parts, end %v", v2, a.status, a.texts(), a.err)
		}
		waitUsage(t, p, "assistant_tokens_per_org", 2006, 0, 10*time.Second)
		resetAcme(t, p)
		waitUsage(t, p, "assistant_tokens_per_org", 0, 0, 10*time.Second)
	}
	if up.cancelled.Load() != 0 {
		t.Fatalf("%d answers cancelled", up.cancelled.Load())
	}
}

// 40 concurrent answers over two replicas (one on the in-process store) against 10,000
// tokens with a reserve of 100 and cutoff: every answer wants 1,006 tokens, 40,240 in all.
// Each answer is cut once its hold cannot grow past its running count, so the tenant's use
// ends at most one part (10 tokens) per answer in flight past the limit: none past it when
// each part comes whole in a read (the part that would cross is dropped), and with parts
// split over two reads (the crossing part is half out already) at most one part each.
func TestCutoffOvershootUnderConcurrency(t *testing.T) {
	t.Parallel()
	const limit, answers, part = 10000, 40, 10
	for _, st := range holdStores() {
		for _, split := range []string{"", "-split"} {
			t.Run(st.name+split, func(t *testing.T) {
				up := newCutUpstream(t)
				ps := startReplicas(t, up.url, st, fmt.Sprintf(cutoffConfig, limit, ", cutoff: true"))
				var wg sync.WaitGroup
				res := make([]cutAnswer, answers)
				for i := range answers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						res[i] = askCut(t, ps[i%len(ps)], i%2 == 1, fmt.Sprintf("svc_dsc_key%d", i), "p-100-40-2"+split)
					}()
				}
				wg.Wait()
				var whole, cut, refused int
				for i, a := range res {
					switch {
					case a.status == 429:
						refused++
					case a.status != 200 || a.err != nil:
						t.Fatalf("answer %d: status %d, end %v", i, a.status, a.err)
					case strings.Contains(strings.Join(a.parts, ""), "cut off"):
						cut++
					case a.texts() == 100:
						whole++
					default:
						t.Fatalf("answer %d: %d text parts and no cutoff", i, a.texts())
					}
				}
				u := waitUsageSettled(t, ps[0], "assistant_tokens_per_org", 10*time.Second)
				over := u.Used - limit
				t.Logf("%s%s: %d replicas, %d answers: %d whole, %d cut, %d refused; used %d of %d: overshoot %d tokens (bound: %d in flight × %d)",
					st.name, split, len(ps), answers, whole, cut, refused, u.Used, limit, over, whole+cut, part)
				if over > int64((whole+cut)*part) {
					t.Fatalf("overshoot %d is more than one part per answer in flight (%d × %d)", over, whole+cut, part)
				}
				if cut == 0 || u.Used < limit-100 {
					t.Fatalf("the budget was not spent: %d cut, %d used", cut, u.Used)
				}
				up.waitCancelled(t, int64(cut))
			})
		}
	}
}

// waitUsageSettled polls until no tokens of limit name of acme are held (every answer
// settled) and returns the reading.
func waitUsageSettled(t *testing.T, p *proc, name string, within time.Duration) orgUsage {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		u := acmeUsage(t, p, name)
		if u.Reserved == 0 {
			return u
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still %d reserved", name, u.Reserved)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// resetAcme resets acme's tokens limit through the admin API.
func resetAcme(t *testing.T, p *proc) {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://"+p.admin+"/quota/resets", strings.NewReader(`{"limit":"assistant_tokens_per_org","id":"acme","reason":"next protocol"}`))
	req.Header.Set("Authorization", "Bearer "+adminToken)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("reset: %d %s", res.StatusCode, body)
	}
}

// The real AI SDK clients read a cut answer as the end of the answer with an error they can
// show, not as a network failure: ai 4 on v1 (callChatApi, what useChat runs: the error part
// ends it with an Error of the gateway's message), ai 5 and ai 7 on v2 (the SDK's own chat,
// AbstractChat: status error, the gateway's message, isError and not isDisconnect), each
// with the text that passed.
func TestCutoffAISDKClients(t *testing.T) {
	t.Parallel()
	dir := aisdkClients(t)
	up := newCutUpstream(t)
	p := startGateway(t, up.url, `orgs: {ai4: [ai4-docs], ai5: [ai5-docs], ai7: [ai7-docs]}
limits:
  assistant_tokens_per_org: {limit: 300, window: month, by: org, unit: tokens, reserve: 50, cutoff: true}
routes:
  - name: assistant_message
    limits: [assistant_tokens_per_org]
  - name: assistant_message_v2
    limits: [assistant_tokens_per_org]
`)
	for _, pkg := range []string{"ai4", "ai5", "ai7"} {
		t.Run(pkg, func(t *testing.T) {
			version := "v2"
			if pkg == "ai4" {
				version = "v1"
			}
			api := "http://" + p.public + "/discovery/" + version + "/assistant/" + pkg + "-docs/message"
			got := runNode(t, dir, "cutoff-chat.mjs", pkg, api, "svc_dsc_"+pkg+"client", "p-100-40-1", "How do I rotate an API key?")[0]
			e, _ := got["error"].(map[string]any)
			text, _ := got["text"].(string)
			t.Logf("%s: shows error %v after %d bytes of text (chat status %v, isError %v, isDisconnect %v)",
				pkg, e, len(text), got["chatStatus"], got["isError"], got["isDisconnect"])
			if got["status"] != float64(200) || e == nil || e["message"] != "The answer was cut off: the token budget ran out." || e["network"] != false {
				t.Fatalf("%s must show the gateway's error, not a network failure: %v", pkg, got)
			}
			if len(text) == 0 || len(text) >= 100*40 || len(text)%40 != 0 || strings.Trim(text, "a") != "" {
				t.Fatalf("%s: the text that passed, whole parts of it: %d bytes", pkg, len(text))
			}
			if pkg != "ai4" && (got["chatStatus"] != "error" || got["isError"] != true || got["isDisconnect"] != false || got["isAbort"] != false) {
				t.Fatalf("%s: the chat must end in error, not a disconnect: %v", pkg, got)
			}
		})
	}
	up.waitCancelled(t, 3)
}

// Real Chromium on another origin reads a cut v2 answer to its end: the browser's stream
// reader ends cleanly (no network error) after the error and finish events and [DONE].
func TestCutoffBrowserCrossOrigin(t *testing.T) {
	t.Parallel()
	up := newCutUpstream(t)
	browserCut(t, up, fmt.Sprintf(cutoffConfig, 300, ", cutoff: true"), "acme-docs", "p-100-40-1")
	up.waitCancelled(t, 1)
}

// browserCut opens, in real Chromium, a page on another origin that posts a v2 request of fp
// for domain to a gateway started on up with cfg (and CORS for the page), and checks that the
// page read the answer, cut at its budget, to a clean end (no network error) after the error
// and finish events and [DONE]. It returns the gateway.
func browserCut(t *testing.T, up *cutUpstream, cfg, domain, fp string) *proc {
	t.Helper()
	browser := browsertest.Start(t)
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Fatal(err)
	}
	origin := "http://" + ln.Addr().String()
	p := startGateway(t, up.url, fmt.Sprintf("cors: {allowed_origins: [%q]}\n", origin)+cfg)
	raw := runStreamPage(t, browser, ln, streamPage("http://"+p.public+"/discovery/v2/assistant/"+domain+"/message", fp, nil, false), nil)
	var got struct {
		Status int
		Error  string
		Events []string
		Rest   string
	}
	if err := json.Unmarshal([]byte(raw), &got); err != nil {
		t.Fatalf("%v: %s", err, raw)
	}
	if got.Error != "" || got.Status != 200 || got.Rest != "" || len(got.Events) < 4 {
		t.Fatalf("the page's read of a cut answer: status %d, error %q, %d events, rest %q", got.Status, got.Error, len(got.Events), got.Rest)
	}
	end := strings.Join(got.Events[len(got.Events)-3:], "")
	if !strings.HasPrefix(end, `data: {"type":"error","errorText":"The answer was cut off`) ||
		!strings.Contains(end, `"messageMetadata":{"gateway":{"cutoff":"assistant_tokens_per_org"}}`) || !strings.HasSuffix(end, "data: [DONE]\n\n") {
		t.Fatalf("the page read the end %q", end)
	}
	return p
}

// The request's span names the limit that cut its answer.
func TestCutoffSpan(t *testing.T) {
	t.Parallel()
	rcv := startOTLPHTTP(t)
	up := newCutUpstream(t)
	p := startGateway(t, up.url, fmt.Sprintf("tracing: {enabled: true, protocol: http/protobuf, endpoint: %q, insecure: true, sample_ratio: 1}\n", "http://"+rcv.addr)+
		fmt.Sprintf(cutoffConfig, 300, ", cutoff: true"))
	if a := askCut(t, p, true, "svc_dsc_cut", "p-100-40-1"); a.status != 200 || !strings.Contains(strings.Join(a.parts, ""), "cut off") {
		t.Fatalf("status %d, parts %q", a.status, a.parts)
	}
	span := rcv.waitSpan(t, "the cut answer's server span", func(s *tracepb.Span) bool {
		return s.Kind == tracepb.Span_SPAN_KIND_SERVER && attrString(s, "gateway.route") == "assistant_message_v2"
	})
	if got := attrString(span, "gateway.cutoff"); got != "assistant_tokens_per_org" {
		t.Fatalf("gateway.cutoff = %q", got)
	}
	if got := attrString(span, "gateway.ratelimit.decision"); got != "allowed" {
		t.Fatalf("the admission stays allowed: %q", got)
	}
}

// An answer with cutoff asks the store once per reserve of tokens it runs past its admission,
// never per part: 100 parts of 10 tokens (1,006 tokens with the prompt) against a reserve of
// 100 are 1 admission, 9 growths and 1 settle: 11 script calls (INFO commandstats).
func TestCutoffScriptCallsPerReserve(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	up := newCutUpstream(t)
	p := startGateway(t, up.url, fmt.Sprintf("redis: {addrs: [%q], timeout: 2s}\n", srv.Addr)+fmt.Sprintf(cutoffConfig, 100000, ", cutoff: true"))
	client := srv.Client(t)
	before := redistest.ScriptCalls(t, client)
	a := askCut(t, p, false, "svc_dsc_cut", "p-100-40-0")
	if a.status != 200 || a.texts() != 100 || strings.Contains(strings.Join(a.parts, ""), "cut off") {
		t.Fatalf("status %d, %d text parts", a.status, a.texts())
	}
	// The settle follows the answer off its path: wait until the count holds still.
	calls := redistest.ScriptCalls(t, client) - before
	for still := time.Now(); time.Since(still) < 300*time.Millisecond; time.Sleep(20 * time.Millisecond) {
		if n := redistest.ScriptCalls(t, client) - before; n != calls {
			calls, still = n, time.Now()
		}
	}
	t.Logf("script calls for one answer of 100 parts and 1,006 tokens, reserve 100: %d", calls)
	if calls != 11 {
		t.Fatalf("%d script calls, want 11: 1 admission, 9 growths, 1 settle", calls)
	}
	waitUsage(t, p, "assistant_tokens_per_org", 1006, 0, 10*time.Second)
}

// Usage the stream reports as it goes counts as it arrives: finish-step parts of 100
// completion tokens each against 1,000 tokens are cut at the one that would pass the limit,
// which is dropped (it came whole), and the answer is charged the 1,000 reported before it.
func TestCutoffOnReportedUsage(t *testing.T) {
	t.Parallel()
	p := startGateway(t, tokenUpstream(t), fmt.Sprintf(cutoffConfig, 1000, ", cutoff: true"))
	a := askCut(t, p, false, "svc_dsc_cut", "u-0-100-20-full")
	steps := 0
	for _, part := range a.parts {
		if strings.HasPrefix(part, `e:{"finishReason":"stop"`) {
			steps++
		}
	}
	if a.status != 200 || a.err != nil || steps != 10 || !strings.HasPrefix(a.parts[len(a.parts)-3], `3:"The answer was cut off`) {
		t.Fatalf("status %d, end %v, %d steps passed, parts %q", a.status, a.err, steps, a.parts)
	}
	if got := a.parts[len(a.parts)-1]; got != `d:{"finishReason":"error","usage":{"promptTokens":0,"completionTokens":1000}}`+"\n" {
		t.Fatalf("the finish says %q", got)
	}
	waitUsage(t, p, "assistant_tokens_per_org", 1000, 0, 10*time.Second)
}
