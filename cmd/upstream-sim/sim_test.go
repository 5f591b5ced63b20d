package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	adminKey     = "Bearer svc_test_admin"
	assistantKey = "Bearer svc_dsc_test_public"
)

func newTestServer(t *testing.T, cfg simConfig) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(newHandler(cfg))
	t.Cleanup(srv.Close)
	return srv
}

// do sends a request and returns status, headers and body.
func do(t *testing.T, method, url, auth, body string) (int, http.Header, []byte) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, b
}

// wantJSONError checks a JSON {"error": "..."} body, optionally with exact msg.
func wantJSONError(t *testing.T, h http.Header, body []byte, msg string) {
	t.Helper()
	if ct := h.Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type = %q, want application/json", ct)
	}
	var e map[string]any
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatalf("error body %q is not JSON: %v", body, err)
	}
	s, ok := e["error"].(string)
	if !ok || s == "" || len(e) != 1 {
		t.Fatalf("error body = %s, want {\"error\": non-empty string}", body)
	}
	if msg != "" && s != msg {
		t.Errorf("error = %q, want %q", s, msg)
	}
}

var uuidRE = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

func createJob(t *testing.T, base, project string) map[string]any {
	t.Helper()
	code, h, body := do(t, "POST", base+"/v2/agent/"+project+"/job", adminKey, `{"prompt":"Fix the typos in the quickstart"}`)
	if code != http.StatusCreated {
		t.Fatalf("create: status %d, body %s", code, body)
	}
	if ct := h.Get("Content-Type"); ct != "application/json" {
		t.Errorf("create: Content-Type = %q", ct)
	}
	var j map[string]any
	if err := json.Unmarshal(body, &j); err != nil {
		t.Fatalf("create: body %s: %v", body, err)
	}
	return j
}

func TestJobCreateHasEverySpecField(t *testing.T) {
	srv := newTestServer(t, simConfig{JobCompleteAfter: time.Hour})
	before := time.Now().Add(-time.Millisecond)
	j := createJob(t, srv.URL, "proj_1")
	after := time.Now().Add(time.Millisecond)

	want := []string{"id", "status", "source", "model", "prLink", "createdAt", "archivedAt"}
	if len(j) != len(want) {
		t.Errorf("job has %d fields, want %d: %v", len(j), len(want), j)
	}
	id, ok := j["id"].(string)
	if !ok || !uuidRE.MatchString(id) {
		t.Errorf("id = %#v, want a v4 UUID string", j["id"])
	}
	if j["status"] != "active" {
		t.Errorf("status = %#v, want active", j["status"])
	}
	src, ok := j["source"].(map[string]any)
	if !ok {
		t.Fatalf("source = %#v, want object", j["source"])
	}
	if r, ok := src["repository"].(string); !ok || r == "" {
		t.Errorf("source.repository = %#v, want non-empty string", src["repository"])
	}
	if src["ref"] != "main" {
		t.Errorf("source.ref = %#v, want main", src["ref"])
	}
	if m, ok := j["model"].(string); !ok || m == "" {
		t.Errorf("model = %#v, want non-empty string", j["model"])
	}
	for _, k := range []string{"prLink", "archivedAt"} {
		if v, present := j[k]; !present || v != nil {
			t.Errorf("%s = %#v (present %v), want null", k, v, present)
		}
	}
	ca, ok := j["createdAt"].(string)
	if !ok {
		t.Fatalf("createdAt = %#v, want string", j["createdAt"])
	}
	if !regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$`).MatchString(ca) {
		t.Errorf("createdAt = %q, want RFC 3339 UTC with milliseconds", ca)
	}
	ct, err := time.Parse(time.RFC3339Nano, ca)
	if err != nil {
		t.Fatal(err)
	}
	if ct.Before(before.Truncate(time.Millisecond)) || ct.After(after) {
		t.Errorf("createdAt %v not within [%v, %v]", ct, before, after)
	}

	j2 := createJob(t, srv.URL, "proj_1")
	if j2["id"] == j["id"] {
		t.Errorf("two jobs got the same id %v", j["id"])
	}
}

func getJob(t *testing.T, base, project, id string) map[string]any {
	t.Helper()
	code, _, body := do(t, "GET", base+"/v2/agent/"+project+"/job/"+id, adminKey, "")
	if code != http.StatusOK {
		t.Fatalf("get: status %d, body %s", code, body)
	}
	var j map[string]any
	if err := json.Unmarshal(body, &j); err != nil {
		t.Fatal(err)
	}
	return j
}

// waitCompleted polls until the job is completed and returns it.
func waitCompleted(t *testing.T, base, project, id string) (map[string]any, time.Duration) {
	t.Helper()
	start := time.Now()
	for time.Since(start) < 5*time.Second {
		j := getJob(t, base, project, id)
		if j["status"] == "completed" {
			return j, time.Since(start)
		}
		if j["status"] != "active" || j["prLink"] != nil {
			t.Fatalf("while running: status %v prLink %v", j["status"], j["prLink"])
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("job never completed")
	return nil, 0
}

var prLinkRE = regexp.MustCompile(`^https://github\.com/[^/]+/[^/]+/pull/\d+$`)

func TestJobPollingCompletesAfterDelay(t *testing.T) {
	const delay = 50 * time.Millisecond
	srv := newTestServer(t, simConfig{JobCompleteAfter: delay})
	created := createJob(t, srv.URL, "p")
	id := created["id"].(string)

	if j := getJob(t, srv.URL, "p", id); j["status"] != "active" {
		t.Fatalf("right after creation status = %v, want active", j["status"])
	}
	j, _ := waitCompleted(t, srv.URL, "p", id)
	if s, _ := j["prLink"].(string); !prLinkRE.MatchString(s) {
		t.Errorf("prLink = %#v, want a pull request URL", j["prLink"])
	}
	if j["id"] != id || j["createdAt"] != created["createdAt"] || j["archivedAt"] != nil {
		t.Errorf("completed job changed identity: %v vs %v", j, created)
	}
	ca, _ := time.Parse(time.RFC3339Nano, created["createdAt"].(string))
	if time.Since(ca) < delay-time.Millisecond {
		t.Errorf("completed before the configured delay")
	}

	// A follow-up message makes it active again, then completed again
	// with the same pull request.
	code, _, body := do(t, "POST", srv.URL+"/v2/agent/p/job/"+id+"/message", adminKey, `{"prompt":"Also fix the links"}`)
	if code != http.StatusOK {
		t.Fatalf("message: status %d body %s", code, body)
	}
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatal(err)
	}
	if m["id"] != id || m["status"] != "active" || m["prLink"] != nil {
		t.Errorf("after follow-up: %s", body)
	}
	j2, _ := waitCompleted(t, srv.URL, "p", id)
	if j2["prLink"] != j["prLink"] {
		t.Errorf("prLink changed: %v -> %v", j["prLink"], j2["prLink"])
	}
}

func TestJobNotFound(t *testing.T) {
	srv := newTestServer(t, simConfig{JobCompleteAfter: time.Hour})
	id := createJob(t, srv.URL, "owner")["id"].(string)
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/v2/agent/owner/job/nope", ""},
		{"GET", "/v2/agent/other/job/" + id, ""}, // another project's job
		{"POST", "/v2/agent/owner/job/nope/message", `{"prompt":"x"}`},
		{"POST", "/v2/agent/other/job/" + id + "/message", `{"prompt":"x"}`},
	} {
		code, h, body := do(t, c.method, srv.URL+c.path, adminKey, c.body)
		if code != http.StatusNotFound {
			t.Errorf("%s %s: status %d, want 404", c.method, c.path, code)
			continue
		}
		wantJSONError(t, h, body, "Job not found")
	}
}

func TestJobAuthAndValidation(t *testing.T) {
	srv := newTestServer(t, simConfig{JobCompleteAfter: time.Hour})
	id := createJob(t, srv.URL, "p")["id"].(string)
	for _, c := range []struct {
		name, method, path, auth, body string
		want                           int
	}{
		{"no auth", "POST", "/v2/agent/p/job", "", `{"prompt":"x"}`, 401},
		{"empty bearer", "POST", "/v2/agent/p/job", "Bearer ", `{"prompt":"x"}`, 401},
		{"basic scheme", "POST", "/v2/agent/p/job", "Basic dXNlcjpwdw==", `{"prompt":"x"}`, 401},
		{"get no auth", "GET", "/v2/agent/p/job/" + id, "", "", 401},
		{"message no auth", "POST", "/v2/agent/p/job/" + id + "/message", "", `{"prompt":"x"}`, 401},
		{"no body", "POST", "/v2/agent/p/job", adminKey, "", 400},
		{"not json", "POST", "/v2/agent/p/job", adminKey, `prompt=x`, 400},
		{"array", "POST", "/v2/agent/p/job", adminKey, `["x"]`, 400},
		{"null", "POST", "/v2/agent/p/job", adminKey, `null`, 400},
		{"missing prompt", "POST", "/v2/agent/p/job", adminKey, `{"task":"x"}`, 400},
		{"empty prompt", "POST", "/v2/agent/p/job", adminKey, `{"prompt":""}`, 400},
		{"null prompt", "POST", "/v2/agent/p/job", adminKey, `{"prompt":null}`, 400},
		{"number prompt", "POST", "/v2/agent/p/job", adminKey, `{"prompt":5}`, 400},
		{"trailing garbage", "POST", "/v2/agent/p/job", adminKey, `{"prompt":"x"} {}`, 400},
		{"message empty prompt", "POST", "/v2/agent/p/job/" + id + "/message", adminKey, `{"prompt":""}`, 400},
		{"lowercase bearer ok", "POST", "/v2/agent/p/job", "bearer svc_x", `{"prompt":"x"}`, 201},
	} {
		t.Run(c.name, func(t *testing.T) {
			code, h, body := do(t, c.method, srv.URL+c.path, c.auth, c.body)
			if code != c.want {
				t.Fatalf("status %d, want %d (body %s)", code, c.want, body)
			}
			if c.want >= 400 {
				wantJSONError(t, h, body, "")
			}
		})
	}
}

func TestRoutingNotFoundMethodHealthz(t *testing.T) {
	srv := newTestServer(t, simConfig{})
	for _, p := range []string{"/", "/v1/agent/p/job", "/v2/agent/p/jobs", "/discovery/v3/assistant/d/message", "/v2/agent/p/job/j/message/x"} {
		code, h, body := do(t, "GET", srv.URL+p, adminKey, "")
		if code != http.StatusNotFound {
			t.Errorf("GET %s: status %d, want 404", p, code)
			continue
		}
		wantJSONError(t, h, body, "Not found")
	}
	for _, c := range []struct{ method, path, allow string }{
		{"GET", "/v2/agent/p/job", "POST"},
		{"DELETE", "/v2/agent/p/job/j", "GET, HEAD"},
		{"GET", "/v2/agent/p/job/j/message", "POST"},
		{"GET", "/discovery/v1/assistant/d/message", "POST"},
		{"PUT", "/discovery/v2/assistant/d/message", "POST"},
		{"POST", "/healthz", "GET, HEAD"},
	} {
		code, h, body := do(t, c.method, srv.URL+c.path, adminKey, "")
		if code != http.StatusMethodNotAllowed {
			t.Errorf("%s %s: status %d, want 405", c.method, c.path, code)
			continue
		}
		wantJSONError(t, h, body, "")
		if got := h.Get("Allow"); got != c.allow {
			t.Errorf("%s %s: Allow = %q, want %q", c.method, c.path, got, c.allow)
		}
	}
	code, _, body := do(t, "GET", srv.URL+"/healthz", "", "")
	if code != 200 || string(body) != "ok" {
		t.Errorf("healthz: %d %q", code, body)
	}
}

const assistantBodyJSON = `{"fp":"anonymous","retrievalPageSize":5,"messages":[` +
	`{"id":"m1","role":"user","content":"What is an API key?","parts":[{"type":"text","text":"What is an API key?"}]},` +
	`{"id":"m2","role":"assistant","content":"An API key is...","parts":[{"type":"text","text":"An API key is..."}]},` +
	`{"id":"m3","role":"user","content":"How do I\ncreate an \"agent job\"?","parts":[{"type":"text","text":"How do I create an agent job?"}]}]}`

type streamLine struct {
	at   time.Time
	text string
}

// postStream starts an assistant request and returns the response.
func postStream(t *testing.T, ctx context.Context, url, auth, body string) *http.Response {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, "POST", url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// readLines reads the stream line by line, stamping each line's arrival.
func readLines(t *testing.T, r io.Reader) []streamLine {
	t.Helper()
	br := bufio.NewReader(r)
	var out []streamLine
	for {
		s, err := br.ReadString('\n')
		if s != "" {
			if !strings.HasSuffix(s, "\n") {
				t.Fatalf("unterminated line %q", s)
			}
			out = append(out, streamLine{time.Now(), strings.TrimSuffix(s, "\n")})
		}
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}

type finishPart struct {
	FinishReason string `json:"finishReason"`
	Usage        *struct {
		PromptTokens     *int `json:"promptTokens"`
		CompletionTokens *int `json:"completionTokens"`
	} `json:"usage"`
	IsContinued *bool   `json:"isContinued"`
	ThreadID    *string `json:"threadId"`
}

// checkStream validates the data stream layout and returns the text parts
// and the d: part.
func checkStream(t *testing.T, lines []streamLine, parts int) ([]string, finishPart) {
	t.Helper()
	if len(lines) != parts+3 {
		for _, l := range lines {
			t.Log(l.text)
		}
		t.Fatalf("got %d lines, want %d (f, %d×0, e, d)", len(lines), parts+3, parts)
	}
	var f struct{ MessageID string }
	if !strings.HasPrefix(lines[0].text, "f:") || json.Unmarshal([]byte(lines[0].text[2:]), &f) != nil || !strings.HasPrefix(f.MessageID, "msg-") {
		t.Errorf("first line %q, want f:{\"messageId\":\"msg-...\"}", lines[0].text)
	}
	var texts []string
	for _, l := range lines[1 : 1+parts] {
		var s string
		if !strings.HasPrefix(l.text, "0:") || json.Unmarshal([]byte(l.text[2:]), &s) != nil || s == "" {
			t.Fatalf("text line %q, want 0:<JSON string>", l.text)
		}
		texts = append(texts, s)
	}
	var e, d finishPart
	el, dl := lines[parts+1].text, lines[parts+2].text
	if !strings.HasPrefix(el, "e:") || json.Unmarshal([]byte(el[2:]), &e) != nil {
		t.Fatalf("e line %q", el)
	}
	if e.FinishReason != "stop" || e.Usage == nil || e.Usage.PromptTokens == nil || e.Usage.CompletionTokens == nil || e.IsContinued == nil || *e.IsContinued {
		t.Errorf("e part %q incomplete", el)
	}
	if !strings.HasPrefix(dl, "d:") || json.Unmarshal([]byte(dl[2:]), &d) != nil {
		t.Fatalf("last line %q, want d:", dl)
	}
	if d.FinishReason != "stop" || d.Usage == nil || d.Usage.PromptTokens == nil || d.Usage.CompletionTokens == nil || d.ThreadID == nil || *d.ThreadID == "" {
		t.Errorf("d part %q incomplete", dl)
	}
	if *e.Usage.CompletionTokens != *d.Usage.CompletionTokens || *e.Usage.CompletionTokens <= 0 {
		t.Errorf("usage mismatch/empty: e %q d %q", el, dl)
	}
	return texts, d
}

func TestAssistantStreamFormat(t *testing.T) {
	srv := newTestServer(t, simConfig{AnswerParts: 5})
	resp := postStream(t, context.Background(), srv.URL+"/discovery/v1/assistant/acme-docs/message", assistantKey, assistantBodyJSON)
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d body %s", resp.StatusCode, b)
	}
	h := resp.Header
	if got := h.Get("Content-Type"); got != "text/plain; charset=utf-8" {
		t.Errorf("Content-Type = %q", got)
	}
	if got := h.Get("X-Vercel-AI-Data-Stream"); got != "v1" {
		t.Errorf("X-Vercel-AI-Data-Stream = %q", got)
	}
	if h.Get("Content-Length") != "" || resp.ContentLength != -1 {
		t.Errorf("stream has a Content-Length (%d)", resp.ContentLength)
	}
	if len(resp.TransferEncoding) == 0 || resp.TransferEncoding[0] != "chunked" {
		t.Errorf("Transfer-Encoding = %v, want chunked", resp.TransferEncoding)
	}
	tid, tkey := h.Get("X-Thread-Id"), h.Get("X-Thread-Key")
	if tid == "" || tkey == "" {
		t.Errorf("new thread: X-Thread-Id %q X-Thread-Key %q, want both", tid, tkey)
	}
	texts, d := checkStream(t, readLines(t, resp.Body), 5)
	if *d.ThreadID != tid {
		t.Errorf("d threadId %q != X-Thread-Id %q", *d.ThreadID, tid)
	}
	if !strings.Contains(texts[0], `How do I create an "agent job"?`) {
		t.Errorf("first part %q does not echo the last user message", texts[0])
	}
}

func TestAssistantThreads(t *testing.T) {
	srv := newTestServer(t, simConfig{AnswerParts: 1})
	url := srv.URL + "/discovery/v1/assistant/d/message"
	ids := map[string]bool{}
	for i := 0; i < 2; i++ { // absent and null threadId both start a thread
		body := `{"fp":"anonymous","messages":[]}`
		if i == 1 {
			body = `{"fp":"anonymous","messages":[],"threadId":null}`
		}
		resp := postStream(t, context.Background(), url, assistantKey, body)
		_, d := checkStream(t, readLines(t, resp.Body), 1)
		resp.Body.Close()
		tid := resp.Header.Get("X-Thread-Id")
		if tid == "" || tid != *d.ThreadID || ids[tid] {
			t.Errorf("new thread %d: header %q d %q", i, tid, *d.ThreadID)
		}
		ids[tid] = true
	}
	resp := postStream(t, context.Background(), url, assistantKey, `{"fp":"u1","messages":[{"role":"user","content":"hi"}],"threadId":"thread_keep\"me"}`)
	defer resp.Body.Close()
	_, d := checkStream(t, readLines(t, resp.Body), 1)
	if *d.ThreadID != `thread_keep"me` {
		t.Errorf("threadId not reused: %q", *d.ThreadID)
	}
	if resp.Header.Get("X-Thread-Id") != "" || resp.Header.Get("X-Thread-Key") != "" {
		t.Errorf("continued thread got new thread headers")
	}
}

func TestAssistantAuthAndValidation(t *testing.T) {
	srv := newTestServer(t, simConfig{AnswerParts: 1})
	url := srv.URL + "/discovery/v1/assistant/d/message"
	for _, c := range []struct {
		name, auth, body string
		want             int
	}{
		{"no auth", "", `{"fp":"a","messages":[]}`, 401},
		{"admin key", adminKey, `{"fp":"a","messages":[]}`, 401},
		{"empty bearer", "Bearer ", `{"fp":"a","messages":[]}`, 401},
		{"not json", assistantKey, `hello`, 400},
		{"missing fp", assistantKey, `{"messages":[]}`, 400},
		{"fp not string", assistantKey, `{"fp":1,"messages":[]}`, 400},
		{"missing messages", assistantKey, `{"fp":"a"}`, 400},
		{"null messages", assistantKey, `{"fp":"a","messages":null}`, 400},
		{"messages object", assistantKey, `{"fp":"a","messages":{}}`, 400},
		{"message not object", assistantKey, `{"fp":"a","messages":["hi"]}`, 400},
		{"threadId number", assistantKey, `{"fp":"a","messages":[],"threadId":3}`, 400},
		{"currentPath too long", assistantKey, `{"fp":"a","messages":[],"currentPath":"/` + strings.Repeat("x", 200) + `"}`, 400},
		{"ok", assistantKey, `{"fp":"a","messages":[],"currentPath":"/quickstart","filter":null,"context":[{"type":"code","value":"x"}]}`, 200},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp := postStream(t, context.Background(), url, c.auth, c.body)
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != c.want {
				t.Fatalf("status %d, want %d (body %s)", resp.StatusCode, c.want, b)
			}
			if c.want >= 400 {
				wantJSONError(t, resp.Header, b, "")
			}
		})
	}
}

func TestAssistantPacing(t *testing.T) {
	const delay, parts = 30 * time.Millisecond, 8
	srv := newTestServer(t, simConfig{PartDelay: delay, AnswerParts: parts})
	start := time.Now()
	resp := postStream(t, context.Background(), srv.URL+"/discovery/v1/assistant/d/message", assistantKey, assistantBodyJSON)
	defer resp.Body.Close()
	lines := readLines(t, resp.Body)
	end := time.Now()
	checkStream(t, lines, parts)

	total := end.Sub(start)
	if total < parts*delay {
		t.Errorf("stream took %v, want >= %v with pacing", total, parts*delay)
	}
	firstText := lines[1].at
	if left := end.Sub(firstText); left < (parts-2)*delay {
		t.Errorf("first text part arrived only %v before the end; want it streamed early (>= %v)", left, (parts-2)*delay)
	}
	if lines[0].at.Sub(start) > (parts/2)*delay {
		t.Errorf("f: part arrived after %v, want it at once", lines[0].at.Sub(start))
	}
	// Parts arrive spread out, not in one burst. A scheduling hiccup on the
	// reading side can bunch two parts, so only most gaps must show pacing.
	paced := 0
	for i := 2; i <= parts; i++ {
		if lines[i].at.Sub(lines[i-1].at) >= delay/2 {
			paced++
		}
	}
	if paced < (parts-1)/2 {
		t.Errorf("only %d of %d gaps between text parts are >= %v", paced, parts-1, delay/2)
	}
}

func TestAssistantStamp(t *testing.T) {
	srv := newTestServer(t, simConfig{PartDelay: time.Millisecond, AnswerParts: 4, Stamp: true})
	resp := postStream(t, context.Background(), srv.URL+"/discovery/v1/assistant/d/message", assistantKey, assistantBodyJSON)
	defer resp.Body.Close()
	lines := readLines(t, resp.Body)
	texts, _ := checkStream(t, lines, 4)
	checkStamps(t, texts, lines[1:])
	// v2 stamps its text-delta events the same way.
	resp2 := postStream(t, context.Background(), srv.URL+"/discovery/v2/assistant/d/message", assistantKey, assistantBodyV2)
	defer resp2.Body.Close()
	events := readEvents(t, resp2.Body)
	texts2, _ := checkUIStream(t, events, 4)
	checkStamps(t, texts2, events[3:])
}

// checkStamps checks that each text starts with its send time, before its arrival.
func checkStamps(t *testing.T, texts []string, lines []streamLine) {
	t.Helper()
	var prev int64
	for i, s := range texts {
		ns, rest, ok := strings.Cut(s, " ")
		n, err := strconv.ParseInt(ns, 10, 64)
		if !ok || err != nil || rest == "" {
			t.Fatalf("part %q, want \"<unix-nanos> words\"", s)
		}
		sent := time.Unix(0, n)
		if sent.After(lines[i].at) || lines[i].at.Sub(sent) > time.Second {
			t.Errorf("stamp %v vs arrival %v", sent, lines[i].at)
		}
		if n <= prev {
			t.Errorf("stamps not increasing: %d then %d", prev, n)
		}
		prev = n
	}
}

func TestAssistantFastMode(t *testing.T) {
	srv := newTestServer(t, simConfig{PartDelay: 0, AnswerParts: 2})
	start := time.Now()
	resp := postStream(t, context.Background(), srv.URL+"/discovery/v1/assistant/d/message", assistantKey, assistantBodyJSON)
	defer resp.Body.Close()
	checkStream(t, readLines(t, resp.Body), 2)
	if d := time.Since(start); d > time.Second {
		t.Errorf("unpaced stream took %v", d)
	}
}

func TestAssistantClientCancelStopsHandler(t *testing.T) {
	type result struct {
		parts int
		err   error
	}
	done := make(chan result, 1)
	const parts = 100
	srv := newTestServer(t, simConfig{
		PartDelay:   50 * time.Millisecond,
		AnswerParts: parts,
		streamDone:  func(n int, err error) { done <- result{n, err} },
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp := postStream(t, ctx, srv.URL+"/discovery/v1/assistant/d/message", assistantKey, assistantBodyJSON)
	br := bufio.NewReader(resp.Body)
	for i := 0; i < 2; i++ { // f: and the first text part
		if _, err := br.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	cancel()
	resp.Body.Close()
	select {
	case r := <-done:
		if r.err == nil || r.parts >= parts {
			t.Errorf("handler finished with %d parts, err %v; want an early stop", r.parts, r.err)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("handler still streaming 2s after the client went away")
	}
}

func TestJobStoreEvictsOldest(t *testing.T) {
	s := newJobStore(3)
	for i := 0; i < 5; i++ {
		s.add(&job{id: strconv.Itoa(i), projectID: "p"})
	}
	if n := s.len(); n != 3 {
		t.Fatalf("len = %d, want 3", n)
	}
	for i := 0; i < 5; i++ {
		_, ok := s.snapshot("p", strconv.Itoa(i), nil)
		if ok != (i >= 2) {
			t.Errorf("job %d present = %v", i, ok)
		}
	}
}

func TestAppendJSONStringMatchesEncodingJSON(t *testing.T) {
	for _, s := range []string{"", "plain", `q"uote\back`, "tab\tnl\ncr\r\x00\x1f", "héllo ✓", "bad\xffutf8", "line\u2028sep\u2029", "<&>"} {
		got := appendJSONString(nil, s)
		var back string
		if err := json.Unmarshal(got, &back); err != nil {
			t.Errorf("%q -> %s: invalid JSON: %v", s, got, err)
			continue
		}
		want, _ := json.Marshal(s)
		var wantBack string
		_ = json.Unmarshal(want, &wantBack)
		if back != wantBack {
			t.Errorf("%q round-trips to %q, encoding/json gives %q", s, back, wantBack)
		}
	}
}

// syncBuffer is a goroutine-safe bytes.Buffer.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestRequestLogAndStreamingThroughIt(t *testing.T) {
	var logBuf syncBuffer
	srv := newTestServer(t, simConfig{Log: &logBuf, AnswerParts: 2, PartDelay: 20 * time.Millisecond})
	createJob(t, srv.URL, "p")
	resp := postStream(t, context.Background(), srv.URL+"/discovery/v1/assistant/d/message", assistantKey, assistantBodyJSON)
	lines := readLines(t, resp.Body)
	resp.Body.Close()
	checkStream(t, lines, 2)
	if lines[0].at.Add(15 * time.Millisecond).After(lines[len(lines)-1].at) {
		t.Errorf("logging wrapper seems to buffer the stream")
	}
	deadline := time.Now().Add(2 * time.Second)
	for strings.Count(logBuf.String(), "\n") < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	out := logBuf.String()
	if !strings.Contains(out, "POST /v2/agent/p/job 201") || !strings.Contains(out, "POST /discovery/v1/assistant/d/message 200") {
		t.Errorf("log = %q", out)
	}
}

func TestBadBodyTooLarge(t *testing.T) {
	srv := newTestServer(t, simConfig{})
	big := `{"prompt":"` + strings.Repeat("a", maxBodyBytes) + `"}`
	code, h, body := do(t, "POST", srv.URL+"/v2/agent/p/job", adminKey, big)
	if code != http.StatusRequestEntityTooLarge {
		t.Fatalf("status %d", code)
	}
	wantJSONError(t, h, body, "")
}
