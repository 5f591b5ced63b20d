package proxy

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/h1"
	"github.com/docsgate/gateway/limits"
	"github.com/docsgate/gateway/metrics"
)

// writeCountingConn counts the writes the upstream transport makes on a connection: each is
// one system call.
type writeCountingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c writeCountingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

// A request with a short, validated body reaches the upstream in one write, headers and body
// together, through either transport. Sending the headers first costs a system call per
// request on the busiest route (net/http does so for any body it does not know to be in
// memory).
func TestShortRequestGoesOutInOneWrite(t *testing.T) {
	for _, transport := range []string{"pool", "standard"} {
		t.Run(transport, func(t *testing.T) { testShortRequestInOneWrite(t, transport) })
	}
}

func testShortRequestInOneWrite(t *testing.T, transport string) {
	up := newUpstream(t, nil)
	cfg := config.Defaults()
	cfg.Upstream.URL = up.URL
	cfg.Upstream.Transport = transport
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	var writes atomic.Int64
	dialer := &net.Dialer{}
	countingDial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dialer.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return writeCountingConn{Conn: c, writes: &writes}, nil
	}
	u, _ := url.Parse(up.URL)
	var tr http.RoundTripper
	switch rt := newTransport(cfg.Upstream, u).(type) {
	case *http.Transport:
		rt.DialContext = countingDial
		t.Cleanup(rt.CloseIdleConnections)
		tr = rt
	default:
		if transport != "pool" {
			t.Fatalf("upstream.transport %s gave a %T", transport, rt)
		}
		p := h1.New(h1.Options{DialContext: countingDial})
		t.Cleanup(p.Close)
		tr = p
	}
	gw, err := newTestGateway(&cfg, limits.NewMemory(), metrics.New(prometheus.NewRegistry()), nil, tr)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(gw)
	t.Cleanup(srv.Close)
	g := &gateway{Server: srv, up: up}

	const n = 20
	for i := 0; i < n; i++ {
		res, body := g.do(t, "POST", "/v2/agent/proj-7/job", jsonHdr(adminKey), agentBody)
		if res.StatusCode != http.StatusCreated {
			t.Fatalf("request %d: %d %s", i, res.StatusCode, body)
		}
	}
	if got := len(up.requests()); got != n {
		t.Fatalf("upstream saw %d requests, want %d", got, n)
	}
	for _, r := range up.requests() {
		if string(r.Body) != agentBody || r.ContentLength != int64(len(agentBody)) {
			t.Fatalf("upstream got body %q (Content-Length %d), want %q", r.Body, r.ContentLength, agentBody)
		}
	}
	if got := writes.Load(); got != n {
		t.Fatalf("%d writes to the upstream for %d requests, want one each", got, n)
	}
}

// upstream.transport picks the gateway's own pool for an http:// upstream only: an https://
// upstream, or standard, gets net/http's Transport.
func TestTransportChoice(t *testing.T) {
	for _, c := range []struct {
		transport, url string
		pool           bool
	}{
		{"pool", "http://up.internal:8080", true},
		{"pool", "https://api.example.com", false},
		{"standard", "http://up.internal:8080", false},
		{"standard", "https://api.example.com", false},
	} {
		cfg := config.Defaults()
		cfg.Upstream.Transport = c.transport
		u, _ := url.Parse(c.url)
		rt := newTransport(cfg.Upstream, u)
		_, isPool := rt.(*h1.Transport)
		if isPool != c.pool {
			t.Errorf("transport %s, upstream %s: got %T", c.transport, c.url, rt)
		}
		if std, ok := rt.(*http.Transport); ok && (!std.ForceAttemptHTTP2 || std.ResponseHeaderTimeout != cfg.Upstream.Timeout) {
			t.Errorf("transport %s, upstream %s: net/http Transport without HTTP/2 or the header timeout", c.transport, c.url)
		}
	}
}
