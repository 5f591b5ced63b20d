package proxy

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/limits"
	"github.com/docsgate/gateway/metrics"
)

// recorder is a ResponseWriter that records the order of header, write and flush calls,
// from whichever goroutine makes them.
type recorder struct {
	mu     sync.Mutex
	h      http.Header
	events []string
	flushd chan struct{} // closed at the first flush
	once   sync.Once
}

func newRecorder() *recorder { return &recorder{h: http.Header{}, flushd: make(chan struct{})} }

func (r *recorder) add(e string) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}
func (r *recorder) Header() http.Header             { return r.h }
func (r *recorder) WriteHeader(int)                 { r.add("header") }
func (r *recorder) Write(p []byte) (int, error)     { r.add("write"); return len(p), nil }
func (r *recorder) SetReadDeadline(time.Time) error { return nil }
func (r *recorder) Flush() {
	r.add("flush")
	r.once.Do(func() { close(r.flushd) })
}

func (r *recorder) seq() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return strings.Join(r.events, " ")
}

// readyBody says its data is there, as h1's bodies do when the upstream sent it with the
// headers.
type readyBody struct{ io.Reader }

func (readyBody) Ready() bool  { return true }
func (readyBody) Close() error { return nil }

// gatedBody returns its data once open is closed.
type gatedBody struct {
	open chan struct{}
	r    io.Reader
}

func (b *gatedBody) Read(p []byte) (int, error) { <-b.open; return b.r.Read(p) }
func (b *gatedBody) Close() error               { return nil }

type streamTransport struct{ body func() io.ReadCloser }

func (t streamTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	_, _ = io.Copy(io.Discard, req.Body)
	return &http.Response{StatusCode: 200, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1, ContentLength: -1,
		Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: t.body(), Request: req}, nil
}

func serveStream(t *testing.T, body func() io.ReadCloser, w http.ResponseWriter) {
	t.Helper()
	cfg := config.Defaults()
	cfg.Upstream.URL = "http://upstream.invalid:9000"
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	gw, err := newTestGateway(&cfg, limits.NewMemory(), metrics.New(prometheus.NewRegistry()), nil, streamTransport{body})
	if err != nil {
		t.Fatal(err)
	}
	req := httptest.NewRequest("POST", "/discovery/v2/assistant/acme/message",
		strings.NewReader(`{"fp":"a","messages":[{"id":"1","role":"user","parts":[{"type":"text","text":"hi"}]}]}`))
	req.Header = jsonHdr(assistantKey)
	gw.ServeHTTP(w, req)
}

// A stream whose first part is already there when the headers are: headers and part are
// flushed together (one write to the client), not the headers on their own first; a body
// that cannot tell gets its headers flushed at once.
func TestStreamHeadersGoOutWithTheFirstPart(t *testing.T) {
	const stream = "data: {\"type\":\"start\"}\n\ndata: [DONE]\n\n"
	for range 20 { // ReverseProxy's timer races the copy loop: it must never win
		rec := newRecorder()
		serveStream(t, func() io.ReadCloser { return readyBody{strings.NewReader(stream)} }, rec)
		seq := rec.seq()
		if i, j := strings.Index(seq, "flush"), strings.Index(seq, "write"); !strings.HasPrefix(seq, "header") || j < 0 || i < j {
			t.Fatalf("calls %q: the headers were flushed before the first part was written", seq)
		}
	}
	rec := newRecorder()
	serveStream(t, func() io.ReadCloser { return io.NopCloser(strings.NewReader(stream)) }, rec)
	if seq := rec.seq(); !strings.HasPrefix(seq, "header flush") || !strings.Contains(seq, "write") {
		t.Fatalf("calls %q: a body that cannot tell whether its data is there gets its headers flushed at once", seq)
	}
}

// A stream whose first part is slow: the headers are flushed at once, before it comes.
func TestStreamHeadersFlushedWhileTheFirstPartWaits(t *testing.T) {
	rec := newRecorder()
	open := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		serveStream(t, func() io.ReadCloser {
			return &gatedBody{open: open, r: strings.NewReader("data: {\"type\":\"start\"}\n\n")}
		}, rec)
	}()
	select {
	case <-rec.flushd:
	case <-time.After(5 * time.Second):
		close(open)
		<-done
		t.Fatalf("no flush while the first part waited: %q", rec.seq())
	}
	if seq := rec.seq(); !strings.HasPrefix(seq, "header flush") || strings.Contains(seq, "write") {
		t.Fatalf("calls before the first part: %q, want the headers flushed", seq)
	}
	close(open)
	<-done
}

// lastWithEOF returns all its data in one Read together with io.EOF, as a chunked body does
// when the terminating chunk came in the same read as the last data.
type lastWithEOF struct {
	data string
	done bool
}

func (b *lastWithEOF) Read(p []byte) (int, error) {
	if b.done {
		return 0, io.EOF
	}
	b.done = true
	return copy(p, b.data), io.EOF
}
func (*lastWithEOF) Close() error { return nil }
func (*lastWithEOF) Ready() bool  { return true }

// A last part that comes with the end of the body is not flushed on its own: the answer's
// end, right after it, sends both in one write. A part whose end is still to come is flushed
// at once.
func TestStreamLastPartGoesOutWithTheEnd(t *testing.T) {
	const stream = "data: {\"type\":\"start\"}\n\ndata: [DONE]\n\n"
	rec := newRecorder()
	serveStream(t, func() io.ReadCloser { return &lastWithEOF{data: stream} }, rec)
	if seq := rec.seq(); strings.Contains(seq, "flush") || !strings.Contains(seq, "write") {
		t.Fatalf("calls %q: the part that came with the end was flushed on its own", seq)
	}
	rec = newRecorder()
	serveStream(t, func() io.ReadCloser { return readyBody{strings.NewReader(stream)} }, rec)
	if seq := rec.seq(); !strings.HasPrefix(seq, "header write flush") {
		t.Fatalf("calls %q: a part whose end is still to come must be flushed at once", seq)
	}
}
