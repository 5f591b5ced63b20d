package h1

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
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
	for _, l := range tr.idle {
		idle += len(l)
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

func TestTLSUpstream(t *testing.T) {
	srv := httptest.NewUnstartedServer(http.HandlerFunc(echo))
	var opened atomic.Int64
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			opened.Add(1)
		}
	}
	srv.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshake below
	srv.StartTLS()
	defer srv.Close()
	roots := x509.NewCertPool()
	roots.AddCert(srv.Certificate())
	tr := newTransport(t, Options{TLSClientConfig: &tls.Config{RootCAs: roots}})
	for i := range 3 {
		if status, body := do(t, tr, srv.URL, strconv.Itoa(i), "x"); status != 200 || body != strconv.Itoa(i)+":x" {
			t.Fatalf("got %d %q", status, body)
		}
	}
	if n := opened.Load(); n != 1 {
		t.Fatalf("%d TLS connections for 3 requests, want 1", n)
	}
	// An upstream whose certificate is not trusted is refused.
	bad := newTransport(t, Options{})
	if _, err := roundTrip(context.Background(), bad, srv.URL, "1", ""); err == nil {
		t.Fatal("an untrusted certificate was accepted")
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
