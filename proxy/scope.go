package proxy

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/docsgate/gateway/engine"
	"github.com/docsgate/gateway/internal/bufpool"
	"github.com/docsgate/gateway/internal/writestall"
	"github.com/docsgate/gateway/metrics"
	"github.com/docsgate/gateway/stream"
)

// scope is everything the gateway learns about one request, in one typed value: the pipeline
// fills it, the reverse proxy's hooks read it from the context, and the access log and metrics
// are written from it at the end.
type scope struct {
	snap *snapshot // the config this request started with
	// The flags side by side, in one word (the scope's size class: TestScopeStaysInItsSizeClass).
	// trustedPeer: the TCP peer is a trusted proxy, whose X-Forwarded-For chain is kept.
	trustedPeer bool
	http1       bool // the client speaks HTTP/1.x
	// bodyUnread: the request has a body the gateway has not read (yet). An answer written
	// while it is set first deals with that body (see responseWriter.answering).
	bodyUnread bool
	limited    bool            // the gateway decided limits and owns the rate-limit headers
	limitErr   bool            // the limiter failed (the request was denied or let through per on_error)
	stalled    bool            // the stream was ended for its client's stall (server.write_stall_timeout)
	encoding   stream.Encoding // a streamed answer's content coding (gateway_stream_encoded_total)
	route      *route
	w          *responseWriter // points at rw
	start      time.Time
	requestID  string
	clientIP   netip.Addr
	// clientIPStr caches clientIP.String() (see clientIPString).
	clientIPStr string
	inBody      io.Reader // the request's body as the client sends it
	inLength    int64     // its declared length; -1 when unknown (chunked)
	digest      string    // SHA-256 of the key once auth accepted it; never the key

	// The tenant, once known: org counts assistant_per_org (the key's org in registry mode,
	// else the org of the path's domain), plan picks the limit set.
	org  string
	plan string
	// label is the registered key's label (auth.mode: registry), for notifications.
	label string

	code           string // the gateway's own error code when it answered itself
	field          string // invalid_request: the offending field
	bodyBytes      int
	promptBytes    int    // the body's conversation text, what a prompt's tokens are estimated from
	deniedBy       string // the limit that denied the request
	shadowDenied   string // a shadow limit that would have denied it
	upstreamStatus int
	upstreamKind   string     // set when the upstream exchange failed
	tap            stream.Tap // streamed answers: reads the finish and usage (dataTap or uiTap)
	// adm is what the request owes and holds once admitted (tokens to debit, units a refund
	// gives back, holds and slots to settle); refund names why units were given back.
	adm    engine.Admission
	refund string
	cut    stream.Cutoff // the held limits with cutoff, and whether one ended the answer
	span   trace.Span    // the server span; nil when tracing is off
	// traceIDStr caches the sampled span's trace id in hex (see traceID).
	traceIDStr string

	// Storage that lives as long as the request, so the hot path allocates less: the
	// response writer wrapper, the header values, the replayed body and the log fields.
	rw           responseWriter
	upBody       upstreamBody
	dataTap      stream.DataStream
	uiTap        stream.UIMessageStream
	tapBody      stream.Body
	progress     stream.Progress // what the answer passed, for the refreshes of its holds
	hdrValues    [slotCount]string
	body         replayBody    // a stream's request body
	shortBody    bytes.Reader  // the request body of other routes
	answer       replayBody    // a short upstream answer, read whole before it is sent
	orgMetrics   *metrics.Org  // routes with {domain}: the org's series
	forwarded    time.Duration // when the request was forwarded, after start (the scope keeps one clock reading)
	upstreamTime time.Duration // to response headers
}

type scopeKey struct{}

func scopeFrom(ctx context.Context) *scope {
	s, _ := ctx.Value(scopeKey{}).(*scope)
	return s
}

// Header names in canonical form (as net/http writes them anyway), so that setting them on the
// hot path does not allocate a canonicalized copy each time.
const (
	// requestIDHeader is created when absent and returned to the client.
	requestIDHeader = "X-Request-Id"
	hdrRateLimit    = "Ratelimit"
	hdrPolicy       = "Ratelimit-Policy"
	hdrLimit        = "Ratelimit-Limit"
	hdrRemaining    = "Ratelimit-Remaining"
	hdrReset        = "Ratelimit-Reset"
	hdrRetryAfter   = "Retry-After"
)

// requestID keeps a client's id when it is a sane token, so traces join up across systems;
// anything else is replaced rather than echoed into logs and headers.
func requestID(r *http.Request) string {
	if id := r.Header.Get(requestIDHeader); id != "" && len(id) <= 128 && isVisibleASCII(id) {
		return id
	}
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Go >= 1.24
	return hex.EncodeToString(b[:])
}

func isVisibleASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] <= ' ' || s[i] > '~' || s[i] == '"' || s[i] == '\\' {
			return false
		}
	}
	return true
}

// responseWriter records what was sent for logs and metrics. It implements Flush and Unwrap
// so that http.ResponseController, and with it ReverseProxy's streaming, reaches the
// connection without any buffering in between.
type responseWriter struct {
	http.ResponseWriter
	scope     *scope // the request it answers
	status    int
	bytes     int64
	firstByte time.Time
	// firstFlushAside: the first flush of a stream's answer, which writes its headers, is
	// done by flushAside. Set for a stream's answer.
	firstFlushAside bool
	// withFirstPart: the stream's first part was already there with its headers: they go
	// out together, in the flush after the first write (see FlushError).
	withFirstPart bool
	// ended: the upstream's body ended in the read that brought the last part, so the
	// answer ends as soon as that is written: net/http's end of the response (which writes
	// the last chunk) sends it, in the same write, instead of a flush of its own. Atomic: the
	// copy loop sets it while ReverseProxy's flush timer may read it.
	ended atomic.Bool
	// watch ends a stream whose client stops accepting its bytes (server.write_stall_timeout).
	watch writestall.Watch
}

var _ http.Flusher = (*responseWriter)(nil)

func (w *responseWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
		w.answering()
	}
	w.ResponseWriter.WriteHeader(code)
	if w.firstFlushAside && !w.withFirstPart && code >= 200 {
		// The first part is still to come: the headers go out at once, on their own.
		_ = w.FlushError()
	}
}

// flushAside flushes from a goroutine of its own and waits for it. A stream's first flush
// writes its headers, which takes net/http about 4 KiB of stack (its header writer alone has a
// 2.8 KiB frame, then a sort), and ReverseProxy flushes deep in its own call chain: on the
// handler's goroutine that doubled the stack from 8 to 16 KiB, which a stream then holds,
// idle, for as long as it stays open. The helper's stack is freed when it exits. The caller
// waits, so the writer is never used by two goroutines at once.
func (w *responseWriter) flushAside() error {
	done := make(chan error, 1)
	go func() { done <- w.flush() }()
	return <-done
}

func (w *responseWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
		w.answering()
	}
	if w.bytes == 0 && len(p) > 0 {
		w.firstByte = time.Now()
	}
	if !w.watch.On() {
		n, err := w.ResponseWriter.Write(p)
		w.bytes += int64(n)
		return n, err
	}
	w.watch.Begin()
	n, err := w.ResponseWriter.Write(p)
	w.watch.End()
	w.bytes += int64(n)
	return n, err
}

// answering runs once, as the final answer's status is written: every answer, whoever writes
// it (an error, a preflight, one added later), goes through here, so none can leave a body
// unread without a bound on the wait for it (see scope.dropUnreadBody). Forwarded requests
// have read their body by then: one flag test.
func (w *responseWriter) answering() {
	if s := w.scope; s != nil && s.bodyUnread {
		s.dropUnreadBody()
	}
}

func (w *responseWriter) Flush() { _ = w.FlushError() }

// FlushError is what http.ResponseController (and through it ReverseProxy) calls first: one
// frame less on every streamed part than going through Flush.
//
// A stream's headers go out at once when its first part is still to come (WriteHeader), and
// together with the first part when that was already there (withFirstPart): one write, one
// system call and one packet instead of two, as the upstream sent them. ReverseProxy (with
// FlushInterval -1) also flushes from a timer that fires at once, on another goroutine;
// before the first write that flush would send the headers alone, so it is skipped: the
// copy loop writes and flushes the part without waiting on the network. The timer and the
// copy loop never flush at the same time (ReverseProxy's writer holds a lock around both).
func (w *responseWriter) FlushError() error {
	if (w.withFirstPart && w.bytes == 0) || w.ended.Load() {
		return nil
	}
	if !w.watch.On() {
		return w.flushNow()
	}
	w.watch.Begin()
	err := w.flushNow()
	w.watch.End()
	return err
}

// flushNow sends what is buffered: the first flush of a stream aside (see flushAside).
func (w *responseWriter) flushNow() error {
	if w.firstFlushAside {
		w.firstFlushAside = false
		return w.flushAside()
	}
	return w.flush()
}

func (w *responseWriter) flush() error {
	if f, ok := w.ResponseWriter.(interface{ FlushError() error }); ok {
		return f.FlushError()
	}
	return http.NewResponseController(w.ResponseWriter).Flush()
}

func (w *responseWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Slots of scope.hdrValues.
const (
	slotRequestID = iota
	slotPolicy
	slotRateLimit
	slotLimit
	slotRemaining
	slotReset
	slotForwardedFor
	slotForwardedHost
	slotForwardedProto
	slotCount
)

// header sets a canonical header key to one value, backed by the scope's storage.
func (s *scope) header(h http.Header, i int, key, value string) {
	s.hdrValues[i] = value
	h[key] = s.hdrValues[i : i+1 : i+1]
}

// replayBody hands the validated body to the reverse proxy byte for byte, and lets go of the
// bytes once the last of them is read (back to pool, when they came from one), so a long
// stream does not hold its request body for its whole life. It cannot wait for Close:
// httputil.ReverseProxy hands the transport a wrapper whose Close does nothing, so neither
// side's Close reaches it. Nothing reads the body twice: GetBody is nil, so the transport never
// replays it, and nothing else keeps a reference (the validators return only an error). Close
// may come from another goroutine than Read (a transport used without ReverseProxy closes
// the body when its write fails while the handler goes on): a per-request mutex keeps that
// from racing.
type replayBody struct {
	mu   sync.Mutex
	data []byte
	off  int
	pool *bufpool.Classes // where data goes back once read; nil: nowhere
}

// reset makes b hand out data, which goes back to pool (if not nil) once read.
func (b *replayBody) reset(data []byte, pool *bufpool.Classes) {
	b.mu.Lock()
	b.data, b.off, b.pool = data, 0, pool
	b.mu.Unlock()
}

func (b *replayBody) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.off >= len(b.data) {
		b.release()
		return 0, io.EOF
	}
	n := copy(p, b.data[b.off:])
	b.off += n
	if b.off == len(b.data) {
		// The last byte is out: let the buffer go now rather than on the EOF read, which a
		// reader that knows the length (the transport, with ContentLength set) may never make.
		b.release()
		return n, io.EOF
	}
	return n, nil
}

// release drops the bytes, into the pool when they came from one. b.mu is held.
func (b *replayBody) release() {
	if b.pool != nil && b.data != nil {
		b.pool.Put(b.data)
	}
	b.data, b.off, b.pool = nil, 0, nil
}

func (b *replayBody) Close() error {
	b.reset(nil, nil)
	return nil
}

// clientIPString formats the client address once per request.
func (s *scope) clientIPString() string {
	if s.clientIPStr == "" && s.clientIP.IsValid() {
		s.clientIPStr = s.clientIP.String()
	}
	return s.clientIPStr
}
