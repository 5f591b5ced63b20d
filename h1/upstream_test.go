package h1

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/docsgate/gateway/internal/upstreamtest"
)

// Issue 23, section 3: upstreams that behave like real servers, good and bad, each case run
// on the pool and on net/http's Transport with the outcome compared.

// script answers /case with parts and end, anything else with okNext on a kept connection.
func script(parts []string, end upstreamtest.End) upstreamtest.Script {
	return func(path string) ([]string, upstreamtest.End) {
		if path == "/case" {
			return parts, end
		}
		return []string{okNext}, upstreamtest.Keep
	}
}

// allClosed waits until every connection the upstream accepted is closed: the client leaked
// none.
func allClosed(t *testing.T, up *upstreamtest.Upstream) {
	t.Helper()
	waitFor(t, "the upstream's connections to close", func() bool { return up.Open() == 0 })
}

// outcome is what a client of the transport sees of one exchange.
type outcome struct {
	status  int    // 0: the round trip failed
	timeout bool   // it failed with a timeout
	body    string // what was read of the body
	bodyErr bool   // the body broke before its end
}

func (o outcome) String() string {
	if o.status == 0 && o.timeout {
		return "timeout"
	}
	if o.status == 0 {
		return "error"
	}
	s := fmt.Sprintf("%d %q", o.status, o.body)
	if o.bodyErr {
		s += " (cut)"
	}
	return s
}

func exchangeOnce(tr http.RoundTripper, method, url string) outcome {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second) // the net under a hang
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, method, url, strings.NewReader(`{"x":1}`))
	res, err := tr.RoundTrip(req)
	if err != nil {
		return outcome{timeout: isTimeout(err)}
	}
	b, err := io.ReadAll(res.Body)
	res.Body.Close()
	return outcome{status: res.StatusCode, body: string(b), bodyErr: err != nil}
}

// bothTransports are the two upstream transports the gateway offers, configured alike.
func bothTransports(headerTimeout time.Duration) map[string]interface {
	http.RoundTripper
	CloseIdleConnections()
} {
	return map[string]interface {
		http.RoundTripper
		CloseIdleConnections()
	}{
		"pool":     New(Options{ResponseHeaderTimeout: headerTimeout}),
		"standard": &http.Transport{ResponseHeaderTimeout: headerTimeout, DisableCompression: true},
	}
}

const okNext = "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nnext"

// An answer with bytes after its end, conflicting lengths, a bad chunk size, a 204 or 304
// with a body, interim answers: the right bytes or an error, never another request's
// answer; the request after it gets its own answer, and the pool takes a new connection for
// it whenever the first answer's framing left any doubt.
func TestDesyncBothTransports(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	cases := []struct {
		name   string
		method string
		parts  []string
		want   outcome
		reuse  bool // the pool sends the next request on the same connection
		// poolOnly: net/http's Transport hands an unasked 101 to its caller with the
		// connection as its body (the gateway's reverse proxy then answers 502, which the
		// binary test checks on both transports).
		poolOnly bool
	}{
		{name: "second answer in the same write", parts: []string{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" +
			"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nWRONG"}, want: outcome{status: 200, body: "ok"}},
		{name: "second answer later", parts: []string{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", upstreamtest.Pause,
			"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nWRONG"}, want: outcome{status: 200, body: "ok"}},
		{name: "stray line", parts: []string{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok\r\nstray\r\n"}, want: outcome{status: 200, body: "ok"}},
		{name: "stray line after a chunked answer", parts: []string{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n", upstreamtest.Pause, "\r\n"},
			want: outcome{status: 200, body: "ok"}},
		{name: "Transfer-Encoding and Content-Length", parts: []string{"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"},
			want: outcome{status: 200, body: "hello"}},
		{name: "Content-Length and Transfer-Encoding, lower case", parts: []string{"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 40\r\n\r\n5\r\nhello\r\n0\r\n\r\n"},
			want: outcome{status: 200, body: "hello"}},
		{name: "Transfer-Encoding and Content-Length, bare line feeds", parts: []string{"HTTP/1.1 200 OK\nContent-Length: 3\nTransfer-Encoding: chunked\n\n5\r\nhello\r\n0\r\n\r\n"},
			want: outcome{status: 200, body: "hello"}},
		{name: "chunked, a head too large to check", parts: []string{"HTTP/1.1 200 OK\r\nX-Big: " + strings.Repeat("b", 5000) + "\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"},
			want: outcome{status: 200, body: "hello"}},
		{name: "chunked with a trailer", parts: []string{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-Sum: 1\r\n\r\n"},
			want: outcome{status: 200, body: "hello"}, reuse: true},
		{name: "two different Content-Lengths", parts: []string{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 7\r\n\r\nokWRONG"}},
		{name: "two equal Content-Lengths", parts: []string{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nok"},
			want: outcome{status: 200, body: "ok"}, reuse: true},
		{name: "bad chunk size", parts: []string{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n"},
			want: outcome{status: 200, bodyErr: true}},
		{name: "204 with a body", parts: []string{"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nWRONG"}, want: outcome{status: 204}},
		{name: "204 with an answer after it", parts: []string{"HTTP/1.1 204 No Content\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nWRONG"}, want: outcome{status: 204}},
		{name: "304 with a chunked body", parts: []string{"HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nWRONG\r\n0\r\n\r\n"}, want: outcome{status: 304}},
		{name: "HEAD answered with a body", method: http.MethodHead, parts: []string{"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nWRONG"}, want: outcome{status: 200}},
		{name: "interim 100 and 103", parts: []string{"HTTP/1.1 100 Continue\r\n\r\n", upstreamtest.Pause, "HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n",
			"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok"}, want: outcome{status: 201, body: "ok"}, reuse: true},
		{name: "interim answer with a body", parts: []string{"HTTP/1.1 103 Early Hints\r\nContent-Length: 5\r\n\r\nWRONGHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"}},
		{name: "101 unasked", parts: []string{"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nWRONG"}, poolOnly: true},
		{name: "whole and clean", parts: []string{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"}, want: outcome{status: 200, body: "ok"}, reuse: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			results := map[string]outcome{}
			for name, tr := range bothTransports(time.Second) {
				if c.poolOnly && name != "pool" {
					continue
				}
				up := upstreamtest.Start(t, script(c.parts, upstreamtest.Keep))
				method := c.method
				if method == "" {
					method = http.MethodPost
				}
				got := exchangeOnce(tr, method, up.URL+"/case")
				results[name] = got
				if got != c.want {
					t.Errorf("%s: got %v, want %v", name, got, c.want)
				}
				time.Sleep(60 * time.Millisecond) // past any late bytes: the next request comes later
				if next := exchangeOnce(tr, http.MethodPost, up.URL+"/next"); next != (outcome{status: 200, body: "next"}) {
					t.Errorf("%s: the next request got %v, want its own 200 next", name, next)
				}
				seen := up.Requests()
				if len(seen) != 2 {
					t.Fatalf("%s: upstream saw %v, want /case and /next once each", name, seen)
				}
				if reused := seen[1].Conn == seen[0].Conn; name == "pool" && reused != c.reuse {
					t.Errorf("pool: next request on the same connection %t, want %t", reused, c.reuse)
				}
				tr.CloseIdleConnections()
				allClosed(t, up)
			}
			if !c.poolOnly && results["pool"] != results["standard"] {
				t.Errorf("pool %v, standard %v", results["pool"], results["standard"])
			}
		})
	}
}

// An upstream that closes or resets in the middle of the headers or the body, or before any
// answer: an error or a cut body, never a hang past the header timeout, never a leaked
// connection or goroutine.
func TestEarlyCloseAndResetsBothTransports(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	const headerTimeout = 500 * time.Millisecond
	head := "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 20\r\n\r\n"
	cases := []struct {
		name  string
		parts []string
		end   upstreamtest.End
		want  outcome
	}{
		{name: "close before any answer", end: upstreamtest.Close},
		{name: "reset before any answer", end: upstreamtest.Reset},
		{name: "close in the status line", parts: []string{"HTTP/1.1 20"}, end: upstreamtest.Close},
		{name: "close in the headers", parts: []string{"HTTP/1.1 200 OK\r\nContent-Le"}, end: upstreamtest.Close},
		{name: "reset in the headers", parts: []string{"HTTP/1.1 200 OK\r\nContent-Le", upstreamtest.Pause}, end: upstreamtest.Reset},
		{name: "stall in the headers", parts: []string{"HTTP/1.1 200 OK\r\nContent-Le"}, end: upstreamtest.Hang, want: outcome{timeout: true}},
		{name: "stall after the status line", parts: []string{"HTTP/1.1 200 OK\r\n"}, end: upstreamtest.Hang, want: outcome{timeout: true}},
		{name: "close in the body", parts: []string{head, `{"id":"j"`}, end: upstreamtest.Close, want: outcome{status: 200, body: `{"id":"j"`, bodyErr: true}},
		{name: "reset in the body", parts: []string{head, `{"id":"j"`, upstreamtest.Pause}, end: upstreamtest.Reset, want: outcome{status: 200, body: `{"id":"j"`, bodyErr: true}},
		{name: "close in a chunk", parts: []string{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\n{\"id\":\"j\"\r\n14\r\n{\"a\""}, end: upstreamtest.Close,
			want: outcome{status: 200, body: `{"id":"j"{"a"`, bodyErr: true}},
		{name: "reset in a chunk", parts: []string{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\n{\"id\":\"j\"\r\n14\r\n{\"a\"", upstreamtest.Pause}, end: upstreamtest.Reset,
			want: outcome{status: 200, body: `{"id":"j"{"a"`, bodyErr: true}},
		{name: "close before the last chunk", parts: []string{"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\n{\"id\":\"j\"\r\n"}, end: upstreamtest.Close,
			want: outcome{status: 200, body: `{"id":"j"`, bodyErr: true}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			results := map[string]outcome{}
			for name, tr := range bothTransports(headerTimeout) {
				up := upstreamtest.Start(t, script(c.parts, c.end))
				// A reused connection first, as in production.
				if got := exchangeOnce(tr, http.MethodPost, up.URL+"/warm"); got != (outcome{status: 200, body: "next"}) {
					t.Fatalf("%s: warm-up %v", name, got)
				}
				start := time.Now()
				got := exchangeOnce(tr, http.MethodPost, up.URL+"/case")
				took := time.Since(start)
				results[name] = got
				if got != c.want {
					t.Errorf("%s: got %v, want %v", name, got, c.want)
				}
				if took > headerTimeout+time.Second {
					t.Errorf("%s: took %v, past the header timeout of %v", name, took, headerTimeout)
				}
				if next := exchangeOnce(tr, http.MethodPost, up.URL+"/next"); next != (outcome{status: 200, body: "next"}) {
					t.Errorf("%s: the next request got %v", name, next)
				}
				n := 0
				for _, r := range up.Requests() {
					if r.Path == "/case" {
						n++
					}
				}
				if n != 1 {
					t.Errorf("%s: /case reached the upstream %d times, want once (a request that left is never sent again)", name, n)
				}
				tr.CloseIdleConnections()
				allClosed(t, up)
			}
			if results["pool"] != results["standard"] {
				t.Errorf("pool %v, standard %v", results["pool"], results["standard"])
			}
		})
	}
}

// The pool learns the upstream's idle timeout: once it found a connection closed after
// being idle 1.2 s, a connection idle 950 ms (still open at the upstream, whose timeout is
// 1 s) is no longer reused, so no request is written in the upstream's closing moment.
func TestPoolLearnsTheUpstreamsIdleClock(t *testing.T) {
	srv := newServer(t, echo, func(s *http.Server) { s.IdleTimeout = time.Second })
	tr := newTransport(t, Options{}) // the default idle timeout, far above the upstream's
	step := func(id string, after time.Duration, conns int64, why string) {
		t.Helper()
		time.Sleep(after)
		if status, body := do(t, tr, srv.URL, id, "x"); status != 200 || body != id+":x" {
			t.Fatalf("request %s: %d %q", id, status, body)
		}
		if n := srv.opened.Load(); n != conns {
			t.Fatalf("request %s: %d connections, want %d: %s", id, n, conns, why)
		}
	}
	step("1", 0, 1, "")
	step("2", 500*time.Millisecond, 1, "a connection idle 500 ms is reused")
	step("3", 1200*time.Millisecond, 2, "one idle 1.2 s was closed by the upstream")
	step("4", 950*time.Millisecond, 3, "one idle 950 ms is near the edge the pool has seen")
	step("5", 400*time.Millisecond, 3, "one idle 400 ms is well inside it")
}

func TestIdleGuess(t *testing.T) {
	const configured = 50 * time.Second
	t0 := time.Unix(1000, 0)
	var g idleGuess
	if l := g.limit(t0, configured); l != configured {
		t.Fatalf("nothing seen: limit %v", l)
	}
	g.answered(t0, 2*time.Second)
	g.closedAfter(t0, time.Second) // sooner than one that answered: a restart
	g.closedAfter(t0, 50*time.Millisecond)
	if l := g.limit(t0, configured); l != configured {
		t.Fatalf("after restarts only: limit %v", l)
	}
	g.closedAfter(t0.Add(time.Second), 5*time.Second)
	g.closedAfter(t0.Add(2*time.Second), 8*time.Second) // the shortest counts
	if l := g.limit(t0.Add(3*time.Second), configured); l != 3750*time.Millisecond {
		t.Fatalf("after a close at 5 s: limit %v, want 3.75 s", l)
	}
	if l := g.limit(t0.Add(3*time.Second), 2*time.Second); l != 2*time.Second {
		t.Fatalf("a configured timeout below the guess: limit %v", l)
	}
	if l := g.limit(t0.Add(guessLife), configured); l != configured {
		t.Fatalf("after %v: limit %v, want the guess forgotten", guessLife, l)
	}
	var h idleGuess
	h.closedAfter(t0, 80*time.Millisecond) // under the floor
	if l := h.limit(t0, configured); l != configured {
		t.Fatalf("a close after 80 ms: limit %v", l)
	}
}

// resetOnWrite is a TCP connection that, on the nth exchange's first write, has the
// upstream reset it and waits for the reset to arrive before writing: the write then fails
// with nothing written, as when the upstream resets a connection just after the pool checked
// it. The wrapped connection keeps its socket, so the pool's liveness check runs as usual.
type resetOnWrite struct {
	*net.TCPConn
	reset func() // has the upstream reset this connection, and returns once it has
	armed *bool
}

func (c *resetOnWrite) Write(p []byte) (int, error) {
	if *c.armed {
		*c.armed = false
		c.reset()
	}
	return c.TCPConn.Write(p)
}

// A request whose connection fails the first write with nothing written goes out again on
// another connection, exactly once; one whose connection fails after the request left is
// never sent again.
func TestSentAgainOnlyWhenNothingLeft(t *testing.T) {
	ignore := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, ignore) }) // after the upstream's and the pool's cleanups
	var mu sync.Mutex
	up := upstreamtest.Start(t, func(path string) ([]string, upstreamtest.End) {
		if path == "/gone" {
			return nil, upstreamtest.Reset // read whole, then reset: it left, and may have been acted on
		}
		return []string{"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"}, upstreamtest.Keep
	})
	armed := false
	var dials int
	tr := newTransport(t, Options{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		nc, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		mu.Lock()
		dials++
		mu.Unlock()
		tc := nc.(*net.TCPConn)
		return &resetOnWrite{TCPConn: tc, armed: &armed, reset: func() {
			local := tc.LocalAddr().String()
			waitFor(t, "the upstream to see the connection", func() bool { return up.HasConnFrom(local) })
			up.ResetConnFrom(local)
			probe := newProber(tc)
			waitFor(t, "the reset to arrive", func() bool { return probe.check() == idleClosed })
		}}, nil
	}})
	if got := exchangeOnce(tr, http.MethodPost, up.URL+"/a"); got != (outcome{status: 200, body: "ok"}) {
		t.Fatalf("first request: %v", got)
	}
	armed = true
	if got := exchangeOnce(tr, http.MethodPost, up.URL+"/b"); got != (outcome{status: 200, body: "ok"}) {
		t.Fatalf("a request whose connection was reset before it was written: %v, want it sent on another connection", got)
	}
	if got := exchangeOnce(tr, http.MethodPost, up.URL+"/gone"); got.status != 0 {
		t.Fatalf("a request reset after it was read: %v, want an error", got)
	}
	count := map[string]int{}
	for _, r := range up.Requests() {
		count[r.Path]++
	}
	if count["/a"] != 1 || count["/b"] != 1 || count["/gone"] != 1 {
		t.Fatalf("deliveries %v, want each request once", count)
	}
	if dials != 2 {
		t.Fatalf("%d connections dialled, want 2 (the second for /b after the first was reset)", dials)
	}
	tr.CloseIdleConnections()
	allClosed(t, up)
}

// Bytes an upstream sends unasked on an idle connection, left over from an exchange out of
// step, say nothing of how long it keeps idle connections: the pool drops that connection,
// and goes on reusing the others however long they were idle. A 408 says the upstream's idle
// timeout ran out, and the pool learns from it as from a close.
func TestPoolLearnsNothingFromStrayBytes(t *testing.T) {
	for _, c := range []struct {
		name, unasked string
		learns        bool
	}{
		{"a second answer", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nno", false},
		{"a stray line", "\r\nstray\r\n", false},
		{"an answer of another version", "HTTP/1.0 200 OK\r\n\r\n", false},
		{"a 408", "HTTP/1.1 408 Request Timeout\r\nConnection: close\r\n\r\n", true},
		{"a 408 of HTTP/1.0", "HTTP/1.0 408 Request Timeout\r\n\r\n", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			conns := make(chan net.Conn, 4)
			var opened atomic.Int64
			url := rawServer(t, func(nc net.Conn, br *bufio.Reader) {
				opened.Add(1)
				conns <- nc
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.Copy(io.Discard, req.Body)
					io.WriteString(nc, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
				}
			})
			tr := newTransport(t, Options{})

			if status, _ := do(t, tr, url, "1", "a"); status != 200 {
				t.Fatal(status)
			}
			first := <-conns
			io.WriteString(first, c.unasked)
			const idle = 300 * time.Millisecond
			time.Sleep(idle)
			if status, body := do(t, tr, url, "2", "b"); status != 200 || body != "ok" || opened.Load() != 2 {
				t.Fatalf("after %q on the idle connection: %d %q on %d connections, want 200 on a second one", c.unasked, status, body, opened.Load())
			}
			tr.mu.Lock()
			learned := tr.hosts[strings.TrimPrefix(url, "http://")].guess.closed
			tr.mu.Unlock()
			if c.learns != (learned != 0) || c.learns && learned < idle {
				t.Fatalf("the pool's guess of the upstream's idle timeout: %v, want it learned %t (at least %v)", learned, c.learns, idle)
			}
			if c.learns {
				return
			}
			// Idle less than the first one was but more than three quarters of it: had the
			// pool taken the stray bytes for the upstream's idle timeout, it would dial.
			time.Sleep(idle * 5 / 6)
			if status, _ := do(t, tr, url, "3", "c"); status != 200 || opened.Load() != 2 {
				t.Fatalf("a connection idle %v after stray bytes on another: %d on %d connections, want it reused", idle*5/6, status, opened.Load())
			}
		})
	}
}

func TestUnaskedBytes(t *testing.T) {
	for in, want := range map[string]idleState{
		"HTTP/1.1 408 Request Timeout": idleClosed,
		"HTTP/1.0 408 ":                idleClosed,
		"HTTP/1.1 408":                 idleClosed,
		"HTTP/1.1 40":                  idleOutOfStep, // too short to tell
		"HTTP/1.1 200 OK":              idleOutOfStep,
		"HTTP/2.0 408 x":               idleOutOfStep,
		"\r\nstray":                    idleOutOfStep,
		"":                             idleOutOfStep,
	} {
		if got := unasked([]byte(in)); got != want {
			t.Errorf("%q: %v, want %v", in, got, want)
		}
	}
}
