// Package h1 is the gateway's HTTP/1.1 keep-alive pool to a cleartext upstream.
//
// H1 is the gateway's HTTP/1.1 client to its upstream: a pool of keep-alive
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
// environment, transparent compression, retries of idempotent requests that may have reached
// the upstream (a request is sent again only when none of it left, see RoundTrip),
// 100-continue waits, and protocol switches (101). The gateway needs none of them on a
// cleartext upstream leg; for an https upstream, or with upstream.transport: standard, it
// uses net/http's Transport. What it does that net/http's Transport does not: it checks an
// idle connection is still open right before writing on it, never reuses a connection after
// an answer whose framing is in doubt, and learns the upstream's idle timeout (pool.go).
package h1

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
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
	hosts  map[string]*host // by host[:port]
	sweep  *time.Timer      // closes connections idle past IdleConnTimeout; nil when none are
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
		hosts:  map[string]*host{},
	}
}

// conn is one connection to an upstream host.
type conn struct {
	key         string
	nc          net.Conn
	probe       *prober // liveness check of nc
	lr          limitedReader
	br          *bufio.Reader  // reads nc through lr
	cw          countingWriter // nc, written through a writer of writers (see exchange)
	idleAt      time.Time
	reusedAfter time.Duration // how long it was idle before this exchange; 0 when new
}

// writers are the buffered writers requests are written through, shared by the connections:
// a connection only writes while it sends a request, so it keeps no writer of its own (a
// stream holds its connection, idle, for as long as it runs), and a shared one can be large
// enough for a whole request of the usual size: a chat's conversation (4 to 8 KiB, headers
// and body) goes out in one write, where a 4 KiB writer of its own took two, and the
// upstream reads it in one.
var writers = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, writerSize) }}

// writerSize is the size of the writers: a request up to it leaves in one write.
const writerSize = 16 << 10

// oneWrite sends a request whose body has a known length of up to half a writer in the same
// write as its headers. Given a *bufio.Writer, net/http flushes the headers on their own
// before any body it does not know to be in memory (its own types only: the gateway's
// stream bodies, wrapped by ReverseProxy, are not among them), so that an upstream may answer
// before a slow body has arrived; the gateway reads every body whole before forwarding it,
// and a short one (a chat's conversation) then costs one write and one read at the upstream
// instead of two each. Embedding the writer keeps its WriteByte, so net/http wraps it in
// nothing, and hides its type, so net/http does not flush it; exchange does, once.
type oneWrite struct{ *bufio.Writer }

// countingWriter writes to a connection and tells whether an exchange's request left.
type countingWriter struct {
	w       io.Writer
	written int64  // bytes of this exchange written
	err     error  // the connection's write error
	unsent  []byte // what the first write failed to send, when nothing was written
}

func (cw *countingWriter) start() { cw.written, cw.err, cw.unsent = 0, nil, nil }

func (cw *countingWriter) Write(p []byte) (int, error) {
	n, err := cw.w.Write(p)
	cw.written += int64(n)
	if err != nil {
		cw.err = err
		if cw.written == 0 {
			// p is the buffered writer's own buffer, which the failed connection never uses
			// again: no copy needed.
			cw.unsent = p
		}
	}
	return n, err
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
//
// A request is sent again only when it provably never left: its connection, taken from the
// pool, failed the first write with nothing written (the upstream reset it in the moment
// between the pool's liveness check and the write), and the whole request was in that write,
// so the same bytes go out on another connection. Once any byte is out, the upstream may have
// acted on the request, and a failure is the caller's to see.
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
	res, err := t.exchange(ctx, c, req, nil)
	// Each round consumes an idle connection or ends on a new one (never reused, so its
	// failure is final): the loop is bounded by the pool.
	for {
		var ns *notSent
		if !errors.As(err, &ns) || ns.raw == nil || !ns.reused {
			return res, err
		}
		if c, err = t.getConn(ctx, req.URL.Host); err != nil {
			return nil, err
		}
		res, err = t.exchange(ctx, c, req, ns.raw)
	}
}

// notSent is the error of a request that never left: its connection failed the first write,
// and no byte of it was written.
type notSent struct {
	err    error
	raw    []byte // the whole request as it was to go out; nil when it did not fit in one write
	reused bool   // the connection came from the pool
}

func (e *notSent) Error() string { return e.err.Error() }
func (e *notSent) Unwrap() error { return e.err }

// exchange sends req on c and reads the response headers. raw, when not nil, is req as
// written before, sent as it is (req's body has been read and closed).
func (t *Transport) exchange(ctx context.Context, c *conn, req *http.Request, raw []byte) (*http.Response, error) {
	x := flight{t: t, ctx: ctx, c: c, req: req}
	x.arm()
	serialized := x.write(raw)
	if ns := x.notSent(serialized); ns != nil {
		// The upstream closed the connection before the request's first byte (after the
		// pool's liveness check): it is learned from, and RoundTrip may send the request again.
		t.closedByUpstream(c)
		return nil, x.fail(ns)
	}
	res, doubt, err := x.readHead()
	if err != nil {
		return nil, x.fail(err)
	}
	return x.handOver(res, doubt), nil
}

// flight is one exchange on its way: what exchange's steps share. It lives on exchange's
// stack (nothing keeps a pointer to it), so splitting the exchange into steps costs no
// allocation.
type flight struct {
	t        *Transport
	ctx      context.Context
	c        *conn
	req      *http.Request
	deadline time.Time   // of the request's write and the answer's headers; zero: none
	stop     func() bool // removes the cancellation hook; false once it has run
	werr     error       // writing the request failed (the upstream may answer all the same)
}

// arm sets the exchange's deadline and its cancellation hook.
func (x *flight) arm() {
	c := x.c // the hook holds the connection, not the flight
	if d := x.t.o.ResponseHeaderTimeout; d > 0 {
		// The timeout covers writing the request as well as awaiting the response headers
		// (net/http's starts after the write, so an upstream that stops reading a large
		// body would hold the request as long as its context lives). Set before the
		// cancellation hook below, which must be able to override it.
		x.deadline = time.Now().Add(d)
		_ = c.nc.SetDeadline(x.deadline)
	}
	x.stop = context.AfterFunc(x.ctx, func() { _ = c.nc.SetDeadline(aLongTimeAgo) })
}

// write sends the request through a pooled writer: raw when not nil, else req, whose body it
// closes (a RoundTripper closes the request body, even on errors). serialized says the whole
// request went into the writer, so that a failure of its first write left it whole in the
// writer's buffer (notSent).
func (x *flight) write(raw []byte) (serialized bool) {
	c := x.c
	c.cw.start()
	bw := writers.Get().(*bufio.Writer)
	bw.Reset(&c.cw)
	var werr error
	if raw != nil {
		_, werr = bw.Write(raw)
	} else {
		var w io.Writer = bw
		if x.req.ContentLength > 0 && x.req.ContentLength <= writerSize/2 {
			w = oneWrite{bw}
		}
		werr = x.req.Write(w)
		if x.req.Body != nil {
			_ = x.req.Body.Close()
		}
	}
	serialized = werr == nil
	if werr == nil {
		werr = bw.Flush()
	}
	bw.Reset(nil)
	writers.Put(bw)
	x.werr = werr
	return serialized
}

// notSent returns the error of a request the connection failed before any byte of it left:
// nothing can answer it, and RoundTrip may send it again. Nil when a byte left, or when the
// failure was the connection's own deadline or a cancellation: those end the request.
func (x *flight) notSent(serialized bool) *notSent {
	cw := &x.c.cw
	if x.werr == nil || cw.written != 0 || cw.err == nil || isTimeout(cw.err) {
		return nil
	}
	ns := &notSent{err: cw.err, reused: x.c.reusedAfter > 0}
	if serialized {
		ns.raw = cw.unsent // the whole request: the failed write was its only one
	}
	return ns
}

// readHead reads the answer's headers, skipping interim answers, within
// MaxResponseHeaderBytes. After a failed write, only an answer already on its way can stand
// (an early 413): a request body that failed mid-write leaves the upstream waiting for the
// rest, and no answer comes, so it is awaited briefly, and a failure then is the write's.
func (x *flight) readHead() (res *http.Response, doubt bool, err error) {
	c, limit := x.c, x.t.o.MaxResponseHeaderBytes
	if x.werr != nil {
		_ = c.nc.SetReadDeadline(time.Now().Add(earlyAnswerWait))
	}
	c.lr.n = limit
	res, doubt, err = readResponse(c.br, x.req)
	silent := c.lr.n == limit // not a byte of an answer came
	c.lr.n = unlimited
	if err == nil {
		return res, doubt, nil
	}
	if x.werr != nil {
		err = x.werr
	}
	if silent && x.ctx.Err() == nil && !isTimeout(err) {
		x.t.closedByUpstream(c)
	}
	return nil, false, err
}

// fail ends a failed exchange: the hook removed, the connection closed, and the error saying
// whether the request was cancelled, timed out or failed.
func (x *flight) fail(err error) error {
	x.stop()
	x.c.close()
	if ctxErr := x.ctx.Err(); ctxErr != nil {
		return fmt.Errorf("upstream: %w", ctxErr)
	}
	if !x.deadline.IsZero() && (isTimeout(err) || !time.Now().Before(x.deadline)) {
		// Past the deadline, whatever the error says: a header line cut short by the
		// deadline reads as a malformed one, not as a timeout.
		return fmt.Errorf("upstream: no response headers within %v: %w (%w)", x.t.o.ResponseHeaderTimeout, os.ErrDeadlineExceeded, err)
	}
	return fmt.Errorf("upstream: %w", err)
}

// handOver gives res its body, which ends the exchange when it is read or closed: the
// connection then goes back to the pool or closes.
func (x *flight) handOver(res *http.Response, doubt bool) *http.Response {
	c := x.c
	if x.werr != nil || doubt {
		// The upstream answered before it took the whole request (an early 413, say) and
		// stopped reading: its answer stands, and the connection is done. Or the answer's
		// framing is in doubt: it is read as RFC 9112 says, and the connection is not
		// trusted with another.
		res.Close = true
	}
	// The headers are in; the body may take as long as the client keeps reading (streams).
	if (x.t.o.ResponseHeaderTimeout > 0 || x.werr != nil) && !buffered(res, c.br) {
		// (A body already in the buffer is read without touching the connection, and the
		// next exchange sets its own deadline: one runtime timer update saved per
		// short answer.)
		_ = c.nc.SetReadDeadline(time.Time{})
	}
	// ctx.Err() turns non-nil before the cancellation hook runs: a request cancelled by now
	// never gives its connection back, whether or not the hook has run.
	cancelled := x.ctx.Err() != nil
	if cancelled {
		// Cancelled between the read and the line above, whose deadline undid the hook's:
		// put it back. (A later cancellation runs the hook after this point.)
		_ = c.nc.SetDeadline(aLongTimeAgo)
	}
	b := &body{ReadCloser: res.Body, t: x.t, c: c, stop: x.stop, reuse: !res.Close && !x.req.Close && x.werr == nil && !cancelled,
		chunked: len(res.TransferEncoding) > 0}
	if res.Body == http.NoBody {
		b.release(true)
		return res
	}
	res.Body = b
	return res
}

// earlyAnswerWait is how long an answer is awaited after writing the request failed.
const earlyAnswerWait = 50 * time.Millisecond

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// body is a response body; reading it to its end gives the connection back to the pool.
type body struct {
	io.ReadCloser
	t        *Transport
	c        *conn
	stop     func() bool // removes the cancellation hook; false once it has run
	reuse    bool
	chunked  bool
	released atomic.Bool
}

// Ready reports whether the first Read will return data without waiting on the connection:
// the upstream has already sent it (for a chunked body, a whole chunk-size line and at least
// a byte of its chunk). Call it before the first Read. A proxy uses it to send the response
// headers together with the first data, or on their own at once when that is still to come.
func (b *body) Ready() bool {
	br := b.c.br
	n := br.Buffered()
	if n == 0 {
		return false
	}
	if !b.chunked {
		return true
	}
	head, _ := br.Peek(n) // only what is buffered: no I/O
	i := bytes.IndexByte(head, '\n')
	if i < 0 {
		return false
	}
	line := bytes.TrimRight(head[:i], "\r")
	if j := bytes.IndexByte(line, ';'); j >= 0 {
		line = line[:j] // chunk extensions
	}
	size, err := strconv.ParseUint(string(bytes.TrimSpace(line)), 16, 63)
	return err == nil && size > 0 && n > i+1
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
