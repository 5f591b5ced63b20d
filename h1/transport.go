// Package h1 is the gateway's HTTP/1.1 client to its upstream: a pool of keep-alive
// connections whose exchanges run on the calling goroutine.
//
// net/http's Transport gives every connection a reader and a writer goroutine and hands each
// request and response between them and the caller over channels. For a proxy that has the
// whole request body in memory before it forwards, those hand-offs are most of the client's
// cost: the gateway measured about a fifth less CPU per request with this pool. The wire
// format stays the standard library's: requests go out with (*http.Request).Write and
// responses are parsed by http.ReadResponse.
//
// What it does not do, and net/http's Transport does: TLS and HTTP/2, proxies from the
// environment, transparent compression, retries, 100-continue waits, and protocol switches
// (101). The gateway needs none of them on a cleartext upstream leg; for an https upstream,
// or with upstream.transport: standard, it uses net/http's Transport.
package h1

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Options configures a Transport. Zero values take the defaults.
type Options struct {
	// DialTimeout bounds establishing a connection (and its TLS handshake); default 5s.
	DialTimeout time.Duration
	// ResponseHeaderTimeout bounds writing the request and reading the response headers;
	// 0 waits as long as the request's context allows. A response body may take longer.
	ResponseHeaderTimeout time.Duration
	// MaxIdleConns is how many idle connections are kept per upstream host; default 100.
	MaxIdleConns int
	// IdleConnTimeout closes connections idle this long; default 90s.
	IdleConnTimeout time.Duration
	// MaxResponseHeaderBytes bounds the response headers (interim 1xx answers included);
	// default 1 MiB.
	MaxResponseHeaderBytes int64
	// DialContext opens connections; nil uses a net.Dialer with DialTimeout.
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Transport is an http.RoundTripper over HTTP/1.1 keep-alive connections.
type Transport struct {
	o      Options
	dialer net.Dialer

	mu     sync.Mutex
	idle   map[string][]*conn // by host[:port], most recently used last
	sweep  *time.Timer        // closes connections idle past IdleConnTimeout; nil when none are
	closed bool
}

// New returns a Transport.
func New(o Options) *Transport {
	if o.DialTimeout <= 0 {
		o.DialTimeout = 5 * time.Second
	}
	if o.MaxIdleConns <= 0 {
		o.MaxIdleConns = 100
	}
	if o.IdleConnTimeout <= 0 {
		o.IdleConnTimeout = 90 * time.Second
	}
	if o.MaxResponseHeaderBytes <= 0 {
		o.MaxResponseHeaderBytes = 1 << 20
	}
	return &Transport{
		o:      o,
		dialer: net.Dialer{Timeout: o.DialTimeout, KeepAlive: 30 * time.Second},
		idle:   map[string][]*conn{},
	}
}

// conn is one connection to an upstream host.
type conn struct {
	key    string
	nc     net.Conn
	probe  *prober // liveness check of nc
	lr     limitedReader
	br     *bufio.Reader // reads nc through lr
	bw     *bufio.Writer
	idleAt time.Time
}

// limitedReader reads from a connection at most n more bytes, then fails: it bounds the
// response headers, as net/http's Transport does with MaxResponseHeaderBytes. The limit is
// lifted once the headers are in.
type limitedReader struct {
	r     io.Reader
	n     int64
	limit int64 // for the error message
}

func (l *limitedReader) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, fmt.Errorf("response headers larger than %d bytes", l.limit)
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	return n, err
}

// unlimited is limitedReader's n while a body is read.
const unlimited = 1<<63 - 1

func (c *conn) close() { _ = c.nc.Close() }

// aLongTimeAgo is a deadline in the past: setting it fails the connection's pending and
// future reads and writes at once.
var aLongTimeAgo = time.Unix(1, 0)

// RoundTrip implements http.RoundTripper. It sends req and reads the response headers on the
// caller's goroutine; the body is read from the connection as the caller reads it, and the
// connection goes back to the pool once the body has been read to its end. Closing the body
// before its end closes the connection (nothing is drained).
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	closeBody := func() {
		if req.Body != nil {
			_ = req.Body.Close()
		}
	}
	if req.URL == nil || req.URL.Host == "" || req.URL.Scheme != "http" {
		closeBody()
		return nil, fmt.Errorf("upstream: unsupported URL %v (http:// only)", req.URL)
	}
	ctx := req.Context()
	if err := ctx.Err(); err != nil {
		closeBody()
		return nil, err
	}
	c, err := t.getConn(ctx, req.URL.Host)
	if err != nil {
		closeBody()
		return nil, err
	}
	return t.exchange(ctx, c, req)
}

// exchange sends req on c and reads the response headers.
func (t *Transport) exchange(ctx context.Context, c *conn, req *http.Request) (*http.Response, error) {
	if d := t.o.ResponseHeaderTimeout; d > 0 {
		// The timeout covers writing the request as well as awaiting the response headers
		// (net/http's starts after the write, so an upstream that stops reading a large
		// body would hold the request as long as its context lives). Set before the
		// cancellation hook below, which must be able to override it.
		_ = c.nc.SetDeadline(time.Now().Add(d))
	}
	stop := context.AfterFunc(ctx, func() { _ = c.nc.SetDeadline(aLongTimeAgo) })
	fail := func(err error) (*http.Response, error) {
		stop()
		c.close()
		if ctxErr := ctx.Err(); ctxErr != nil {
			return nil, fmt.Errorf("upstream: %w", ctxErr)
		}
		var ne net.Error
		if t.o.ResponseHeaderTimeout > 0 && errors.As(err, &ne) && ne.Timeout() {
			return nil, fmt.Errorf("upstream: no response headers within %v: %w", t.o.ResponseHeaderTimeout, err)
		}
		return nil, fmt.Errorf("upstream: %w", err)
	}

	werr := req.Write(c.bw)
	if werr == nil {
		werr = c.bw.Flush()
	}
	if req.Body != nil {
		_ = req.Body.Close() // a RoundTripper closes the request body, even on errors
	}
	if werr != nil {
		// Only an answer already on its way can stand (an early 413); a request body that
		// failed mid-write leaves the upstream waiting for the rest, and no answer comes.
		_ = c.nc.SetReadDeadline(time.Now().Add(earlyAnswerWait))
	}
	c.lr.n = t.o.MaxResponseHeaderBytes
	res, err := readResponse(c.br, req)
	c.lr.n = unlimited
	if err != nil {
		if werr != nil {
			err = werr
		}
		return fail(err)
	}
	if werr != nil {
		// The upstream answered before it took the whole request (an early 413, say) and
		// stopped reading: its answer stands, and the connection is done.
		res.Close = true
	}

	// The headers are in; the body may take as long as the client keeps reading (streams).
	if (t.o.ResponseHeaderTimeout > 0 || werr != nil) && !buffered(res, c.br) {
		// (A body already in the buffer is read without touching the connection, and the
		// next exchange sets its own deadline: one runtime timer update saved per
		// short answer.)
		_ = c.nc.SetReadDeadline(time.Time{})
	}
	// ctx.Err() turns non-nil before the cancellation hook runs: a request cancelled by now
	// never gives its connection back, whether or not the hook has run.
	cancelled := ctx.Err() != nil
	if cancelled {
		// Cancelled between the read and the line above, whose deadline undid the hook's:
		// put it back. (A later cancellation runs the hook after this point.)
		_ = c.nc.SetDeadline(aLongTimeAgo)
	}
	b := &body{ReadCloser: res.Body, t: t, c: c, stop: stop, reuse: !res.Close && !req.Close && werr == nil && !cancelled}
	if res.Body == http.NoBody {
		b.release(true)
		return res, nil
	}
	res.Body = b
	return res, nil
}

// buffered reports whether res's whole body is already in br.
func buffered(res *http.Response, br *bufio.Reader) bool {
	return res.Body == http.NoBody || (res.ContentLength >= 0 && len(res.TransferEncoding) == 0 && int64(br.Buffered()) >= res.ContentLength)
}

// earlyAnswerWait is how long an answer is awaited after writing the request failed.
const earlyAnswerWait = 50 * time.Millisecond

// maxInterim bounds the interim 1xx answers skipped before the final one (net/http's number).
const maxInterim = 5

// readResponse reads the response to req, skipping interim 1xx responses (100 Continue, 103
// Early Hints). A protocol switch is an error: the gateway never asks for one.
func readResponse(br *bufio.Reader, req *http.Request) (*http.Response, error) {
	for interim := 0; ; interim++ {
		res, err := http.ReadResponse(br, req)
		if err != nil {
			return nil, err
		}
		switch {
		case res.StatusCode == http.StatusSwitchingProtocols:
			return nil, errors.New("unexpected 101 Switching Protocols")
		case res.StatusCode >= 100 && res.StatusCode < 200:
			if interim == maxInterim {
				return nil, fmt.Errorf("more than %d interim 1xx answers", maxInterim)
			}
			continue
		}
		return res, nil
	}
}

// body is a response body; reading it to its end gives the connection back to the pool.
type body struct {
	io.ReadCloser
	t        *Transport
	c        *conn
	stop     func() bool // removes the cancellation hook; false once it has run
	reuse    bool
	released atomic.Bool
}

func (b *body) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil {
		b.release(err == io.EOF)
	}
	return n, err
}

// Close closes the connection unless the body was read to its end. It does not drain: the
// rest of a stream may never come.
func (b *body) Close() error {
	b.release(false)
	return nil
}

// release ends the exchange once: the connection goes back to the pool when the body was
// read whole with nothing after it (bytes past the answer's end, a body sent with a HEAD
// answer say, would be read as the next request's answer), the upstream keeps it open and
// the request was not cancelled; else it closes.
func (b *body) release(whole bool) {
	if b.released.Swap(true) {
		return
	}
	if b.stop() && whole && b.reuse && b.c.br.Buffered() == 0 {
		b.t.putConn(b.c)
		return
	}
	b.c.close()
}

// getConn returns a live idle connection to host, or dials one.
func (t *Transport) getConn(ctx context.Context, host string) (*conn, error) {
	for {
		t.mu.Lock()
		list := t.idle[host]
		n := len(list)
		if n == 0 {
			t.mu.Unlock()
			break
		}
		c := list[n-1]
		list[n-1] = nil
		t.idle[host] = list[:n-1]
		t.mu.Unlock()
		if time.Since(c.idleAt) < t.o.IdleConnTimeout && c.probe.alive() {
			return c, nil
		}
		// Closed by the upstream while idle (its keep-alive timeout, a restart), or sent
		// something unasked: never write a request to it.
		c.close()
	}
	return t.dial(ctx, host)
}

func (t *Transport) dial(ctx context.Context, host string) (*conn, error) {
	addr := host
	if _, _, err := net.SplitHostPort(host); err != nil {
		addr = net.JoinHostPort(strings.Trim(host, "[]"), "80")
	}
	dial := t.o.DialContext
	if dial == nil {
		dial = t.dialer.DialContext
	}
	nc, err := dial(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("upstream: %w", err)
	}
	c := &conn{key: host, nc: nc, probe: newProber(nc)}
	c.lr = limitedReader{r: nc, n: unlimited, limit: t.o.MaxResponseHeaderBytes}
	c.br = bufio.NewReaderSize(&c.lr, 4<<10)
	c.bw = bufio.NewWriterSize(nc, 4<<10)
	return c, nil
}

// putConn keeps c for reuse, or closes it when the pool is full or closed.
func (t *Transport) putConn(c *conn) {
	c.idleAt = time.Now()
	t.mu.Lock()
	list := t.idle[c.key]
	if t.closed || len(list) >= t.o.MaxIdleConns {
		t.mu.Unlock()
		c.close()
		return
	}
	t.idle[c.key] = append(list, c)
	if t.sweep == nil {
		t.sweep = time.AfterFunc(t.o.IdleConnTimeout, t.sweepIdle)
	}
	t.mu.Unlock()
}

// sweepIdle closes the connections idle past IdleConnTimeout (the oldest are first in each
// list), and runs again while any are left.
func (t *Transport) sweepIdle() {
	var stale []*conn
	t.mu.Lock()
	t.sweep = nil
	left := 0
	for key, list := range t.idle {
		i := 0
		for i < len(list) && time.Since(list[i].idleAt) >= t.o.IdleConnTimeout {
			stale = append(stale, list[i])
			i++
		}
		rest := append(list[:0], list[i:]...)
		clear(list[len(rest):])
		t.idle[key] = rest
		left += len(rest)
	}
	if left > 0 && !t.closed {
		t.sweep = time.AfterFunc(t.o.IdleConnTimeout/2, t.sweepIdle)
	}
	t.mu.Unlock()
	for _, c := range stale {
		c.close()
	}
}

// CloseIdleConnections closes the idle connections; connections in use close when their
// exchange ends.
func (t *Transport) CloseIdleConnections() {
	t.mu.Lock()
	idle := t.idle
	t.idle = map[string][]*conn{}
	t.mu.Unlock()
	for _, list := range idle {
		for _, c := range list {
			c.close()
		}
	}
}

// Close closes the idle connections and keeps no more from now on.
func (t *Transport) Close() {
	t.mu.Lock()
	t.closed = true
	if t.sweep != nil {
		t.sweep.Stop()
		t.sweep = nil
	}
	t.mu.Unlock()
	t.CloseIdleConnections()
}
