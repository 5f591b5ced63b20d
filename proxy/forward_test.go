package proxy

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/docsgate/gateway/config"
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
// together, through the gateway's own transport. Sending the headers first costs a system
// call per request on the busiest route (net/http does so for any body it does not know to
// be in memory).
func TestShortRequestGoesOutInOneWrite(t *testing.T) {
	up := newUpstream(t, nil)
	cfg := config.Defaults()
	cfg.Upstream.URL = up.URL
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	var writes atomic.Int64
	tr := newStandardTransport(cfg.Upstream)
	dial := tr.DialContext
	tr.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return writeCountingConn{Conn: c, writes: &writes}, nil
	}
	t.Cleanup(tr.CloseIdleConnections)
	gw, err := New(Options{Config: &cfg, Logger: zap.NewNop(), Metrics: metrics.New(prometheus.NewRegistry()),
		Limiter: limits.NewMemory(), Transport: tr})
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
