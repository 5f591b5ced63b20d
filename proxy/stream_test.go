package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/limits"
	"github.com/docsgate/gateway/metrics"
)

// lockstep is an upstream that writes one stream part, flushes, and writes the next only when
// the test says the client has read the previous one. A gateway that buffered anything would
// deadlock here, which the bounded waits turn into a failure.
type lockstep struct {
	next     chan struct{}
	canceled chan struct{}
}

func newLockstep(ctype string, contentLength bool, parts []string) (*lockstep, http.HandlerFunc) {
	l := &lockstep{next: make(chan struct{}), canceled: make(chan struct{}, 1)}
	total := 0
	for _, p := range parts {
		total += len(p)
	}
	return l, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", ctype)
		w.Header().Set("X-Vercel-AI-Data-Stream", "v1")
		w.Header().Set("X-Thread-Id", "thread_1")
		w.Header().Set("X-Thread-Key", "tk_1")
		w.Header().Set("Access-Control-Allow-Origin", "https://evil.example")
		if contentLength {
			w.Header().Set("Content-Length", strconv.Itoa(total))
		}
		w.WriteHeader(http.StatusOK)
		for i, p := range parts {
			if i > 0 {
				select {
				case <-l.next:
				case <-r.Context().Done():
					l.canceled <- struct{}{}
					return
				case <-time.After(10 * time.Second):
					return
				}
			}
			_, _ = io.WriteString(w, p)
			http.NewResponseController(w).Flush()
		}
	}
}

var streamParts = []string{
	"f:{\"messageId\":\"msg-1\"}\n",
	"0:\"Hello \"\n",
	"0:\"world\"\n",
	"e:{\"finishReason\":\"stop\"}\n",
	"d:{\"finishReason\":\"stop\",\"threadId\":\"thread_1\"}\n",
}

// readParts reads each part as the upstream releases it, within a bound.
func readParts(t *testing.T, l *lockstep, body io.Reader) string {
	t.Helper()
	br := bufio.NewReader(body)
	var all strings.Builder
	for i := range streamParts {
		got := make(chan string, 1)
		go func() {
			line, _ := br.ReadString('\n')
			got <- line
		}()
		select {
		case line := <-got:
			if line != streamParts[i] {
				t.Fatalf("part %d = %q, want %q", i, line, streamParts[i])
			}
			all.WriteString(line)
		case <-time.After(5 * time.Second):
			t.Fatalf("part %d not readable while the upstream waits: the stream is buffered", i)
		}
		if i+1 < len(streamParts) {
			l.next <- struct{}{}
		}
	}
	return all.String()
}

func TestStreamIsUnbuffered(t *testing.T) {
	for _, tc := range []struct {
		name, ctype string
		length      bool
		proto       string
	}{
		{"text/plain http1", "text/plain; charset=utf-8", false, "http1"},
		{"json with content-length http1", "application/json", true, "http1"},
		{"text/plain h2c", "text/plain; charset=utf-8", false, "h2c"},
		{"octet-stream h2c", "application/octet-stream", true, "h2c"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, handle := newLockstep(tc.ctype, tc.length, streamParts)
			g := newGateway(t, newUpstream(t, handle))
			client := g.Client()
			if tc.proto == "h2c" {
				var p http.Protocols
				p.SetUnencryptedHTTP2(true)
				client = &http.Client{Transport: &http.Transport{Protocols: &p}}
			}
			req, _ := http.NewRequest("POST", g.URL+"/discovery/v1/assistant/acme/message", strings.NewReader(assistantBody))
			req.Header = jsonHdr(assistantKey)
			req.Header.Set("Origin", "https://docs.acme.com")
			res, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			if tc.proto == "h2c" && res.ProtoMajor != 2 {
				t.Fatalf("proto %s, want HTTP/2", res.Proto)
			}
			readParts(t, l, res.Body)
			for k, v := range map[string]string{
				"Content-Type": tc.ctype, "X-Vercel-AI-Data-Stream": "v1", "X-Thread-Id": "thread_1",
				"X-Thread-Key": "tk_1", "X-Accel-Buffering": "no", "Access-Control-Allow-Origin": "*",
			} {
				if got := res.Header.Get(k); got != v {
					t.Errorf("%s = %q, want %q", k, got, v)
				}
			}
			if n := len(res.Header.Values("Access-Control-Allow-Origin")); n != 1 {
				t.Errorf("%d Access-Control-Allow-Origin headers: the upstream's leaked through", n)
			}
			if res.Header.Get("Content-Encoding") != "" {
				t.Error("stream was compressed")
			}
		})
	}
}

func TestStreamOverHTTPS(t *testing.T) {
	l, handle := newLockstep("text/plain; charset=utf-8", false, streamParts)
	up := newUpstream(t, handle)
	cfg := config.Defaults()
	cfg.Upstream.URL = up.URL
	gw, err := newTestGateway(&cfg, limits.NewMemory(), metrics.New(prometheus.NewRegistry()), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(gw)
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	req, _ := http.NewRequest("POST", srv.URL+"/discovery/v1/assistant/acme/message", strings.NewReader(assistantBody))
	req.Header = jsonHdr(assistantKey)
	res, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.ProtoMajor != 2 {
		t.Fatalf("proto %s, want HTTP/2 over TLS", res.Proto)
	}
	readParts(t, l, res.Body)
}

func TestClientGoneCancelsUpstream(t *testing.T) {
	l, handle := newLockstep("text/plain; charset=utf-8", false, streamParts)
	g := newGateway(t, newUpstream(t, handle))
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", g.URL+"/discovery/v1/assistant/acme/message", strings.NewReader(assistantBody))
	req.Header = jsonHdr(assistantKey)
	res, err := g.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	line, _ := bufio.NewReader(res.Body).ReadString('\n')
	if line != streamParts[0] {
		t.Fatalf("first part %q", line)
	}
	cancel()
	res.Body.Close()
	select {
	case <-l.canceled:
	case <-time.After(2 * time.Second):
		t.Fatal("upstream request not cancelled after the client went away")
	}
}

func TestUpstreamFailures(t *testing.T) {
	t.Run("unreachable", func(t *testing.T) {
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		addr := ln.Addr().String()
		ln.Close() // nothing listens here now
		up := newUpstream(t, nil)
		g := newGateway(t, up, func(c *cfgT) { c.Upstream.URL = "http://" + addr })
		res, data := g.do(t, "POST", "/v2/agent/p/job", jsonHdr(adminKey), agentBody)
		if res.StatusCode != 502 || decodeError(t, res, data).Code != "upstream_unavailable" {
			t.Fatalf("status %d body %s", res.StatusCode, data)
		}
		g.assertNoSecrets(t, data)
	})
	t.Run("no headers in time", func(t *testing.T) {
		release := make(chan struct{})
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		})
		defer close(release)
		g := newGateway(t, up, func(c *cfgT) { c.Upstream.Timeout = 200 * time.Millisecond })
		res, data := g.do(t, "POST", "/v2/agent/p/job", jsonHdr(adminKey), agentBody)
		if res.StatusCode != 504 || decodeError(t, res, data).Code != "upstream_timeout" {
			t.Fatalf("status %d body %s", res.StatusCode, data)
		}
	})
	t.Run("upstream errors pass through", func(t *testing.T) {
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_, _ = io.WriteString(w, `{"error":"Project not found"}`)
		})
		g := newGateway(t, up)
		res, data := g.do(t, "POST", "/v2/agent/p/job", jsonHdr(adminKey), agentBody)
		if res.StatusCode != 404 || string(data) != `{"error":"Project not found"}` {
			t.Fatalf("status %d body %s", res.StatusCode, data)
		}
	})
}

func TestCORS(t *testing.T) {
	up := newUpstream(t, nil)
	g := newGateway(t, up)
	pre := hdr("Origin", "https://docs.acme.com", "Access-Control-Request-Method", "POST",
		"Access-Control-Request-Headers", "content-type, authorization")
	for _, path := range []string{"/discovery/v1/assistant/acme/message", "/discovery/v2/assistant/acme/message"} {
		res, _ := g.do(t, "OPTIONS", path, pre, "")
		if res.StatusCode != 204 || res.Header.Get("Access-Control-Allow-Origin") != "*" ||
			res.Header.Get("Access-Control-Allow-Methods") != "POST" ||
			!strings.Contains(res.Header.Get("Access-Control-Allow-Headers"), "Authorization") {
			t.Fatalf("preflight %s: %d %v", path, res.StatusCode, res.Header)
		}
	}
	// Errors of assistant routes carry CORS headers so the browser can show them.
	res, data := g.do(t, "POST", "/discovery/v1/assistant/acme/message", hdr("Origin", "https://docs.acme.com"), assistantBody)
	if res.StatusCode != 401 || res.Header.Get("Access-Control-Allow-Origin") != "*" ||
		!strings.Contains(res.Header.Get("Access-Control-Expose-Headers"), "X-Thread-Id") {
		t.Fatalf("401 without CORS: %d %v %s", res.StatusCode, res.Header, data)
	}
	if n := len(up.requests()); n != 0 {
		t.Fatalf("preflights or rejects reached the upstream: %d", n)
	}

	// A list of origins: only those are echoed, with Vary.
	g2 := newGateway(t, up, func(c *cfgT) { c.CORS.AllowedOrigins = []string{"https://docs.acme.com"} })
	res, _ = g2.do(t, "OPTIONS", "/discovery/v1/assistant/acme/message", pre, "")
	if res.Header.Get("Access-Control-Allow-Origin") != "https://docs.acme.com" || res.Header.Get("Vary") != "Origin" {
		t.Fatalf("allowed origin: %v", res.Header)
	}
	pre.Set("Origin", "https://evil.example")
	res, _ = g2.do(t, "OPTIONS", "/discovery/v1/assistant/acme/message", pre, "")
	if res.Header.Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("foreign origin allowed: %v", res.Header)
	}
}

func TestForwardedForTrust(t *testing.T) {
	up := newUpstream(t, nil)
	spoof := jsonHdr(adminKey)
	spoof.Set("X-Forwarded-For", "203.0.113.9")

	g := newGateway(t, up)
	g.do(t, "POST", "/v2/agent/p/job", spoof, agentBody)
	if got := up.requests()[0].Header.Get("X-Forwarded-For"); got != "127.0.0.1" {
		t.Fatalf("untrusted peer's X-Forwarded-For believed: upstream got %q", got)
	}
	if ip := lastLogField(g, 1, "client_ip"); ip != "127.0.0.1" {
		t.Fatalf("client_ip logged %q", ip)
	}

	g2 := newGateway(t, up, func(c *cfgT) { c.ClientIP.TrustedProxies = []string{"127.0.0.0/8", "10.0.0.0/8"} })
	spoof.Set("X-Forwarded-For", "198.51.100.1, 203.0.113.9, 10.1.2.3")
	g2.do(t, "POST", "/v2/agent/p/job", spoof, agentBody)
	if got := up.requests()[1].Header.Get("X-Forwarded-For"); got != "198.51.100.1, 203.0.113.9, 10.1.2.3, 127.0.0.1" {
		t.Fatalf("trusted chain not extended: %q", got)
	}
	if ip := lastLogField(g2, 1, "client_ip"); ip != "203.0.113.9" {
		t.Fatalf("client_ip = %q, want the right-most untrusted hop", ip)
	}
}

// lastLogField reads a field of the n-th access-log line, waiting for it: the line is written
// when the handler returns, which may be just after the client has read the whole response.
func lastLogField(g *gateway, n int, key string) string {
	deadline := time.Now().Add(2 * time.Second)
	for g.logs.FilterMessage("request").Len() < n && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	all := g.logs.FilterMessage("request").All()
	if len(all) < n {
		return ""
	}
	all = all[:n]
	s, _ := all[len(all)-1].ContextMap()[key].(string)
	return s
}

// An upstream that breaks off mid-stream: the client gets every part sent so far and a clean
// end of stream; a short non-streamed answer broken off mid-way becomes a 502.
func TestUpstreamResetMidBody(t *testing.T) {
	handle := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if !strings.HasPrefix(r.URL.Path, "/discovery/") {
			w.Header().Set("Content-Length", "1000")
		}
		_, _ = io.WriteString(w, "0:\"partial\"\n")
		http.NewResponseController(w).Flush()
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			if tc, ok := conn.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // RST, not FIN
			}
			conn.Close()
		}
	}
	g := newGateway(t, newUpstream(t, handle))

	req, _ := http.NewRequest("POST", g.URL+"/discovery/v1/assistant/acme/message", strings.NewReader(assistantBody))
	req.Header = jsonHdr(assistantKey)
	res, err := g.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil || string(body) != "0:\"partial\"\n" {
		t.Fatalf("stream: %q, %v; want the parts so far and a clean end", body, err)
	}
	if kind := lastLogField(g, 1, "upstream_error"); kind != "reset" {
		t.Fatalf("upstream_error logged %q", kind)
	}

	// A short non-stream answer is read whole before it is sent: the break is a clean 502.
	res2, err := g.Client().Do(mustReq(t, "POST", g.URL+"/v2/agent/p/job", agentBody, jsonHdr(adminKey)))
	if err != nil {
		t.Fatal(err)
	}
	data := readBody(t, res2)
	if res2.StatusCode != 502 || decodeError(t, res2, data).Code != "upstream_unavailable" {
		t.Fatalf("non-stream answer broken mid-body: %d %s", res2.StatusCode, data)
	}
}

func mustReq(t *testing.T, method, url, body string, h http.Header) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = h
	return req
}

// captureScope is the stream proxy's transport with the request's scope recorded, so a test
// can look at what the gateway holds while a stream is open.
type captureScope struct {
	http.RoundTripper
	got chan *scope
}

func (c captureScope) RoundTrip(r *http.Request) (*http.Response, error) {
	c.got <- scopeFrom(r.Context())
	return c.RoundTripper.RoundTrip(r)
}

// An open stream no longer holds its request body once the upstream has it: with thousands
// of streams idle between parts, a held conversation (often several KiB) would be most of
// what a stream costs in memory. The body must still reach the upstream whole.
func TestStreamDropsRequestBodyOnceSent(t *testing.T) {
	l, handle := newLockstep("text/plain; charset=utf-8", false, streamParts)
	g := newGateway(t, newUpstream(t, handle))
	capture := captureScope{RoundTripper: g.gw.streamProxy.Transport, got: make(chan *scope, 1)}
	g.gw.streamProxy.Transport = capture
	req, _ := http.NewRequest("POST", g.URL+"/discovery/v1/assistant/acme/message", strings.NewReader(assistantBody))
	req.Header = jsonHdr(assistantKey)
	res, err := g.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	s := <-capture.got
	// The first part is through, and the upstream read the whole body before sending it: the
	// stream is open, idle until the next part.
	br := bufio.NewReader(res.Body)
	if line, err := br.ReadString('\n'); err != nil || line != streamParts[0] {
		t.Fatalf("first part %q, %v", line, err)
	}
	s.body.mu.Lock()
	held := len(s.body.data)
	s.body.mu.Unlock()
	if held != 0 {
		t.Errorf("an open stream still holds its %d-byte request body", held)
	}
	if got := g.up.requests(); len(got) != 1 || string(got[0].Body) != assistantBody {
		t.Fatalf("upstream got %d requests, not the body sent", len(got))
	}
	for range streamParts[1:] {
		l.next <- struct{}{}
	}
	rest, err := io.ReadAll(br)
	if err != nil || string(rest) != strings.Join(streamParts[1:], "") {
		t.Fatalf("rest of the stream %q, %v", rest, err)
	}
}

// Streams' bodies share recycled buffers: many at once, of every size class and beyond the
// largest, with and without a declared length, each must reach the upstream byte for byte.
// (With -race this also checks that a buffer goes back to the pool only once nobody reads it.)
func TestStreamBodiesArriveWholeUnderConcurrency(t *testing.T) {
	g := newGateway(t, newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = io.WriteString(w, strings.Join(streamParts, ""))
	}))
	const n = 60
	bodies := make([]string, n)
	for i := range bodies {
		// From about 100 bytes to about 100 KiB: below, inside and above the pooled classes.
		text := strings.Repeat(fmt.Sprintf("question %d ", i), 1+i*i*2)
		bodies[i] = `{"fp":"f` + strconv.Itoa(i) + `","messages":[{"id":"m1","role":"user","content":"` + text + `","parts":[]}]}`
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i, body := range bodies {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var rd io.Reader = strings.NewReader(body)
			if i%3 == 0 {
				rd = io.MultiReader(rd) // unknown length: sent chunked
			}
			req, _ := http.NewRequest("POST", g.URL+"/discovery/v1/assistant/acme/message", rd)
			req.Header = jsonHdr(assistantKey)
			res, err := g.Client().Do(req)
			if err != nil {
				errs <- err
				return
			}
			defer res.Body.Close()
			got, _ := io.ReadAll(res.Body)
			if res.StatusCode != 200 || string(got) != strings.Join(streamParts, "") {
				errs <- fmt.Errorf("body %d: status %d, answer %q", i, res.StatusCode, got)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	seen := map[string]bool{}
	for _, r := range g.up.requests() {
		seen[string(r.Body)] = true
	}
	for i, body := range bodies {
		if !seen[body] {
			t.Errorf("body %d (%d bytes) did not reach the upstream intact", i, len(body))
		}
	}
}
