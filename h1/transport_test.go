package h1

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/docsgate/gateway/internal/upstreamtest"
)

// server is a real HTTP server that counts the connections it accepted and closed.
type server struct {
	*httptest.Server
	opened, closed atomic.Int64
}

func newServer(t *testing.T, h http.HandlerFunc, configure ...func(*http.Server)) *server {
	t.Helper()
	s := &server{}
	s.Server = httptest.NewUnstartedServer(h)
	s.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			s.opened.Add(1)
		case http.StateClosed, http.StateHijacked:
			s.closed.Add(1)
		}
	}
	for _, f := range configure {
		f(s.Config)
	}
	s.Start()
	t.Cleanup(s.Close)
	return s
}

// echo answers with the request's X-Id and body, so a mixed-up exchange shows.
func echo(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "text/plain")
	fmt.Fprintf(w, "%s:%s", r.Header.Get("X-Id"), b)
}

func newTransport(t *testing.T, o Options) *Transport {
	t.Helper()
	tr := New(o)
	t.Cleanup(tr.Close)
	return tr
}

// do sends one POST through tr and returns the status and the body read whole.
func do(t *testing.T, tr http.RoundTripper, url, id, body string) (int, string) {
	t.Helper()
	res, err := roundTrip(context.Background(), tr, url, id, body)
	if err != nil {
		t.Fatalf("request %s: %v", id, err)
	}
	b, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		t.Fatalf("request %s: body: %v", id, err)
	}
	return res.StatusCode, string(b)
}

func roundTrip(ctx context.Context, tr http.RoundTripper, url, id, body string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("X-Id", id)
	return tr.RoundTrip(req)
}

func TestKeepAliveReusesOneConnection(t *testing.T) {
	srv := newServer(t, echo)
	tr := newTransport(t, Options{})
	for i := range 50 {
		id := strconv.Itoa(i)
		if status, body := do(t, tr, srv.URL+"/x", id, "body-"+id); status != 200 || body != id+":body-"+id {
			t.Fatalf("request %d: %d %q", i, status, body)
		}
	}
	if n := srv.opened.Load(); n != 1 {
		t.Fatalf("50 sequential requests opened %d connections, want 1", n)
	}
}

// Concurrent exchanges each get their own answer (run with -race).
func TestConcurrentExchanges(t *testing.T) {
	srv := newServer(t, echo)
	tr := newTransport(t, Options{MaxIdleConns: 8})
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for g := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 40 {
				id := fmt.Sprintf("%d-%d", g, i)
				res, err := roundTrip(context.Background(), tr, srv.URL, id, "b"+id)
				if err != nil {
					errs <- err
					return
				}
				b, err := io.ReadAll(res.Body)
				res.Body.Close()
				if err != nil || string(b) != id+":b"+id {
					errs <- fmt.Errorf("request %s: %q, %v", id, b, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	tr.mu.Lock()
	idle := 0
	for _, h := range tr.hosts {
		idle += len(h.idle)
	}
	tr.mu.Unlock()
	if idle > 8 {
		t.Fatalf("%d idle connections kept, max_idle_conns is 8", idle)
	}
}

// An idle connection the upstream closed (its keep-alive timeout) is noticed before a request
// is written to it: the request goes out on a new connection and succeeds.
func TestIdleConnectionClosedByUpstream(t *testing.T) {
	srv := newServer(t, echo, func(s *http.Server) { s.IdleTimeout = 50 * time.Millisecond })
	tr := newTransport(t, Options{})
	if status, _ := do(t, tr, srv.URL, "1", "a"); status != 200 {
		t.Fatal(status)
	}
	waitFor(t, "the upstream closing the idle connection", func() bool { return srv.closed.Load() == 1 })
	for i := range 3 {
		if status, body := do(t, tr, srv.URL, "2", "b"); status != 200 || body != "2:b" {
			t.Fatalf("request %d after the upstream closed the idle connection: %d %q", i, status, body)
		}
	}
	if n := srv.opened.Load(); n != 2 {
		t.Fatalf("%d connections opened, want 2", n)
	}
}

// An idle connection on which the upstream sent something unasked (here a 408 before closing,
// as some servers do) is not used either.
func TestIdleConnectionWithUnaskedData(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	serveOne := func(c net.Conn) *bufio.Reader {
		br := bufio.NewReader(c)
		req, err := http.ReadRequest(br)
		if err != nil {
			t.Error(err)
			return br
		}
		io.Copy(io.Discard, req.Body)
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		return br
	}
	tr := newTransport(t, Options{})
	url := "http://" + ln.Addr().String()
	done := make(chan struct{})
	go func() { do(t, tr, url, "1", "a"); close(done) }()
	first := <-accepted
	defer first.Close()
	serveOne(first)
	<-done
	// The connection is idle in the pool; the server now writes on it unasked.
	io.WriteString(first, "HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
	time.Sleep(50 * time.Millisecond)
	go func() {
		c := <-accepted
		defer c.Close()
		serveOne(c)
	}()
	if status, body := do(t, tr, url, "2", "b"); status != 200 || body != "ok" {
		t.Fatalf("got %d %q, want the new connection's 200", status, body)
	}
}

func TestConnectionCloseIsNotReused(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		echo(w, r)
	})
	tr := newTransport(t, Options{})
	for i := range 3 {
		if status, _ := do(t, tr, srv.URL, strconv.Itoa(i), "x"); status != 200 {
			t.Fatal(status)
		}
	}
	if n := srv.opened.Load(); n != 3 {
		t.Fatalf("%d connections for 3 answers with Connection: close, want 3", n)
	}
}

// A body closed before its end closes its connection: the next exchange must not read the
// rest of it as its own answer.
func TestBodyClosedEarlyIsNotReused(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, strings.Repeat(r.Header.Get("X-Id"), 100))
	})
	tr := newTransport(t, Options{})
	res, err := roundTrip(context.Background(), tr, srv.URL, "a", "")
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 10)
	if _, err := io.ReadFull(res.Body, buf); err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if status, body := do(t, tr, srv.URL, "b", ""); status != 200 || body != strings.Repeat("b", 100) {
		t.Fatalf("after a body closed early: %d %q", status, body)
	}
	if n := srv.opened.Load(); n != 2 {
		t.Fatalf("%d connections, want 2 (the first closed with its body)", n)
	}
}

func TestResponseHeaderTimeout(t *testing.T) {
	release := make(chan struct{})
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	})
	defer close(release)
	tr := newTransport(t, Options{ResponseHeaderTimeout: 100 * time.Millisecond})
	start := time.Now()
	_, err := roundTrip(context.Background(), tr, srv.URL, "1", "x")
	elapsed := time.Since(start)
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("got %v, want a timeout error", err)
	}
	if elapsed < 100*time.Millisecond || elapsed > 2*time.Second {
		t.Fatalf("timed out after %v, want about 100ms", elapsed)
	}
}

// The header timeout does not cut a body that takes longer (a stream).
func TestSlowBodyOutlivesHeaderTimeout(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		time.Sleep(300 * time.Millisecond)
		io.WriteString(w, "late")
	})
	tr := newTransport(t, Options{ResponseHeaderTimeout: 100 * time.Millisecond})
	if status, body := do(t, tr, srv.URL, "1", ""); status != 200 || body != "late" {
		t.Fatalf("got %d %q", status, body)
	}
}

func TestCancelWhileAwaitingHeaders(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(3 * time.Second): // answers late, so a missed cancellation fails
		case <-r.Context().Done():
		}
	})
	tr := newTransport(t, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	_, err := roundTrip(ctx, tr, srv.URL, "1", "x")
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("cancellation took %v", d)
	}
}

// A stream's parts arrive as the upstream sends them, and cancelling the request ends a
// body that is waiting for the next part.
func TestStreamedBodyUnbufferedAndCancellable(t *testing.T) {
	next := make(chan struct{})
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "part1\n")
		w.(http.Flusher).Flush()
		select {
		case <-next:
			io.WriteString(w, "part2\n")
		case <-time.After(3 * time.Second): // ends late, so a missed cancellation fails
		case <-r.Context().Done():
		}
	})
	defer close(next)
	tr := newTransport(t, Options{ResponseHeaderTimeout: time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	res, err := roundTrip(ctx, tr, srv.URL, "1", "")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	br := bufio.NewReader(res.Body)
	line, err := br.ReadString('\n')
	if err != nil || line != "part1\n" {
		t.Fatalf("first part: %q %v (it must arrive before the upstream sends the second)", line, err)
	}
	time.AfterFunc(100*time.Millisecond, cancel)
	start := time.Now()
	if _, err := br.ReadString('\n'); err == nil {
		t.Fatal("read the second part after cancelling")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("the body read returned %v after cancelling", d)
	}
}

// Interim 1xx answers are skipped; the final answer is returned.
func TestInterimResponsesSkipped(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		req, err := http.ReadRequest(bufio.NewReader(c))
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body)
		io.WriteString(c, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"+
			"HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok")
		time.Sleep(100 * time.Millisecond)
	}()
	tr := newTransport(t, Options{})
	if status, body := do(t, tr, "http://"+ln.Addr().String(), "1", "x"); status != 201 || body != "ok" {
		t.Fatalf("got %d %q, want 201 ok", status, body)
	}
}

func TestIdleConnectionsSweptAndCapped(t *testing.T) {
	release := make(chan struct{})
	var entered sync.WaitGroup
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		entered.Done()
		<-release
		io.WriteString(w, "ok")
	})
	tr := newTransport(t, Options{MaxIdleConns: 2, IdleConnTimeout: 200 * time.Millisecond})
	entered.Add(5)
	var wg sync.WaitGroup
	for i := range 5 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			do(t, tr, srv.URL, strconv.Itoa(i), "")
		}()
	}
	entered.Wait() // five connections in use at once
	close(release)
	wg.Wait()
	waitFor(t, "three connections past max_idle_conns closed", func() bool { return srv.closed.Load() == 3 })
	waitFor(t, "the two idle ones closed after the idle timeout", func() bool { return srv.closed.Load() == 5 })
}

// https is net/http's Transport's job (the gateway picks it for https upstreams): refused.
func TestHTTPSRefused(t *testing.T) {
	tr := newTransport(t, Options{})
	b := &closeRecorder{Reader: strings.NewReader("x")}
	req, _ := http.NewRequest(http.MethodPost, "https://127.0.0.1:1/", b)
	if _, err := tr.RoundTrip(req); err == nil || !strings.Contains(err.Error(), "http:// only") {
		t.Fatalf("got %v, want an error naming http:// only", err)
	}
	if !b.closed.Load() {
		t.Fatal("the request body was not closed")
	}
}

// closeRecorder is a request body that records its Close.
type closeRecorder struct {
	io.Reader
	closed atomic.Bool
}

func (c *closeRecorder) Close() error { c.closed.Store(true); return nil }

func TestRequestBodyClosed(t *testing.T) {
	srv := newServer(t, echo)
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	refused := "http://" + ln.Addr().String()
	ln.Close() // nothing listens there now
	tr := newTransport(t, Options{})
	for _, url := range []string{srv.URL, refused} {
		b := &closeRecorder{Reader: strings.NewReader("x")}
		req, _ := http.NewRequest(http.MethodPost, url, b)
		res, err := tr.RoundTrip(req)
		if err == nil {
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
		} else if url == srv.URL {
			t.Fatal(err)
		}
		if !b.closed.Load() {
			t.Fatalf("%s: the request body was not closed", url)
		}
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// rawServer runs serve on every connection accepted on 127.0.0.1, each bounded to 5 s and
// closed when serve returns; it stops with the test.
func rawServer(t testing.TB, serve func(c net.Conn, br *bufio.Reader)) string {
	t.Helper()
	return upstreamtest.Serve(t, func(c *net.TCPConn) {
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		serve(c, bufio.NewReader(c))
	})
}

// Bytes past the end of an answer (here a second answer in the same write) must not answer
// the next request: the connection they came on is not reused.
func TestBytesPastTheAnswerAreNotTheNextAnswer(t *testing.T) {
	var conns atomic.Int32
	url := rawServer(t, func(c net.Conn, br *bufio.Reader) {
		first := conns.Add(1) == 1
		for {
			if _, err := http.ReadRequest(br); err != nil {
				return
			}
			if first {
				first = false
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"+
					"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nWRONG")
				continue
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nright")
		}
	})
	tr := newTransport(t, Options{})
	if _, b := do(t, tr, url, "1", ""); b != "ok" {
		t.Fatalf("first answer %q", b)
	}
	if _, b := do(t, tr, url, "2", ""); b != "right" {
		t.Fatalf("second request answered with %q, want %q", b, "right")
	}
	if n := conns.Load(); n != 2 {
		t.Fatalf("%d connections, want 2 (the first closed)", n)
	}
}

// An upstream that sends a body with its answer to HEAD: the next request still gets its own
// answer.
func TestHeadAnsweredWithABody(t *testing.T) {
	url := rawServer(t, func(c net.Conn, br *bufio.Reader) {
		for {
			req, err := http.ReadRequest(br)
			if err != nil {
				return
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"+req.Method[:1]+"ello") // a body even for HEAD
		}
	})
	tr := newTransport(t, Options{})
	req, _ := http.NewRequest(http.MethodHead, url, nil)
	res, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	req, _ = http.NewRequest(http.MethodGet, url, nil)
	res, err = tr.RoundTrip(req)
	if err != nil {
		t.Fatalf("GET after a HEAD answered with a body: %v", err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != 200 || string(b) != "Gello" {
		t.Fatalf("GET got %d %q, want 200 Gello", res.StatusCode, b)
	}
}

// failingBody gives n bytes, then fails.
type failingBody struct{ n int }

func (b *failingBody) Read(p []byte) (int, error) {
	if b.n == 0 {
		return 0, errors.New("client body broke")
	}
	n := copy(p, strings.Repeat("x", min(b.n, len(p))))
	b.n -= n
	return n, nil
}

func (*failingBody) Close() error { return nil }

// A request body that fails mid-write fails the exchange at once: the upstream waits for the
// rest of the body, so no answer can come.
func TestRequestBodyFailingMidWrite(t *testing.T) {
	url := rawServer(t, func(c net.Conn, br *bufio.Reader) {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		io.Copy(io.Discard, req.Body) // waits for the declared 100 bytes
	})
	tr := newTransport(t, Options{ResponseHeaderTimeout: 3 * time.Second})
	req, _ := http.NewRequest(http.MethodPost, url, &failingBody{n: 10})
	req.ContentLength = 100
	start := time.Now()
	_, err := tr.RoundTrip(req)
	if err == nil || !strings.Contains(err.Error(), "client body broke") {
		t.Fatalf("got %v, want the body's error", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("the exchange took %v after the body failed", d)
	}
}

// Response headers are bounded, and so are interim answers.
func TestResponseHeaderLimits(t *testing.T) {
	url := rawServer(t, func(c net.Conn, br *bufio.Reader) {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		if req.URL.Path == "/interim" {
			io.WriteString(c, strings.Repeat("HTTP/1.1 103 Early Hints\r\n\r\n", 6)+"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
			return
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nX-Big: "+strings.Repeat("a", 8<<10)+"\r\nContent-Length: 0\r\n\r\n")
	})
	tr := newTransport(t, Options{MaxResponseHeaderBytes: 4 << 10})
	if _, err := roundTrip(context.Background(), tr, url+"/big", "1", ""); err == nil || !strings.Contains(err.Error(), "larger than 4096 bytes") {
		t.Fatalf("8 KiB of headers with a 4 KiB limit: %v", err)
	}
	if _, err := roundTrip(context.Background(), tr, url+"/interim", "2", ""); err == nil || !strings.Contains(err.Error(), "interim") {
		t.Fatalf("six interim answers: %v", err)
	}
}

// Cancellations racing the end of exchanges (with and without a header timeout): every answer
// is its own request's, and no request that was not cancelled fails (a connection given back
// with a cancelled exchange's past deadline would fail the next one). Run with -race.
func TestCancellationsRacingReuse(t *testing.T) {
	for _, timeout := range []time.Duration{0, time.Second} {
		srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
			id := r.Header.Get("X-Id")
			if strings.HasSuffix(id, "0") {
				w.WriteHeader(http.StatusNoContent)
				return
			}
			io.WriteString(w, id+"."+strings.Repeat(".", len(id)*500))
		})
		tr := newTransport(t, Options{MaxIdleConns: 4, ResponseHeaderTimeout: timeout})
		var wg sync.WaitGroup
		for g := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 200 {
					id := strconv.Itoa(g*1000 + i)
					ctx, cancel := context.WithCancel(context.Background())
					cancelled := i%3 == 0
					if cancelled {
						time.AfterFunc(time.Duration(i%7)*50*time.Microsecond, cancel)
					}
					res, err := roundTrip(ctx, tr, srv.URL, id, "")
					if err != nil {
						cancel()
						if !cancelled {
							t.Errorf("timeout %v, request %s (not cancelled): %v", timeout, id, err)
						}
						continue
					}
					b, err := io.ReadAll(res.Body)
					res.Body.Close()
					cancel()
					if err == nil && res.StatusCode == 200 && !strings.HasPrefix(string(b), id+".") {
						t.Errorf("request %s got %q", id, b[:min(len(b), 20)])
					}
				}
			}()
		}
		wg.Wait()
	}
}

// Ready says whether a body's first data came with the headers: a proxy then sends both in
// one write. The upstream here writes exact bytes, in one write, on a raw connection.
func TestBodyReady(t *testing.T) {
	const head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
	for _, c := range []struct {
		name, answer string
		ready        bool
	}{
		{"a whole chunk", head + "Transfer-Encoding: chunked\r\n\r\n6\r\npart1\n\r\n", true},
		{"a chunk with an extension, cut in its data", head + "Transfer-Encoding: chunked\r\n\r\n6;x=y\r\npa", true},
		{"headers only, chunked", head + "Transfer-Encoding: chunked\r\n\r\n", false},
		{"half a chunk-size line", head + "Transfer-Encoding: chunked\r\n\r\n6", false},
		{"a chunk-size line without data", head + "Transfer-Encoding: chunked\r\n\r\n6\r\n", false},
		{"the last chunk", head + "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", false},
		{"content-length with data", head + "Content-Length: 6\r\n\r\npar", true},
		{"content-length, nothing yet", head + "Content-Length: 6\r\n\r\n", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			release := make(chan struct{})
			go func() {
				nc, err := ln.Accept()
				if err != nil {
					return
				}
				defer nc.Close()
				br := bufio.NewReader(nc)
				for { // the request's headers (its body is empty)
					line, err := br.ReadString('\n')
					if err != nil || line == "\r\n" {
						break
					}
				}
				_, _ = io.WriteString(nc, c.answer)
				<-release
			}()
			defer close(release)
			tr := newTransport(t, Options{})
			res, err := roundTrip(context.Background(), tr, "http://"+ln.Addr().String(), "1", "")
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			rb, ok := res.Body.(interface{ Ready() bool })
			if !ok {
				t.Fatalf("body %T has no Ready", res.Body)
			}
			if got := rb.Ready(); got != c.ready {
				t.Fatalf("Ready() = %v, want %v", got, c.ready)
			}
		})
	}
}

// writeCounter counts the writes made on a connection.
type writeCounter struct {
	net.Conn
	writes *atomic.Int64
}

func (c writeCounter) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// opaqueBody hides the body's type, as ReverseProxy's no-op closer does: net/http does not
// know it to be in memory.
type opaqueBody struct{ io.Reader }

func (opaqueBody) Close() error { return nil }

// A request whose body has a known length of up to half a writer leaves in one write, headers
// and body together, even when net/http cannot tell the body is in memory; a longer one keeps
// net/http's early flush of the headers. Every byte arrives either way.
func TestShortRequestInOneWrite(t *testing.T) {
	srv := newServer(t, echo)
	var writes atomic.Int64
	tr := newTransport(t, Options{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return writeCounter{Conn: c, writes: &writes}, nil
	}})
	for _, c := range []struct {
		size       int
		writesWant func(int64) bool
	}{
		{7000, func(n int64) bool { return n == 1 }},             // a v1 conversation: one write
		{writerSize/2 + 1, func(n int64) bool { return n >= 2 }}, // headers flushed on their own first
	} {
		body := strings.Repeat("x", c.size)
		req, err := http.NewRequest(http.MethodPost, srv.URL, opaqueBody{strings.NewReader(body)})
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = int64(len(body))
		req.Header.Set("X-Id", "a")
		writes.Store(0)
		res, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if n := writes.Load(); !c.writesWant(n) || string(got) != "a:"+body {
			t.Fatalf("%d-byte body: %d writes, answer of %d bytes", c.size, n, len(got))
		}
	}
}
