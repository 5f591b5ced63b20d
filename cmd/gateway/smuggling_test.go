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
