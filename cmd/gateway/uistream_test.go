package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// Issue 22: streamed answers on v1 (the data stream of AI SDK 4) and v2 (the UI message stream
// of AI SDK 5+) against the binary: the bytes, their timing, the finish reasons, the tokens
// (reported, or estimated when no usage passed), the tokens limit and /usage/top.

// The answer text of every scenario: multi-byte characters and escapes, so the estimate's
// UTF-8 length is tested too (7 + 13 + 10 bytes).
var scenarioTexts = []string{"Héllo, ", "wörld 🚀 ", "\"quoted\"\n"}

// Reported usage of the scenarios that report it.
const scenarioPrompt, scenarioCompletion = 52, 61

// scenarioUpstream speaks v1 or v2 by the path's version, and plays the scenario its
// request's fp names:
//   - full: the whole answer with usage, each part only after the test client has acked the
//     one before (lockstep: a gateway that held a part back would stall it);
//   - cut-after-usage: text, the usage (v1 e:, v2 message-metadata), more text, then the
//     connection breaks;
//   - cut-before-usage: text, then the connection breaks;
//   - error: text, an error part (v1 3:, v2 error), then a clean end without a finish;
//   - disconnect: text, then nothing until the request is cancelled (recorded).
type scenarioUpstream struct {
	url      string
	ack      chan struct{}
	mu       sync.Mutex
	sent     map[string][]byte // "<fp>/<version>" -> the bytes written
	canceled map[string]time.Time
}

func newScenarioUpstream(t *testing.T) *scenarioUpstream {
	u := &scenarioUpstream{ack: make(chan struct{}), sent: map[string][]byte{}, canceled: map[string]time.Time{}}
	u.url = serveHTTP(t, http.HandlerFunc(u.serve))
	return u
}

func (u *scenarioUpstream) serve(w http.ResponseWriter, r *http.Request) {
	var body struct {
		FP string `json:"fp"`
	}
	_ = json.NewDecoder(r.Body).Decode(&body)
	v2 := strings.HasPrefix(r.URL.Path, "/discovery/v2/")
	if v2 {
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set("X-Vercel-AI-UI-Message-Stream", "v1")
		w.Header().Set("Cache-Control", "no-cache")
	} else {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("X-Vercel-AI-Data-Stream", "v1")
	}
	fl := w.(http.Flusher)
	scenario := body.FP
	key := scenario + "/" + r.URL.Path[len("/discovery/"):][:2]
	write := func(s string) {
		_, _ = io.WriteString(w, s)
		fl.Flush()
		u.mu.Lock()
		u.sent[key] = append(u.sent[key], s...)
		u.mu.Unlock()
		if scenario == "full" {
			select { // lockstep: the next part only once the client has this one
			case <-u.ack:
			case <-time.After(10 * time.Second):
				u.mu.Lock()
				u.sent[key] = append(u.sent[key], "[never acked]"...)
				u.mu.Unlock()
			}
		}
	}
	f := frames{v2: v2}
	for _, s := range f.head() {
		write(s)
	}
	switch scenario {
	case "full":
		for _, x := range scenarioTexts {
			write(f.text(x))
		}
		for _, s := range f.finish() {
			write(s)
		}
	case "cut-after-usage":
		write(f.text(scenarioTexts[0]))
		write(f.usage())
		write(f.text(scenarioTexts[1]))
		panic(http.ErrAbortHandler)
	case "cut-before-usage":
		write(f.text(scenarioTexts[0]))
		write(f.text(scenarioTexts[1]))
		panic(http.ErrAbortHandler)
	case "error":
		write(f.text(scenarioTexts[0]))
		write(f.error())
	case "disconnect":
		write(f.text(scenarioTexts[0]))
		select {
		case <-r.Context().Done():
			u.mu.Lock()
			u.canceled[key] = time.Now()
			u.mu.Unlock()
		case <-time.After(10 * time.Second):
		}
	}
}

func (u *scenarioUpstream) bytesSent(key string) []byte {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]byte(nil), u.sent[key]...)
}

func (u *scenarioUpstream) canceledAt(key string) (time.Time, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	at, ok := u.canceled[key]
	return at, ok
}

// frames renders the parts of one protocol.
type frames struct{ v2 bool }

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

func (f frames) event(chunk string) string { return "data: " + chunk + "\n\n" }

func (f frames) head() []string {
	if f.v2 {
		return []string{f.event(`{"type":"start","messageId":"msg-1"}`), f.event(`{"type":"start-step"}`), f.event(`{"type":"text-start","id":"t1"}`)}
	}
	return []string{`f:{"messageId":"msg-1"}` + "\n"}
}

func (f frames) text(s string) string {
	if f.v2 {
		return f.event(`{"type":"text-delta","id":"t1","delta":` + jsonString(s) + `}`)
	}
	return "0:" + jsonString(s) + "\n"
}

func (f frames) usage() string {
	if f.v2 {
		return f.event(fmt.Sprintf(`{"type":"message-metadata","messageMetadata":{"usage":{"inputTokens":%d,"outputTokens":%d,"totalTokens":%d}}}`,
			scenarioPrompt, scenarioCompletion, scenarioPrompt+scenarioCompletion))
	}
	return fmt.Sprintf(`e:{"finishReason":"stop","usage":{"promptTokens":%d,"completionTokens":%d},"isContinued":false}`+"\n", scenarioPrompt, scenarioCompletion)
}

func (f frames) finish() []string {
	if f.v2 {
		return []string{f.event(`{"type":"text-end","id":"t1"}`), f.event(`{"type":"finish-step"}`),
			f.event(fmt.Sprintf(`{"type":"finish","finishReason":"stop","messageMetadata":{"threadId":"thread_1","usage":{"inputTokens":%d,"outputTokens":%d,"totalTokens":%d}}}`,
				scenarioPrompt, scenarioCompletion, scenarioPrompt+scenarioCompletion)), "data: [DONE]\n\n"}
	}
	return []string{f.usage(), fmt.Sprintf(`d:{"finishReason":"stop","usage":{"promptTokens":%d,"completionTokens":%d},"threadId":"thread_1"}`+"\n", scenarioPrompt, scenarioCompletion)}
}

func (f frames) error() string {
	if f.v2 {
		return f.event(`{"type":"error","errorText":"The assistant is unavailable."}`)
	}
	return `3:"The assistant is unavailable."` + "\n"
}

// readPart reads one part: a line on v1, an event (up to its blank line) on v2.
func readPart(br *bufio.Reader, v2 bool) (string, error) {
	s, err := br.ReadString('\n')
	if err != nil || !v2 {
		return s, err
	}
	blank, err := br.ReadString('\n')
	return s + blank, err
}

// scenarioBody is the request body of a scenario, valid on both versions (content and
// parts), padded so that its length is no multiple of 4 and the rounding up shows.
// scenarioQuestion is the conversation's text of scenarioBody (v1's content, v2's text part):
// an answer without usage is charged a token per 4 of its bytes for the prompt, whatever pads
// the body.
const scenarioQuestion = "How do I rotate a key?"

func scenarioBody(fp string) string {
	b := `{"fp":"` + fp + `","messages":[{"id":"u1","role":"user","content":"` + scenarioQuestion + `","parts":[{"type":"text","text":"` + scenarioQuestion + `"}]}],"pad":"`
	for len(b+`"}`)%4 != 3 {
		b += "x"
	}
	return b + `"}`
}

func ceil4(n int) int { return (n + 3) / 4 }

func scenarioConfig() string {
	var orgs strings.Builder
	for _, s := range []string{"full", "cut-after-usage", "cut-before-usage", "error", "disconnect"} {
		for _, v := range []string{"v1", "v2"} {
			fmt.Fprintf(&orgs, "  %s-%s: [%s-%s]\n", s, v, s, v)
		}
	}
	return "orgs:\n" + orgs.String() + `  tight: [tight]
limits:
  assistant_tokens_per_org: {limit: 1000000, window: month, by: org, unit: tokens}
plans:
  small:
    assistant_tokens_per_org: {limit: 200}
routes:
  - name: assistant_message
    limits: [assistant_per_key, assistant_per_org, assistant_per_ip, assistant_tokens_per_org]
  - name: assistant_message_v2
    limits: [assistant_per_key, assistant_per_org, assistant_per_ip, assistant_tokens_per_org]
`
}

func TestStreamScenariosV1AndV2(t *testing.T) {
	t.Parallel()
	up := newScenarioUpstream(t)
	p := startGateway(t, up.url, strings.Replace(scenarioConfig(), "  tight: [tight]", "  tight: {domains: [tight], plan: small}", 1))
	client := hardClient(30 * time.Second)

	type want struct {
		reason             string
		prompt, completion int
		estimated          bool
	}
	estimatedTotal := map[string][2]int{} // route -> prompt, completion charged by estimate
	for _, v := range []string{"v1", "v2"} {
		v2 := v == "v2"
		route := "assistant_message"
		if v2 {
			route = "assistant_message_v2"
		}
		for _, sc := range []string{"full", "cut-after-usage", "cut-before-usage", "error", "disconnect"} {
			t.Run(v+"/"+sc, func(t *testing.T) {
				body := scenarioBody(sc)
				org := sc + "-" + v
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+p.public+"/discovery/"+v+"/assistant/"+org+"/message", strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer svc_dsc_scenario")
				req.Header.Set("Content-Type", "application/json")
				res, err := client.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer res.Body.Close()
				if res.StatusCode != 200 {
					t.Fatalf("status %d", res.StatusCode)
				}
				if v2 && (res.Header.Get("X-Vercel-AI-UI-Message-Stream") != "v1" || res.Header.Get("Content-Type") != "text/event-stream" || res.Header.Get("X-Accel-Buffering") != "no") {
					t.Fatalf("v2 headers: %v", res.Header)
				}
				br := bufio.NewReader(res.Body)
				var got []byte
				var w want
				switch sc {
				case "full":
					// Each part is read as it comes and acked: the upstream sends the next
					// only then, so a part held back by the gateway would stall the stream.
					f := frames{v2: v2}
					n := len(f.head()) + len(scenarioTexts) + len(f.finish())
					for i := range n {
						part, err := readPart(br, v2)
						if err != nil {
							t.Fatalf("part %d: %v after %q", i, err, got)
						}
						got = append(got, part...)
						up.ack <- struct{}{}
					}
					if rest, _ := io.ReadAll(br); len(rest) != 0 {
						t.Fatalf("bytes after the last part: %q", rest)
					}
					w = want{"stop", scenarioPrompt, scenarioCompletion, false}
				case "disconnect":
					for range len(frames{v2: v2}.head()) + 1 {
						part, err := readPart(br, v2)
						if err != nil {
							t.Fatal(err)
						}
						got = append(got, part...)
					}
					closed := time.Now()
					cancel()
					deadline := time.Now().Add(5 * time.Second)
					for {
						if at, ok := up.canceledAt(sc + "/" + v); ok {
							t.Logf("upstream cancelled %v after the client went away", at.Sub(closed))
							break
						}
						if time.Now().After(deadline) {
							t.Fatal("the upstream request was not cancelled after the client went away")
						}
						time.Sleep(10 * time.Millisecond)
					}
					w = want{"incomplete", ceil4(len(scenarioQuestion)), ceil4(len(scenarioTexts[0])), true}
				default:
					got, _ = io.ReadAll(br)
					switch sc {
					case "cut-after-usage":
						w = want{"incomplete", scenarioPrompt, scenarioCompletion, false}
					case "cut-before-usage":
						w = want{"incomplete", ceil4(len(scenarioQuestion)), ceil4(len(scenarioTexts[0]) + len(scenarioTexts[1])), true}
					case "error":
						w = want{"error", ceil4(len(scenarioQuestion)), ceil4(len(scenarioTexts[0])), true}
					}
				}
				// Every byte the upstream wrote, as it wrote it.
				if sent := up.bytesSent(sc + "/" + v); string(got) != string(sent) {
					t.Fatalf("client got\n%q\nupstream sent\n%q", got, sent)
				}
				waitMetric(t, p, fmt.Sprintf(`gateway_stream_finished_total{reason=%q,route=%q}`, w.reason, route), 5*time.Second, func(f float64) bool { return f >= 1 })
				m := scrape(t, p)
				for kind, n := range map[string]int{"prompt": w.prompt, "completion": w.completion} {
					k := fmt.Sprintf(`gateway_stream_tokens_total{kind=%q,org=%q,route=%q}`, kind, org, route)
					if m[k] != float64(n) {
						t.Errorf("%s = %v, want %d", k, m[k], n)
					}
				}
				if w.estimated {
					e := estimatedTotal[route]
					estimatedTotal[route] = [2]int{e[0] + w.prompt, e[1] + w.completion}
				}
				for i, kind := range []string{"prompt", "completion"} {
					k := fmt.Sprintf(`gateway_stream_tokens_estimated_total{kind=%q,route=%q}`, kind, route)
					if want := estimatedTotal[route][i]; m[k] != float64(want) {
						t.Errorf("%s = %v, want %d", k, m[k], want)
					}
				}
				// The tokens limit was debited with the same number: /usage/top shows it.
				deadline := time.Now().Add(5 * time.Second)
				for {
					used := int64(-1)
					for _, tn := range getTop(t, p, "?limit=assistant_tokens_per_org&n=1000").Tenants {
						if tn.ID == org {
							used = tn.Used
						}
					}
					if used == int64(w.prompt+w.completion) {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("/usage/top: %s used %d, want %d", org, used, w.prompt+w.completion)
					}
					time.Sleep(20 * time.Millisecond)
				}
			})
		}
	}

	// The access log names each stream's finish reason; the disconnects were cancelled.
	reasons := map[string]int{}
	canceled := 0
	for _, l := range accessLines(p) {
		if r, ok := l["finish_reason"].(string); ok {
			reasons[l["route"].(string)+" "+r]++
		}
		if l["upstream_error"] == "canceled" {
			canceled++
		}
	}
	for _, route := range []string{"assistant_message", "assistant_message_v2"} {
		if reasons[route+" stop"] != 1 || reasons[route+" incomplete"] != 3 || reasons[route+" error"] != 1 {
			t.Errorf("%s finish reasons in the log: %v", route, reasons)
		}
	}
	if canceled != 2 {
		t.Errorf("%d access lines with upstream_error canceled, want 2", canceled)
	}

	// A tokens limit denies once spent, on v2 as on v1: the org "tight" has 200 tokens a
	// month; two full answers of 113 spend them (the second admitted with 87 left), the
	// third is refused naming the limit, on both versions (one quota).
	for i := range 2 {
		go func() {
			for range len(frames{v2: true}.head()) + len(scenarioTexts) + len(frames{v2: true}.finish()) {
				up.ack <- struct{}{}
			}
		}()
		res := send(t, p, "POST", "/discovery/v2/assistant/tight/message", "svc_dsc_scenario", scenarioBody("full"))
		if res.StatusCode != 200 {
			t.Fatalf("tight answer %d: %d", i, res.StatusCode)
		}
		want := float64(i + 2) // after the full v2 scenario
		waitMetric(t, p, `gateway_stream_finished_total{reason="stop",route="assistant_message_v2"}`, 5*time.Second, func(f float64) bool { return f >= want })
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		top := getTop(t, p, "?limit=assistant_tokens_per_org&n=1000")
		used := int64(0)
		for _, tn := range top.Tenants {
			if tn.ID == "tight" {
				used = tn.Used
			}
		}
		if used == 2*(scenarioPrompt+scenarioCompletion) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("tight used %d tokens, want %d", used, 2*(scenarioPrompt+scenarioCompletion))
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, v := range []string{"v2", "v1"} {
		req, _ := http.NewRequest("POST", "http://"+p.public+"/discovery/"+v+"/assistant/tight/message", strings.NewReader(scenarioBody("full")))
		req.Header.Set("Authorization", "Bearer svc_dsc_scenario")
		req.Header.Set("Content-Type", "application/json")
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 429 || !strings.Contains(string(data), `"limit":"assistant_tokens_per_org"`) {
			t.Fatalf("%s after the tokens were spent: %d %s", v, res.StatusCode, data)
		}
	}
}
