package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docsgate/gateway/config"
)

// Hostile input against the binary over raw TCP (issue 5, items 7, 8 and 10).

// bodyUpstream records every request body that reaches it.
type bodyUpstream struct {
	URL  string
	mu   sync.Mutex
	seen []hostileSeen
}

type hostileSeen struct {
	path string
	body []byte
	xff  string
	hdr  http.Header
}

func newBodyUpstream(t *testing.T) *bodyUpstream {
	t.Helper()
	u := &bodyUpstream{}
	srvURL := serveHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.seen = append(u.seen, hostileSeen{r.URL.Path, body, r.Header.Get("X-Forwarded-For"), r.Header.Clone()})
		u.mu.Unlock()
		if strings.HasPrefix(r.URL.Path, "/discovery/") {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			fmt.Fprint(w, "0:\"hi\"\nd:{\"finishReason\":\"stop\"}\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(201)
		fmt.Fprint(w, `{"id":"j"}`)
	}))
	u.URL = srvURL
	return u
}

func (u *bodyUpstream) requests() []hostileSeen {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]hostileSeen(nil), u.seen...)
}

// rawResult is what came back on a raw connection.
type rawResult struct {
	data   string        // everything read until EOF, error or the deadline
	closed bool          // the server closed (EOF or reset) before the deadline
	after  time.Duration // time from the start to the close (or the deadline)
}

func (r rawResult) status() int {
	var code int
	if _, err := fmt.Sscanf(r.data, "HTTP/1.1 %d", &code); err != nil {
		return 0
	}
	return code
}

// rawExchange dials addr, writes the parts (pausing gap between them), and reads until the
// server closes the connection or wait passes.
func rawExchange(t *testing.T, addr string, wait, gap time.Duration, parts ...[]byte) rawResult {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	_ = c.SetReadDeadline(start.Add(wait))
	type readDone struct {
		data   []byte
		closed bool
		at     time.Time
	}
	rc := make(chan readDone, 1)
	go func() {
		var buf bytes.Buffer
		_, err := io.Copy(&buf, c)
		ne, isNet := err.(net.Error)
		rc <- readDone{buf.Bytes(), !(isNet && ne.Timeout()), time.Now()}
	}()
	go func() {
		for i, p := range parts {
			if i > 0 && gap > 0 {
				time.Sleep(gap)
			}
			if _, err := c.Write(p); err != nil {
				return // the server hung up; the reader sees it
			}
		}
	}()
	d := <-rc
	return rawResult{data: string(d.data), closed: d.closed, after: d.at.Sub(start)}
}

func bytesOf(parts ...string) [][]byte {
	out := make([][]byte, len(parts))
	for i, p := range parts {
		out[i] = []byte(p)
	}
	return out
}

// agentReq is a complete agent-job request with a valid admin key and the given framing
// headers and body, so that anything the gateway accepts it would forward.
func agentReq(framing, body string) string {
	return "POST /v2/agent/hostile/job HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer svc_hostile\r\n" +
		"Content-Type: application/json\r\nConnection: close\r\n" + framing + "\r\n" + body
}

func withCL(body string) string {
	return agentReq(fmt.Sprintf("Content-Length: %d\r\n", len(body)), body)
}

func assistantReq(body string) string {
	return fmt.Sprintf("POST /discovery/v1/assistant/acme/message HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer svc_dsc_hostile\r\n"+
		"Content-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
}

const hostileConfig = `server:
  read_header_timeout: 1s
  read_body_timeout: 1s
  max_header_bytes: 8192
limits:
  agent_job_per_project: {limit: 0}
  assistant_per_ip: {limit: 0}
  assistant_per_org: {limit: 0}
  assistant_per_key: {limit: 0}
`

// Item 7: every hostile input gets a clear 4xx (or 501 for an unknown transfer coding) or a
// closed connection within the server timeouts; none reaches the upstream malformed; the
// process survives.
func TestHostileInput(t *testing.T) {
	up := newBodyUpstream(t)
	p := startGateway(t, up.URL, hostileConfig)

	deep := func(n int, open, close string) string { return strings.Repeat(open, n) + strings.Repeat(close, n) }
	msg := `{"id":"1","role":"user","content":"hello there"}`
	manyMsgs := func(target int) string {
		n := target / (len(msg) + 1)
		return `{"fp":"a","messages":[` + strings.TrimSuffix(strings.Repeat(msg+",", n), ",") + `]}`
	}
	// Just under max_body_bytes (1 MiB), in as many messages as the default max_messages lets
	// a body hold (1000): longer messages fill it.
	long := `{"id":"1","role":"user","content":"` + strings.Repeat("h", 990) + `"}`
	within := `{"fp":"a","messages":[` + strings.TrimSuffix(strings.Repeat(long+",", 1000), ",") + `]}`
	over := manyMsgs(1100 * 1000)
	numbers := `{"prompt":"x","extra":[` + strings.TrimSuffix(strings.Repeat("1,", 450000), ",") + `]}`

	type tc struct {
		name  string
		parts []string
		gap   time.Duration
		want  []int // acceptable statuses; 0 means a close without an answer is acceptable
	}
	cases := []tc{
		{name: "oversized headers", parts: []string{"GET /v2/agent/p/job/j HTTP/1.1\r\nHost: gw\r\nX-Big: " + strings.Repeat("a", 20000) + "\r\n\r\n"}, want: []int{431}},
		{name: "many headers", parts: []string{"GET /v2/agent/p/job/j HTTP/1.1\r\nHost: gw\r\n" + strings.Repeat("X-A: b\r\n", 3000) + "\r\n"}, want: []int{431}},
		{name: "body never finishes (content-length)", parts: []string{agentReq("Content-Length: 100\r\n", `{"prompt":"x"`)}, want: []int{408}},
		{name: "body never finishes (chunked)", parts: []string{agentReq("Transfer-Encoding: chunked\r\n", "5\r\n{\"pro\r\n")}, want: []int{408}},
		{name: "conflicting content-length", parts: []string{agentReq("Content-Length: 14\r\nContent-Length: 15\r\n", `{"prompt":"x"}`)}, want: []int{400}},
		{name: "content-length list", parts: []string{agentReq("Content-Length: 14, 15\r\n", `{"prompt":"x"}`)}, want: []int{400}},
		{name: "negative content-length", parts: []string{agentReq("Content-Length: -14\r\n", `{"prompt":"x"}`)}, want: []int{400}},
		{name: "signed content-length", parts: []string{agentReq("Content-Length: +14\r\n", `{"prompt":"x"}`)}, want: []int{400}},
		{name: "te xchunked", parts: []string{agentReq("Transfer-Encoding: xchunked\r\n", "e\r\n{\"prompt\":\"x\"}\r\n0\r\n\r\n")}, want: []int{400, 501}},
		{name: "te chunked, identity", parts: []string{agentReq("Transfer-Encoding: chunked, identity\r\n", "e\r\n{\"prompt\":\"x\"}\r\n0\r\n\r\n")}, want: []int{400, 501}},
		{name: "te identity", parts: []string{agentReq("Transfer-Encoding: identity\r\nContent-Length: 14\r\n", `{"prompt":"x"}`)}, want: []int{400, 501}},
		{name: "te twice", parts: []string{agentReq("Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n", "e\r\n{\"prompt\":\"x\"}\r\n0\r\n\r\n")}, want: []int{400, 501}},
		{name: "te with space before colon", parts: []string{agentReq("Transfer-Encoding : chunked\r\n", "e\r\n{\"prompt\":\"x\"}\r\n0\r\n\r\n")}, want: []int{400}},
		{name: "bad chunk size", parts: []string{agentReq("Transfer-Encoding: chunked\r\n", "zz\r\n{\"prompt\":\"x\"}\r\n0\r\n\r\n")}, want: []int{400}},
		{name: "deep arrays (100000)", parts: []string{withCL(deep(100000, "[", "]"))}, want: []int{400}},
		{name: "deep objects in prompt position (100000)", parts: []string{withCL(`{"prompt":` + deep(100000, `{"a":`, "}") + "}")}, want: []int{400}},
		{name: "deep arrays in an assistant message (100000)", parts: []string{assistantReq(`{"fp":"a","messages":[` + deep(100000, "[", "]") + "]}")}, want: []int{400}},
		{name: "unterminated deep nesting", parts: []string{withCL(`{"prompt":"x","extra":` + strings.Repeat("[", 100000))}, want: []int{400}},
		{name: "huge array over max_body_bytes", parts: []string{assistantReq(over)}, want: []int{413}},
		{name: "huge chunked body over max_body_bytes", parts: []string{agentReq("Transfer-Encoding: chunked\r\n", fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(over), over))}, want: []int{413}},
		{name: "invalid utf-8 in a value", parts: []string{withCL("{\"prompt\":\"\xff\xfe\"}")}, want: []int{400}},
		{name: "invalid utf-8 in a key", parts: []string{withCL("{\"\xc0\xaf\":1,\"prompt\":\"x\"}")}, want: []int{400}},
		{name: "utf-8 surrogate", parts: []string{withCL("{\"prompt\":\"\xed\xa0\x80\"}")}, want: []int{400}},
		{name: "nul in a string", parts: []string{withCL("{\"prompt\":\"a\x00b\"}")}, want: []int{400}},
		{name: "nul after the value", parts: []string{withCL("{\"prompt\":\"x\"}\x00")}, want: []int{400}},
		{name: "nul in a header", parts: []string{agentReq("X-A: a\x00b\r\nContent-Length: 14\r\n", `{"prompt":"x"}`)}, want: []int{400}},
		{name: "nul in the path", parts: []string{"POST /v2/agent/p\x00x/job HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer svc_hostile\r\nContent-Type: application/json\r\nContent-Length: 14\r\nConnection: close\r\n\r\n{\"prompt\":\"x\"}"}, want: []int{400, 404}},
		// Go reads a bare LF as a line end (RFC 9112 2.2 allows it): this hides a
		// Transfer-Encoding line; the chunked body never comes, so 408.
		{name: "bare LF hiding a header", parts: []string{agentReq("X-A: a\nTransfer-Encoding: chunked\r\nContent-Length: 14\r\n", `{"prompt":"x"}`)}, want: []int{400, 408}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := len(up.requests())
			r := rawExchange(t, p.public, 6*time.Second, c.gap, bytesOf(c.parts...)...)
			got := r.status()
			ok := false
			for _, w := range c.want {
				ok = ok || got == w
			}
			if !ok {
				t.Errorf("answered %d (closed %t after %v), want one of %v; reply %.300q", got, r.closed, r.after, c.want, r.data)
			}
			if !r.closed {
				t.Errorf("connection still open after %v", r.after)
			}
			if r.after > 3*time.Second {
				t.Errorf("took %v; the server timeouts are 1s", r.after)
			}
			if got == 408 && !strings.Contains(r.data, `"code":"request_timeout"`) {
				t.Errorf("408 without code request_timeout: %.300q", r.data)
			}
			if n := len(up.requests()) - before; n != 0 {
				t.Errorf("%d requests reached the upstream", n)
			}
		})
	}

	// Slowloris: headers a byte at a time, never finished. The connection is closed by
	// server.read_header_timeout (1s).
	t.Run("slowloris", func(t *testing.T) {
		head := "POST /v2/agent/p/job HTTP/1.1\r\nHost: gw\r\nX-Slow: " + strings.Repeat("a", 200)
		var parts []string
		for i := range head {
			parts = append(parts, head[i:i+1])
		}
		r := rawExchange(t, p.public, 6*time.Second, 20*time.Millisecond, bytesOf(parts...)...)
		if !r.closed || r.after > 2500*time.Millisecond {
			t.Fatalf("slowloris connection closed %t after %v (reply %.200q), want closed within ~1s", r.closed, r.after, r.data)
		}
		if code := r.status(); code != 0 && code/100 != 4 {
			t.Fatalf("slowloris answered %d", code)
		}
		t.Logf("slowloris closed after %v (reply %.60q)", r.after, r.data)
	})
	// A body trickled a byte at a time: read_body_timeout bounds the whole body, not each read.
	t.Run("trickled body", func(t *testing.T) {
		body := `{"prompt":"` + strings.Repeat("y", 100) + `"}`
		parts := []string{agentReq(fmt.Sprintf("Content-Length: %d\r\n", len(body)), "")}
		for i := range body {
			parts = append(parts, body[i:i+1])
		}
		before := len(up.requests())
		r := rawExchange(t, p.public, 6*time.Second, 30*time.Millisecond, bytesOf(parts...)...)
		if r.status() != 408 || r.after > 2500*time.Millisecond {
			t.Fatalf("trickled body: %d after %v, want 408 within ~1s; reply %.200q", r.status(), r.after, r.data)
		}
		if len(up.requests()) != before {
			t.Fatal("a trickled body reached the upstream")
		}
	})

	// Big but legal bodies are forwarded byte for byte.
	t.Run("huge arrays within max_body_bytes", func(t *testing.T) {
		for i, body := range []string{within, numbers} {
			if len(body) > 1<<20 {
				t.Fatalf("case %d: body %d bytes over the limit", i, len(body))
			}
			req := assistantReq(body)
			if i == 1 {
				req = withCL(body)
			}
			before := len(up.requests())
			r := rawExchange(t, p.public, 10*time.Second, 0, []byte(req))
			if code := r.status(); code/100 != 2 {
				t.Fatalf("case %d (%d bytes): answered %d: %.300q", i, len(body), code, r.data)
			}
			seen := up.requests()
			if len(seen) != before+1 || !bytes.Equal(seen[len(seen)-1].body, []byte(body)) {
				t.Fatalf("case %d: the upstream did not get the body byte for byte", i)
			}
		}
	})

	// Identical duplicate Content-Length values may be folded into one (RFC 9112 6.3); then
	// the upstream must get one well-formed request with the gateway's own framing.
	t.Run("identical duplicate content-length", func(t *testing.T) {
		before := len(up.requests())
		r := rawExchange(t, p.public, 6*time.Second, 0, []byte(agentReq("Content-Length: 14\r\nContent-Length: 14\r\n", `{"prompt":"x"}`)))
		switch code := r.status(); {
		case code == 400:
		case code == 201:
			seen := up.requests()
			if len(seen) != before+1 || string(seen[len(seen)-1].body) != `{"prompt":"x"}` {
				t.Fatalf("forwarded %d requests, last body %q", len(seen)-before, seen[len(seen)-1].body)
			}
		default:
			t.Fatalf("answered %d: %.200q", code, r.data)
		}
	})

	// Nothing above crashed or wedged the process.
	select {
	case err := <-p.done:
		p.done <- err
		t.Fatalf("the gateway exited: %v\n%s", err, p.out.String())
	default:
	}
	if code, _ := adminGet(t, p, "/healthz", ""); code != 200 {
		t.Fatalf("healthz %d after the hostile input", code)
	}
	if res := send(t, p, "POST", "/v2/agent/after/job", "svc_hostile", `{"prompt":"x"}`); res.StatusCode != 201 {
		t.Fatalf("a normal request after the hostile input: %d", res.StatusCode)
	}
	for _, s := range up.requests() {
		if !json.Valid(s.body) {
			t.Fatalf("the upstream got an invalid body on %s: %.100q", s.path, s.body)
		}
	}
	if strings.Contains(p.out.String(), "panic") {
		t.Fatalf("a panic in the gateway output:\n%s", p.out.String())
	}
}

// Item 8: X-Forwarded-For from a peer outside trusted_proxies is ignored for the per-IP
// limit; from a trusted peer the right-most untrusted address counts.
func TestClientIPSpoofing(t *testing.T) {
	up := newBodyUpstream(t)
	p := startGateway(t, up.URL, fmt.Sprintf(`admin_token: %q
client_ip:
  trusted_proxies: ["127.0.0.2"]
limits:
  assistant_per_ip: {limit: 3, window: hour}
  assistant_per_org: {limit: 0}
  assistant_per_key: {limit: 0}
`, adminToken))
	clientFrom := func(local string) *http.Client {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}}
		return &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DialContext: d.DialContext}}
	}
	ask := func(c *http.Client, xff []string) (int, string) {
		req, _ := http.NewRequest("POST", "http://"+p.public+"/discovery/v1/assistant/acme/message", strings.NewReader(hardAsstBody))
		req.Header.Set("Authorization", "Bearer svc_dsc_spoof")
		req.Header.Set("Content-Type", "application/json")
		for _, v := range xff {
			req.Header.Add("X-Forwarded-For", v)
		}
		res, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := io.ReadAll(res.Body)
		res.Body.Close()
		return res.StatusCode, string(data)
	}
	used := func(ip string) int64 {
		code, body := adminGet(t, p, "/usage/ips/"+ip, adminToken)
		if code != 200 {
			t.Fatalf("usage %s: %d %s", ip, code, body)
		}
		var u struct{ Limits []struct{ Used int64 } }
		_ = json.Unmarshal([]byte(body), &u)
		if len(u.Limits) != 1 {
			t.Fatalf("usage %s: %s", ip, body)
		}
		return u.Limits[0].Used
	}

	// Untrusted peer 127.0.0.1 with a different spoofed chain each time: one counter.
	untrusted := clientFrom("127.0.0.1")
	spoofs := [][]string{
		{"198.51.100.1"}, {"198.51.100.2, 198.51.100.3"}, {"127.0.0.2"}, {"2001:db8::1"},
		{"198.51.100.4", "198.51.100.5"}, {"garbage"}, {"10.0.0.1, 127.0.0.2"}, {""},
	}
	codes := map[int]int{}
	for _, xff := range spoofs {
		code, body := ask(untrusted, xff)
		codes[code]++
		if code == 429 && !strings.Contains(body, `"limit":"assistant_per_ip"`) {
			t.Fatalf("429 from another limit: %s", body)
		}
	}
	if codes[200] != 3 || codes[429] != 5 {
		t.Fatalf("untrusted peer with spoofed X-Forwarded-For: %v, want 3 admitted, 5 denied", codes)
	}
	if n := used("127.0.0.1"); n != 3 {
		t.Fatalf("usage of the peer 127.0.0.1: %d, want 3", n)
	}
	for _, ip := range []string{"198.51.100.1", "198.51.100.2", "198.51.100.3", "2001:db8::1", "127.0.0.2"} {
		if n := used(ip); n != 0 {
			t.Fatalf("spoofed %s counted %d times", ip, n)
		}
	}
	for _, s := range up.requests() {
		if s.xff != "127.0.0.1" {
			t.Fatalf("the upstream got X-Forwarded-For %q from an untrusted peer, want 127.0.0.1 alone", s.xff)
		}
	}

	// Trusted peer 127.0.0.2: the right-most untrusted hop is the client, whatever is left of it.
	trusted := clientFrom("127.0.0.2")
	codes = map[int]int{}
	for i := range 4 {
		code, _ := ask(trusted, []string{fmt.Sprintf("6.6.6.%d, 203.0.113.7", i)})
		codes[code]++
	}
	if codes[200] != 3 || codes[429] != 1 {
		t.Fatalf("trusted peer, client 203.0.113.7 behind varied left-most hops: %v, want 3 admitted, 1 denied", codes)
	}
	if code, _ := ask(trusted, []string{"6.6.6.6", "203.0.113.8, 127.0.0.2"}); code != 200 {
		t.Fatalf("203.0.113.8 behind another trusted hop: %d", code)
	}
	for ip, want := range map[string]int64{"203.0.113.7": 3, "203.0.113.8": 1, "6.6.6.0": 0, "6.6.6.6": 0, "127.0.0.2": 0} {
		if n := used(ip); n != want {
			t.Fatalf("usage %s: %d, want %d", ip, n, want)
		}
	}
	seen := up.requests()
	if last := seen[len(seen)-1].xff; last != "6.6.6.6, 203.0.113.8, 127.0.0.2, 127.0.0.2" {
		t.Fatalf("the upstream got X-Forwarded-For %q from a trusted peer, want the chain extended", last)
	}
}

// Item 10: the admin listener binds loopback by default; the public listener never serves
// the operator endpoints, under any method, credentials or spelling of the path.
func TestAdminNeverPublic(t *testing.T) {
	def := config.Defaults().AdminListen
	host, _, err := net.SplitHostPort(def)
	if err != nil {
		t.Fatal(err)
	}
	if a, err := netip.ParseAddr(host); err != nil || !a.IsLoopback() {
		t.Fatalf("default admin_listen %q is not a loopback address", def)
	}

	upURL, upCount := recordingUpstream(t)
	p := startGateway(t, upURL, fmt.Sprintf("admin_token: %q\n", adminToken))
	paths := []string{
		"/metrics", "/healthz", "/readyz", "/usage/projects/p", "/usage/orgs/o", "/usage/ips/127.0.0.1", "/usage/key",
		"/usage/top", "/usage/top?limit=assistant_per_org", "/ui/", "/ui", "/ui/assets/app.js", "/ui/?partial=1",
		"/debug/pprof/", "/debug/pprof", "/debug/pprof/cmdline", "/debug/pprof/heap", "/debug/pprof/goroutine?debug=2",
		"//metrics", "/metrics/", "/./metrics", "/%6detrics", "/v2/../metrics", "/METRICS", "/metrics;x", "/metrics%00",
		"/discovery/../healthz", "/v2/agent/../../debug/pprof/",
	}
	client := hardClient(5 * time.Second)
	for _, path := range paths {
		for _, method := range []string{"GET", "POST", "HEAD", "OPTIONS"} {
			for _, key := range []string{"", adminToken, "svc_adm"} {
				req, err := http.NewRequest(method, "http://"+p.public+path, strings.NewReader(`{"key":"svc_dsc_x"}`))
				if err != nil {
					t.Fatal(err)
				}
				if key != "" {
					req.Header.Set("Authorization", "Bearer "+key)
				}
				res, err := client.Do(req)
				if err != nil {
					t.Fatalf("%s %s: %v", method, path, err)
				}
				data, _ := io.ReadAll(res.Body)
				res.Body.Close()
				if res.StatusCode/100 == 2 || res.StatusCode/100 == 3 {
					t.Errorf("%s %s (key %t) on the public listener: %d", method, path, key != "", res.StatusCode)
				}
				for _, leak := range []string{"go_goroutines", "gateway_requests_total", `"status":"ok"`, "goroutine profile", "limits", "pprof", "tenants", "Gateway usage", "<html"} {
					if strings.Contains(string(data), leak) {
						t.Errorf("%s %s on the public listener answered %q", method, path, data)
					}
				}
			}
		}
	}
	if n := upCount(); n != 0 {
		t.Fatalf("%d operator requests reached the upstream", n)
	}

	// The binary without admin_listen binds 127.0.0.1:9090; only when that port is free here.
	ln, err := net.Listen("tcp", def)
	if err != nil {
		t.Logf("%s is busy on this machine; the binary's default bind is not started (config default checked above)", def)
		return
	}
	ln.Close()
	pub := freeAddr(t)
	q := &proc{public: pub, admin: def, out: newSyncBuffer(), done: make(chan error, 1)}
	q.cmd = execGateway(writeConfig(t, fmt.Sprintf("listen: %q\nupstream:\n  url: %q\n", pub, upURL)))
	q.cmd.Stdout, q.cmd.Stderr = q.out, q.out
	if err := q.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { q.done <- q.cmd.Wait() }()
	defer func() { _ = q.cmd.Process.Kill(); <-q.done }()
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(q.out.String(), "gateway started") {
		if time.Now().After(deadline) {
			t.Fatalf("no start line:\n%s", q.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	sc := bufio.NewScanner(strings.NewReader(q.out.String()))
	for sc.Scan() {
		var e map[string]any
		if json.Unmarshal(sc.Bytes(), &e) == nil && e["msg"] == "gateway started" {
			if e["admin_listen"] != "127.0.0.1:9090" {
				t.Fatalf("admin_listen logged as %v, want 127.0.0.1:9090", e["admin_listen"])
			}
			return
		}
	}
	t.Fatalf("no gateway started line:\n%s", q.out.String())
}

func execGateway(cfgPath string, args ...string) *exec.Cmd {
	return exec.Command(gatewayBin, append([]string{"-config", cfgPath}, args...)...)
}
