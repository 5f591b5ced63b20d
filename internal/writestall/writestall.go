// Package writestall ends a response whose client has accepted no byte of it for a bound: a write stuck that long fails.
package writestall

import (
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Watch ends a stream whose client has accepted no byte of it for server.write_stall_timeout:
// a write (or flush) of the stream's answer that has not returned after that long is stuck on
// a client that stopped reading (its TCP window, or its HTTP/2 stream's window, is shut). The
// watch then sets the response's write deadline in the past, which fails that write: on
// HTTP/1 the connection's blocked write returns at once; on HTTP/2 the stream is reset
// (RST_STREAM) and its blocked write returns, and a connection whose peer takes no byte at
// all is closed by the server's WriteByteTimeout (cmd/gateway sets it to the same bound). The
// reverse proxy then aborts the stream like any client that went away: its slot and hold are
// settled, the upstream connection is closed.
//
// Why a watch instead of a deadline refreshed before each write: on HTTP/2 a write deadline is
// a timer that resets the stream when it fires whether or not a write is under way, so it
// would also end a healthy stream whose upstream pauses longer than the bound (a model
// thinking, a tool call); and each refresh would be a message to the connection's goroutine
// and a timer. The watch costs a clock reading and two atomic stores per write, one timer per
// stream, re-armed at most once per bound, and is the same on both protocols.
type Watch struct {
	limit time.Duration // 0: no watch (write_stall_timeout 0, or not a stream)
	rw    http.ResponseWriter
	base  time.Time // a monotonic origin for since
	// since is when the write under way started (nanoseconds after base, plus 1); 0: none.
	since atomic.Int64
	armed atomic.Bool // the timer is set to fire
	fired atomic.Bool // the bound passed under a write: the stream is ended

	mu      sync.Mutex // orders the timer's actions against stop
	stopped bool
	timer   *time.Timer
}

// Start watches the writes to rw (the connection's writer) from now on, with the bound limit
// (0: none).
func (w *Watch) Start(limit time.Duration, rw http.ResponseWriter) {
	w.limit, w.rw, w.base = limit, rw, time.Now()
}

// On says whether the watch is on (Start had a bound): only then must writes be marked.
func (w *Watch) On() bool { return w.limit != 0 }

// Begin marks a write as under way; End marks it done. Only the writer calls them, one write
// at a time (ReverseProxy serialises its writes and flushes).
func (w *Watch) Begin() {
	w.since.Store(int64(time.Since(w.base)) + 1)
	if !w.armed.Load() && w.armed.CompareAndSwap(false, true) {
		w.arm(w.limit)
	}
}

// End marks the write under way done.
func (w *Watch) End() { w.since.Store(0) }

// arm sets the timer to check in d.
func (w *Watch) arm(d time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.stopped:
	case w.timer == nil:
		w.timer = time.AfterFunc(d, w.check)
	default:
		w.timer.Reset(d)
	}
}

// check runs when a write may have been under way for the whole bound: it ends the stream if
// so, waits for the rest of the bound if a later write is under way, and otherwise lets the
// next write arm the watch again (an idle stream sets no timer).
func (w *Watch) check() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	w.armed.Store(false)
	since := w.since.Load()
	if since == 0 {
		return
	}
	if left := w.limit - (time.Since(w.base) - time.Duration(since-1)); left > 0 {
		if w.armed.CompareAndSwap(false, true) {
			w.timer.Reset(left)
		}
		return
	}
	w.fired.Store(true)
	// A deadline in the past fails the blocked write now (both protocols).
	setWriteDeadline(w.rw, time.Unix(1, 0))
}

// Stalled reports whether the watch ended the stream.
func (w *Watch) Stalled() bool { return w.fired.Load() }

// Stop ends the watch; it must run before the handler returns, after which the response's
// writer may no longer be used. What net/http still writes after the handler (the end of the
// answer, and on HTTP/1 the last part with it) is bounded by a write deadline of the same
// limit: HTTP/1 clears it once the response is done, HTTP/2 when the stream closes.
func (w *Watch) Stop() {
	if w.limit == 0 {
		return
	}
	w.mu.Lock()
	w.stopped = true
	if w.timer != nil {
		w.timer.Stop()
	}
	w.mu.Unlock()
	if !w.fired.Load() {
		setWriteDeadline(w.rw, time.Now().Add(w.limit))
	}
}

// setWriteDeadline is http.ResponseController's, without allocating one for net/http's own
// writers (both protocols' have the method).
func setWriteDeadline(w http.ResponseWriter, t time.Time) {
	if d, ok := w.(interface{ SetWriteDeadline(time.Time) error }); ok {
		_ = d.SetWriteDeadline(t)
		return
	}
	_ = http.NewResponseController(w).SetWriteDeadline(t)
}
