package main

import (
	"strconv"
	"strings"
	"testing"
	"time"
)

// A request with both Transfer-Encoding: chunked and Content-Length (RFC 9112 6.1). net/http
// processes it by Transfer-Encoding alone and drops the Content-Length before any handler
// sees it, which is what the RFC asks of an intermediary that forwards such a message. The
// gateway then forwards it well-formed (its own Content-Length, the exact body) and closes the
// connection after answering, so nothing after the body can be read as a second request.
func TestTransferEncodingWithContentLength(t *testing.T) {
	t.Parallel()
	up := newBodyUpstream(t)
	p := startGateway(t, up.URL, hostileConfig)
	const body = `{"prompt":"x"}`
	for _, framing := range []string{
		"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n",
		"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n",
	} {
		r := rawExchange(t, p.public, 3*time.Second, 0, []byte(agentReq(framing, "e\r\n"+body+"\r\n0\r\n\r\n")))
		if code := r.status(); code != 201 || !r.closed {
			t.Fatalf("%q: status %d, closed %t", framing, code, r.closed)
		}
	}
	for _, seen := range up.requests() {
		if string(seen.body) != body || seen.hdr.Get("Content-Length") != strconv.Itoa(len(body)) || seen.hdr.Get("Transfer-Encoding") != "" {
			t.Fatalf("forwarded malformed: body %q, headers %v", seen.body, seen.hdr)
		}
	}
}

func TestNoRequestSmuggledBehindChunkedBody(t *testing.T) {
	t.Parallel()
	up := newBodyUpstream(t)
	p := startGateway(t, up.URL, hostileConfig)
	req := "POST /v2/agent/hostile/job HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer svc_hostile\r\n" +
		"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n" +
		"e\r\n{\"prompt\":\"x\"}\r\n0\r\n\r\n" +
		"GET /smuggled HTTP/1.1\r\nHost: gw\r\n\r\n"
	r := rawExchange(t, p.public, 2*time.Second, 0, []byte(req))
	if n := strings.Count(r.data, "HTTP/1.1 "); n != 1 || !r.closed {
		t.Fatalf("%d responses on the connection, closed %t: %.400q", n, r.closed, r.data)
	}
}

// A client that declares a body, sends a byte of it and stops must still get its answer, and
// its connection must close, whatever the gateway refuses the request for: nothing may wait
// on the rest of the body without a deadline (keep-alive clients, no Connection: close).
func TestRefusalsWithUnreadBody(t *testing.T) {
	up := newBodyUpstream(t)
	p := startGateway(t, up.URL, hostileConfig)
	partial := func(path, headers string) []byte {
		return []byte("POST " + path + " HTTP/1.1\r\nHost: gw\r\nContent-Length: 1000\r\n" + headers + "\r\n{")
	}
	for _, c := range []struct {
		name string
		req  []byte
		want int
	}{
		{"no key", partial("/v2/agent/p/job", "Content-Type: application/json\r\n"), 401},
		{"unknown path", partial("/nope", ""), 404},
		{"wrong content type", partial("/v2/agent/p/job", "Authorization: Bearer svc_unread\r\nContent-Type: text/plain\r\n"), 415},
		{"body never finishes", partial("/v2/agent/p/job", "Authorization: Bearer svc_unread\r\nContent-Type: application/json\r\n"), 408},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := rawExchange(t, p.public, 5*time.Second, 0, c.req)
			if r.status() != c.want || !r.closed || r.after > 3*time.Second {
				t.Fatalf("status %d, closed %t after %v, want %d and a close within the body timeout: %.200q",
					r.status(), r.closed, r.after, c.want, r.data)
			}
		})
	}
	if n := len(up.requests()); n != 0 {
		t.Fatalf("%d refused requests reached the upstream", n)
	}
}
