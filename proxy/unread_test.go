package proxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Answers given before a request's body was read (issue 20, finding 1): each is sent at once
// when the client never sends the body it declared, and the connection closes; nothing waits
// on the client without a deadline, whoever writes the answer.

// rawAsk writes req on a new connection and reads one answer, then reports whether the
// gateway closed the connection (within wait) and how long the answer took.
func rawAsk(t *testing.T, addr, req string, wait time.Duration) (res *http.Response, took time.Duration, closed bool) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	start := time.Now()
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(start.Add(wait))
	br := bufio.NewReader(c)
	res, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer within %v: %v", wait, err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	took = time.Since(start)
	_, err = br.ReadByte()
	var ne net.Error
	closed = err != nil && !(errors.As(err, &ne) && ne.Timeout())
	return res, took, closed
}

func TestPreflightWithUnsentBody(t *testing.T) {
	up := newUpstream(t, nil)
	g := newGateway(t, up, func(c *cfgT) { c.Server.ReadBodyTimeout = 30 * time.Second })
	addr := strings.TrimPrefix(g.URL, "http://")
	const head = "OPTIONS /discovery/v1/assistant/acme/message HTTP/1.1\r\nHost: gw\r\n" +
		"Origin: https://docs.example.com\r\nAccess-Control-Request-Method: POST\r\n"
	for _, c := range []struct {
		name, req string
	}{
		{"declared length, nothing sent", head + "Content-Length: 1000\r\n\r\n"},
		{"declared length, one byte sent", head + "Content-Length: 1000\r\n\r\n{"},
		{"chunked, never finished", head + "Transfer-Encoding: chunked\r\n\r\n10\r\n{\"a\":"},
	} {
		t.Run(c.name, func(t *testing.T) {
			res, took, closed := rawAsk(t, addr, c.req, 5*time.Second)
			if res.StatusCode != http.StatusNoContent || res.Header.Get("Access-Control-Allow-Origin") == "" {
				t.Fatalf("preflight: %d %v", res.StatusCode, res.Header)
			}
			// The drain deadline (500 ms), far from read_body_timeout (30 s).
			if took > 3*time.Second || !closed || !res.Close {
				t.Fatalf("answered after %v, closed %t, Connection: close %t", took, closed, res.Close)
			}
		})
	}
	// A small body sent whole keeps the connection, like any refusal.
	res, _, closed := rawAsk(t, addr, head+"Content-Length: 2\r\n\r\n{}", 700*time.Millisecond)
	if res.StatusCode != http.StatusNoContent || closed || res.Close {
		t.Fatalf("small body: %d, closed %t", res.StatusCode, closed)
	}
	if len(up.requests()) != 0 {
		t.Fatal("a preflight reached the upstream")
	}
}

// An answer added later that forgets the drop path: written through the scope's writer it
// still gets the drain deadline; written past the gateway's writer altogether, the bound from
// the request's arrival (server.read_body_timeout) still ends net/http's wait for the body.
func TestEveryAnswerBoundsTheUnreadBody(t *testing.T) {
	up := newUpstream(t, nil)
	const bodyTimeout = 1500 * time.Millisecond
	g := newGateway(t, up, func(c *cfgT) { c.Server.ReadBodyTimeout = bodyTimeout })
	sn := g.gw.snap.Load()
	rt := sn.unmatched
	sn.table.mux.HandleFunc("POST /through-scope", func(w http.ResponseWriter, r *http.Request) {
		s, r := g.gw.begin(sn, rt, w, r)
		defer g.gw.finish(s, r)
		s.w.WriteHeader(http.StatusTeapot)
	})
	sn.table.mux.HandleFunc("POST /bare", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusTeapot)
	})
	addr := strings.TrimPrefix(g.URL, "http://")
	for _, c := range []struct {
		path     string
		min, max time.Duration
	}{
		{"/through-scope", 0, 1200 * time.Millisecond},
		{"/bare", bodyTimeout - 100*time.Millisecond, bodyTimeout + 3*time.Second},
	} {
		t.Run(c.path, func(t *testing.T) {
			res, took, closed := rawAsk(t, addr, "POST "+c.path+" HTTP/1.1\r\nHost: gw\r\nContent-Length: 1000\r\n\r\n{", 10*time.Second)
			if res.StatusCode != http.StatusTeapot || !closed {
				t.Fatalf("%d, closed %t", res.StatusCode, closed)
			}
			if took < c.min || took > c.max {
				t.Fatalf("answered after %v, want between %v and %v", took, c.min, c.max)
			}
		})
	}
}
