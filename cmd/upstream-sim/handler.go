package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
)

// simConfig is the behaviour of the simulator; the zero value of each field
// is usable (no pacing, jobs complete at once, no logging).
type simConfig struct {
	// JobCompleteAfter is how long a job stays active after creation (or
	// after its latest follow-up message) before it reads completed.
	JobCompleteAfter time.Duration
	// PartDelay is the pause before each streamed text part; 0 = none.
	PartDelay time.Duration
	// AnswerParts is the number of `0:` text parts in an answer.
	AnswerParts int
	// Stamp prefixes each text part with "<unix-nanos> ".
	Stamp bool
	// Log, when non-nil, receives one line per request.
	Log io.Writer
	// MaxJobs bounds the job store; the oldest jobs are evicted past it.
	// 0 means defaultMaxJobs.
	MaxJobs int
	// Now is the clock; nil means time.Now.
	Now func() time.Time

	// streamDone, when non-nil, is called when an assistant stream handler
	// finishes: the number of text parts written and why it stopped (nil
	// when the whole stream was sent). For tests.
	streamDone func(textParts int, err error)
}

const (
	defaultMaxJobs = 100_000
	maxBodyBytes   = 1 << 20
)

// newHandler returns the simulator's HTTP handler.
func newHandler(cfg simConfig) http.Handler {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.MaxJobs <= 0 {
		cfg.MaxJobs = defaultMaxJobs
	}
	if cfg.AnswerParts < 0 {
		cfg.AnswerParts = 0
	}
	js := &jobService{cfg: cfg, store: newJobStore(cfg.MaxJobs)}
	as := &assistantService{cfg: cfg}

	// Patterns carry no method so that a wrong method on a known path gets a
	// JSON 405 from the handler itself (a method-qualified pattern plus the
	// "/" catch-all would turn every wrong method into a 404).
	mux := http.NewServeMux()
	mux.HandleFunc("/v2/agent/{projectId}/job", onlyMethod(http.MethodPost, js.create))
	mux.HandleFunc("/v2/agent/{projectId}/job/{jobId}", onlyMethod(http.MethodGet, js.get))
	mux.HandleFunc("/v2/agent/{projectId}/job/{jobId}/message", onlyMethod(http.MethodPost, js.message))
	mux.HandleFunc("/discovery/v1/assistant/{domain}/message", onlyMethod(http.MethodPost, as.messageV1))
	mux.HandleFunc("/discovery/v2/assistant/{domain}/message", onlyMethod(http.MethodPost, as.messageV2))
	mux.HandleFunc("/healthz", onlyMethod(http.MethodGet, healthz))
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) {
		writeRaw(w, http.StatusNotFound, errNotFoundBody)
	})

	if cfg.Log != nil {
		return &logHandler{next: mux, out: cfg.Log, now: cfg.Now}
	}
	return mux
}

func healthz(w http.ResponseWriter, _ *http.Request) {
	h := w.Header()
	h["Content-Type"] = textPlain
	w.WriteHeader(http.StatusOK)
	_, _ = io.WriteString(w, "ok")
}

// onlyMethod answers 405 with a JSON body unless the request uses method
// (GET also allows HEAD).
func onlyMethod(method string, next http.HandlerFunc) http.HandlerFunc {
	allow := method
	if method == http.MethodGet {
		allow = "GET, HEAD"
	}
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != method && !(method == http.MethodGet && r.Method == http.MethodHead) {
			w.Header().Set("Allow", allow)
			writeRaw(w, http.StatusMethodNotAllowed, errMethodBody)
			return
		}
		next(w, r)
	}
}

// Pre-built header values and bodies, so the hot path does not allocate them.
var (
	appJSON         = []string{"application/json"}
	textPlain       = []string{"text/plain; charset=utf-8"}
	textEventStream = []string{"text/event-stream"}

	errNotFoundBody    = []byte(`{"error":"Not found"}`)
	errJobNotFoundBody = []byte(`{"error":"Job not found"}`)
	errMethodBody      = []byte(`{"error":"Method not allowed"}`)
	errAuthBody        = []byte(`{"error":"Missing or invalid Authorization header: expected Bearer token"}`)
	errAssistAuthBody  = []byte(`{"error":"Missing or invalid Authorization header: expected Bearer svc_dsc_ assistant API key"}`)
)

// writeRaw writes an already-encoded JSON body.
func writeRaw(w http.ResponseWriter, code int, body []byte) {
	w.Header()["Content-Type"] = appJSON
	w.WriteHeader(code)
	_, _ = w.Write(body)
}

// writeError writes {"error": msg}; msg is plain ASCII text of our own.
func writeError(w http.ResponseWriter, code int, msg string) {
	b := make([]byte, 0, len(msg)+12)
	b = append(b, `{"error":`...)
	b = appendJSONString(b, msg)
	b = append(b, '}')
	writeRaw(w, code, b)
}

// bearerToken returns the token of an "Authorization: Bearer <token>" header,
// or "" when it is missing, of another scheme, or empty.
func bearerToken(r *http.Request) string {
	v := r.Header.Get("Authorization")
	const prefix = "bearer "
	if len(v) <= len(prefix) || !strings.EqualFold(v[:len(prefix)], prefix) {
		return ""
	}
	return strings.TrimSpace(v[len(prefix):])
}

var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

func getBuf() *bytes.Buffer {
	b := bufPool.Get().(*bytes.Buffer)
	b.Reset()
	return b
}

func putBuf(b *bytes.Buffer) {
	if b.Cap() > 64<<10 {
		return // do not keep huge buffers alive
	}
	bufPool.Put(b)
}

// readBody reads the (bounded) request body into a pooled buffer. On error it
// has already answered the request and returns nil.
func readBody(w http.ResponseWriter, r *http.Request) *bytes.Buffer {
	buf := getBuf()
	_, err := buf.ReadFrom(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		putBuf(buf)
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body larger than %d bytes", maxBodyBytes))
		} else {
			writeError(w, http.StatusBadRequest, "could not read request body")
		}
		return nil
	}
	return buf
}

// appendJSONString appends s as a JSON string literal. It escapes what JSON
// requires (quotes, backslash, control characters) and replaces invalid
// UTF-8, like encoding/json but without the HTML escaping.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < 0x80 {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		// U+2028 and U+2029 are valid JSON but break JavaScript; escape them
		// as encoding/json does.
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hex[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// logHandler logs one line per request: method, path, status, bytes, time.
type logHandler struct {
	next http.Handler
	out  io.Writer
	now  func() time.Time
	mu   sync.Mutex
}

func (l *logHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := l.now()
	rec := &statusRecorder{ResponseWriter: w}
	l.next.ServeHTTP(rec, r)
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	line := fmt.Sprintf("%s %s %s %d %dB %s\n",
		start.UTC().Format("2006-01-02T15:04:05.000Z"), r.Method, r.URL.RequestURI(),
		rec.status, rec.bytes, l.now().Sub(start).Round(time.Microsecond))
	l.mu.Lock()
	_, _ = io.WriteString(l.out, line)
	l.mu.Unlock()
}

// statusRecorder remembers the status code and counts body bytes; Unwrap
// keeps http.ResponseController (Flush) working through it.
type statusRecorder struct {
	http.ResponseWriter
	status int
	bytes  int64
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(p []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	n, err := s.ResponseWriter.Write(p)
	s.bytes += int64(n)
	return n, err
}

func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }
