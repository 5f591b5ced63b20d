package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/docsgate/gateway/internal/upstreamtest"
)

// Issue 23, section 3: the gateway against upstreams that break HTTP/1.1 framing or hang up
// in the middle of an answer, on both upstream transports, with what the client sees
// compared.

// seen is what the client saw of one answer.
type seen struct {
	status int    // 0: no HTTP answer
	body   string // what was read
	cut    bool   // the body broke before its end
}

func (s seen) String() string {
	if s.status == 0 {
		return "no answer"
	}
	out := fmt.Sprintf("%d %q", s.status, s.body)
	if s.cut {
		out += " (cut)"
	}
	return out
}

// upstreamCase is one behaviour of the upstream and what the client must see of it. The
// upstream answers the request whose project (or assistant domain) is name with parts.
type upstreamCase struct {
	name   string
	stream bool // sent to the assistant route (stream: true)
	parts  []string
	end    upstreamtest.End // after the parts; "" keeps the connection
	want   seen
	code   string // the gateway's error code, when it answers itself
	// fresh: the pool must send the next request on a new connection (the answer's framing
	// left doubt, or the connection failed).
	fresh bool
}

const (
	okAnswer  = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"id\":\"ok\"}"
	jsonHead  = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
	wrong     = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 14\r\n\r\n{\"id\":\"WRONG\"}"
	streamHdr = "HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nTransfer-Encoding: chunked\r\n\r\n"
)

var desyncCases = []upstreamCase{
	{name: "second-answer-same-write", parts: []string{okAnswer + wrong}, want: seen{200, `{"id":"ok"}`, false}, fresh: true},
	{name: "second-answer-later", parts: []string{okAnswer, upstreamtest.Pause, wrong}, want: seen{200, `{"id":"ok"}`, false}, fresh: true},
	{name: "stray-line", parts: []string{okAnswer + "\r\nstray\r\n"}, want: seen{200, `{"id":"ok"}`, false}, fresh: true},
	{name: "te-and-cl", parts: []string{jsonHead + "Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\nb\r\n{\"id\":\"ok\"}\r\n0\r\n\r\n"},
		want: seen{200, `{"id":"ok"}`, false}, fresh: true},
	{name: "cl-and-te-then-answer", parts: []string{jsonHead + "Content-Length: 60\r\nTransfer-Encoding: chunked\r\n\r\nb\r\n{\"id\":\"ok\"}\r\n0\r\n\r\n" + wrong},
		want: seen{200, `{"id":"ok"}`, false}, fresh: true},
	{name: "two-lengths", parts: []string{jsonHead + "Content-Length: 11\r\nContent-Length: 14\r\n\r\n{\"id\":\"ok\"}WRONG"}, code: "upstream_unavailable", fresh: true},
	// A non-stream answer is read whole (up to 1 MiB) before it is sent: a framing error
	// found in it is a clean 502.
	{name: "bad-chunk-size", parts: []string{jsonHead + "Transfer-Encoding: chunked\r\n\r\nzz\r\n{\"id\":\"ok\"}\r\n0\r\n\r\n"}, code: "upstream_unavailable", fresh: true},
	{name: "bad-chunk-size-later", parts: []string{jsonHead + "Transfer-Encoding: chunked\r\n\r\n7\r\n{\"id\":\"\r\n", upstreamtest.Pause, "4x\r\nok\"}\r\n0\r\n\r\n"}, code: "upstream_unavailable", fresh: true},
	{name: "204-with-body", parts: []string{"HTTP/1.1 204 No Content\r\nContent-Length: 14\r\n\r\n{\"id\":\"WRONG\"}"}, want: seen{204, "", false}, fresh: true},
	{name: "204-then-answer", parts: []string{"HTTP/1.1 204 No Content\r\n\r\n" + wrong}, want: seen{204, "", false}, fresh: true},
	{name: "304-with-body", parts: []string{"HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\ne\r\n{\"id\":\"WRONG\"}\r\n0\r\n\r\n"}, want: seen{304, "", false}, fresh: true},
	{name: "interim-100-103", parts: []string{"HTTP/1.1 100 Continue\r\n\r\n", upstreamtest.Pause, "HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n", okAnswer},
		want: seen{200, `{"id":"ok"}`, false}},
	{name: "interim-with-body", parts: []string{"HTTP/1.1 103 Early Hints\r\nContent-Length: 5\r\n\r\nWRONG" + okAnswer}, code: "upstream_unavailable", fresh: true},
	{name: "unasked-101", parts: []string{"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nWRONG"}, code: "upstream_unavailable", fresh: true},
	{name: "clean", parts: []string{okAnswer}, want: seen{200, `{"id":"ok"}`, false}},
}

var earlyCloseCases = []upstreamCase{
	{name: "close-before-answer", end: upstreamtest.Close, code: "upstream_unavailable", fresh: true},
	{name: "reset-before-answer", end: upstreamtest.Reset, code: "upstream_unavailable", fresh: true},
	{name: "close-in-status-line", parts: []string{"HTTP/1.1 20"}, end: upstreamtest.Close, code: "upstream_unavailable", fresh: true},
	{name: "close-in-headers", parts: []string{jsonHead + "Content-Le"}, end: upstreamtest.Close, code: "upstream_unavailable", fresh: true},
	{name: "reset-in-headers", parts: []string{jsonHead + "Content-Le", upstreamtest.Pause}, end: upstreamtest.Reset, code: "upstream_unavailable", fresh: true},
	{name: "stall-in-headers", parts: []string{jsonHead + "Content-Le"}, end: upstreamtest.Hang, code: "upstream_timeout", fresh: true},
	// A short answer is read whole before the gateway answers: a clean 502.
	{name: "close-in-body", parts: []string{jsonHead + "Content-Length: 20\r\n\r\n{\"id\":\"o"}, end: upstreamtest.Close, code: "upstream_unavailable", fresh: true},
	{name: "reset-in-body", parts: []string{jsonHead + "Content-Length: 20\r\n\r\n{\"id\":\"o", upstreamtest.Pause}, end: upstreamtest.Reset, code: "upstream_unavailable", fresh: true},
	{name: "close-in-chunk", parts: []string{jsonHead + "Transfer-Encoding: chunked\r\n\r\n7\r\n{\"id\":\"\r\n9\r\nok\""}, end: upstreamtest.Close, code: "upstream_unavailable", fresh: true},
	{name: "reset-in-chunk", parts: []string{jsonHead + "Transfer-Encoding: chunked\r\n\r\n7\r\n{\"id\":\"\r\n9\r\nok\"", upstreamtest.Pause}, end: upstreamtest.Reset, code: "upstream_unavailable", fresh: true},
	// Past 1 MiB an answer goes out as it comes: a break after that cuts it, which the
	// client sees.
	// (A close, not a reset: a reset drops what the upstream's kernel has not sent yet.)
	{name: "close-past-1mib", parts: []string{jsonHead + "Transfer-Encoding: chunked\r\n\r\n100001\r\n" + strings.Repeat("a", 1<<20+1) + "\r\n5\r\nab"}, end: upstreamtest.Close,
		want: seen{200, strings.Repeat("a", 1<<20+1) + "ab", true}, fresh: true},
	// A stream that breaks ends cleanly for its client, with every part that came.
	{name: "close-in-stream", stream: true, parts: []string{streamHdr + "7\r\n0:\"hi\"\n\r\n"}, end: upstreamtest.Close, want: seen{200, "0:\"hi\"\n", false}, fresh: true},
	{name: "reset-in-stream", stream: true, parts: []string{streamHdr + "7\r\n0:\"hi\"\n\r\n3\r\n0:\"", upstreamtest.Pause}, end: upstreamtest.Reset, want: seen{200, "0:\"hi\"\n0:\"", false}, fresh: true},
}

// scriptFor answers /v2/agent/{name}/job and /discovery/v1/assistant/{name}/message with the
// case of that name, next-... with 201 and its own name, anything else with okAnswer.
func scriptFor(cases []upstreamCase) upstreamtest.Script {
	return func(path string) ([]string, upstreamtest.End) {
		segs := strings.Split(path, "/")
		name := segs[len(segs)-2]
		for _, c := range cases {
			if c.name == name {
				end := c.end
				if end == "" {
					end = upstreamtest.Keep
				}
				return c.parts, end
			}
		}
		if strings.HasPrefix(name, "next") {
			body := fmt.Sprintf(`{"id":%q}`, name)
			return []string{fmt.Sprintf("HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)}, upstreamtest.Keep
		}
		return []string{okAnswer}, upstreamtest.Keep
	}
}

// runUpstreamCases sends each case through a gateway on each transport, each followed by
// a request that must get its own answer, and compares what the client saw.
func runUpstreamCases(t *testing.T, cases []upstreamCase, timeout time.Duration) {
	type gw struct {
		p  *proc
		up *upstreamtest.Upstream
	}
	gws := map[string]gw{}
	for _, tr := range transports {
		up := upstreamtest.Start(t, scriptFor(cases))
		p := startGatewayRaw(t, fmt.Sprintf("upstream:\n  url: %q\n  transport: %s\n  timeout: %v\n", up.URL, tr, timeout))
		gws[tr] = gw{p, up}
	}
	client := hardClient(10 * time.Second)
	baseline := map[string]int{}
	for tr, g := range gws {
		if r := hardDo(client, "POST", "http://"+g.p.public+"/v2/agent/warm/job", "svc_up", hardAgentBody, nil); r.status != 200 {
			t.Fatalf("%s: warm-up %d %q", tr, r.status, r.body)
		}
		baseline[tr] = goroutines(t, g.p)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := map[string]seen{}
			for _, tr := range transports {
				g := gws[tr]
				url, key, body := "http://"+g.p.public+"/v2/agent/"+c.name+"/job", "svc_up", hardAgentBody
				if c.stream {
					url, key, body = "http://"+g.p.public+"/discovery/v1/assistant/"+c.name+"/message", "svc_dsc_up", hardAsstBody
				}
				r := hardDo(client, "POST", url, key, body, nil)
				s := seen{status: r.status, body: r.body, cut: r.err != nil}
				if c.code != "" {
					// The gateway's own answer: its code is what counts.
					want := map[string]int{"upstream_unavailable": 502, "upstream_timeout": 504}[c.code]
					if r.status != want || !strings.Contains(r.body, `"code":"`+c.code+`"`) {
						t.Errorf("%s: %v, want %d %s", tr, s, want, c.code)
					}
					s.body = c.code
				} else if s != c.want {
					t.Errorf("%s: %v, want %v", tr, s, c.want)
				}
				if r.took > timeout+2*time.Second {
					t.Errorf("%s: answered after %v (upstream.timeout %v)", tr, r.took, timeout)
				}
				got[tr] = s
				// The next request comes a little later, as real ones do: bytes the upstream
				// sends after an answer are there by then. (Bytes that come after the next
				// request went out cannot be told from its answer by any HTTP/1.1 client.)
				time.Sleep(100 * time.Millisecond)
				next := "next-" + c.name
				if r := hardDo(client, "POST", "http://"+g.p.public+"/v2/agent/"+next+"/job", "svc_up", hardAgentBody, nil); r.status != 201 || r.body != `{"id":"`+next+`"}` {
					t.Errorf("%s: the next request got %d %q, want its own answer", tr, r.status, r.body)
				}
				var caseConn, nextConn, delivered int
				for _, q := range g.up.Requests() {
					switch {
					case strings.Contains(q.Path, "/"+c.name+"/"):
						caseConn = q.Conn
						delivered++
					case strings.Contains(q.Path, "/"+next+"/"):
						nextConn = q.Conn
					}
				}
				if delivered != 1 {
					t.Errorf("%s: the request reached the upstream %d times, want once", tr, delivered)
				}
				if tr == "pool" && (nextConn != caseConn) != c.fresh {
					t.Errorf("pool: the next request on a new connection %t, want %t", nextConn != caseConn, c.fresh)
				}
			}
			if got["pool"] != got["standard"] {
				t.Errorf("the client saw %v on the pool, %v on net/http's Transport", got["pool"], got["standard"])
			}
		})
	}
	// Nothing left behind: the upstream sees at most the one idle connection each gateway
	// keeps, and the gateways' goroutines come back to where they were.
	client.CloseIdleConnections()
	for tr, g := range gws {
		deadline := time.Now().Add(5 * time.Second)
		for {
			open, n := g.up.Open(), goroutines(t, g.p)
			if open <= 1 && n <= baseline[tr]+2 {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("%s: %d upstream connections open (want at most the idle one), %d goroutines (%d after the warm-up)", tr, open, n, baseline[tr])
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// Bytes after an answer, conflicting lengths, a bad chunk size, a 204 or 304 with a body,
// interim and unasked 101 answers: the right bytes or 502, never another request's answer,
// and the pool never reuses a connection in doubt.
func TestUpstreamDesync(t *testing.T) {
	t.Parallel()
	runUpstreamCases(t, desyncCases, 30*time.Second) // upstream.timeout's default
}

// Upstreams closing or resetting in the middle of the headers or the body: 502 (or a cut
// answer, a cleanly ended stream), never a hang past upstream.timeout, no connection or
// goroutine left.
func TestUpstreamEarlyCloseAndResets(t *testing.T) {
	runUpstreamCases(t, earlyCloseCases, time.Second)
}
