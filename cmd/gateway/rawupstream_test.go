package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
)

// rawUpstream is an upstream spoken by hand over TCP: it keeps the exact bytes of every
// request the gateway sends it (head and body, as they came off the wire), and answers each
// with what respond says, on a keep-alive connection. Nothing in between (no net/http server)
// adds, drops or normalizes a header, so a test sees what the upstream would see.
type rawUpstream struct {
	URL     string
	respond func(req *http.Request, body []byte) rawAnswer

	mu    sync.Mutex
	seen  []rawRequest
	bytes int // every byte received, requests complete or not
	conns int
}

// rawRequest is one request as the upstream received it.
type rawRequest struct {
	raw  []byte        // exactly the bytes of this request
	req  *http.Request // parsed from raw (body already read)
	body []byte
}

// rawAnswer is one response; Status 0 means 201 with a small JSON job.
type rawAnswer struct {
	Status      int
	ContentType string
	Body        string
}

// newRawUpstream listens on a free loopback port until the test ends. respond may be nil:
// every request then gets 201, assistant paths a short AI SDK stream.
func newRawUpstream(t *testing.T, respond func(req *http.Request, body []byte) rawAnswer) *rawUpstream {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u := &rawUpstream{URL: "http://" + ln.Addr().String(), respond: respond}
	var wg sync.WaitGroup
	var cmu sync.Mutex
	var open []net.Conn
	t.Cleanup(func() {
		ln.Close()
		cmu.Lock()
		for _, c := range open {
			c.Close()
		}
		cmu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			cmu.Lock()
			open = append(open, c)
			cmu.Unlock()
			u.mu.Lock()
			u.conns++
			u.mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				u.serve(c)
			}()
		}
	}()
	return u
}

// tee records what the connection delivers.
type tee struct {
	u   *rawUpstream
	c   net.Conn
	buf bytes.Buffer
}

func (r *tee) Read(p []byte) (int, error) {
	n, err := r.c.Read(p)
	r.buf.Write(p[:n])
	r.u.mu.Lock()
	r.u.bytes += n
	r.u.mu.Unlock()
	return n, err
}

func (u *rawUpstream) serve(c net.Conn) {
	rec := &tee{u: u, c: c}
	br := bufio.NewReader(rec)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		body, err := io.ReadAll(req.Body)
		if err != nil {
			return
		}
		// What was read from the wire minus what bufio holds for the next request.
		n := rec.buf.Len() - br.Buffered()
		raw := bytes.Clone(rec.buf.Bytes()[:n])
		rec.buf.Next(n)
		u.mu.Lock()
		u.seen = append(u.seen, rawRequest{raw: raw, req: req, body: body})
		u.mu.Unlock()
		a := rawAnswer{}
		if u.respond != nil {
			a = u.respond(req, body)
		}
		if _, err := io.WriteString(c, a.wire(req)); err != nil {
			return
		}
	}
}

func (a rawAnswer) wire(req *http.Request) string {
	if a.Status == 0 {
		a.Status, a.ContentType, a.Body = 201, "application/json", `{"id":"j1","status":"active"}`
		if strings.HasPrefix(req.URL.Path, "/discovery/") {
			a.Status, a.ContentType = 200, "text/plain; charset=utf-8"
			a.Body = "0:\"hi\"\nd:{\"finishReason\":\"stop\",\"usage\":{\"promptTokens\":1,\"completionTokens\":1}}\n"
		}
	}
	if a.ContentType == "" {
		a.ContentType = "application/json"
	}
	return fmt.Sprintf("HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n%s",
		a.Status, http.StatusText(a.Status), a.ContentType, len(a.Body), a.Body)
}

// requests returns the requests received so far.
func (u *rawUpstream) requests() []rawRequest {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]rawRequest(nil), u.seen...)
}

// received is every byte that reached the upstream and the connections it accepted.
func (u *rawUpstream) received() (n, conns int) {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.bytes, u.conns
}

// head is the request's head as received (up to the blank line), for header checks.
func (r rawRequest) head() string {
	h, _, _ := strings.Cut(string(r.raw), "\r\n\r\n")
	return h + "\r\n"
}

// hasHeader reports whether the head carries a header line named name (any case, any
// spelling of '-' as '_' as CGI-style servers read them).
func (r rawRequest) hasHeader(name string) bool {
	want := strings.ReplaceAll(strings.ToLower(name), "_", "-")
	for _, line := range strings.Split(r.head(), "\r\n")[1:] {
		k, _, ok := strings.Cut(line, ":")
		if ok && strings.ReplaceAll(strings.ToLower(strings.TrimSpace(k)), "_", "-") == want {
			return true
		}
	}
	return false
}

// transports are the two upstream.transport settings every finding is tested on.
var transports = []string{"pool", "standard"}
