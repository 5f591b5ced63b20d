package proxy

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"time"
)

// Error codes: a stable, documented vocabulary that clients and dashboards can rely on.
const (
	codeMissingCredentials   = "missing_credentials"
	codeInvalidCredentials   = "invalid_credentials"
	codeWrongKeyType         = "wrong_key_type"
	codeInvalidRequest       = "invalid_request"
	codeInvalidBody          = "invalid_body"
	codeUnsupportedMediaType = "unsupported_media_type"
	codePayloadTooLarge      = "payload_too_large"
	codeRequestTimeout       = "request_timeout"
	codeNotFound             = "not_found"
	codeMethodNotAllowed     = "method_not_allowed"
	codeUpstreamUnavailable  = "upstream_unavailable"
	codeUpstreamTimeout      = "upstream_timeout"
	codeRateLimited          = "rate_limited"
	codeLimiterUnavailable   = "limiter_unavailable"
	codeForbidden            = "forbidden"
	codeAuthUnavailable      = "auth_unavailable"
	codeTooManyAuthFailures  = "too_many_auth_failures"
	codeUpgradeNotSupported  = "upgrade_not_supported"
)

// errorBody keeps the platform's own shape, {"error": "..."}, which existing clients (and the
// browser chat hook, which shows it to the user) read, plus a stable code.
type errorBody struct {
	Error      string `json:"error"`
	Code       string `json:"code"`
	Field      string `json:"field,omitempty"`
	Limit      string `json:"limit,omitempty"`
	RetryAfter *int64 `json:"retry_after,omitempty"`
}

// writeError is the one place the gateway writes an error of its own.
func writeError(w http.ResponseWriter, status int, body errorBody) {
	data, err := json.Marshal(body)
	if err != nil { // cannot happen for this struct; keep the answer well-formed anyway
		data = []byte(`{"error":"Internal error.","code":"internal"}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json; charset=utf-8")
	h.Set("Content-Length", strconv.Itoa(len(data)+1))
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(append(data, '\n'))
}

// fail answers the request with the gateway's own error and records the code for the log.
// The writer deals with a body still unread (responseWriter.answering).
func (s *scope) fail(status int, body errorBody) {
	s.code = body.Code
	writeError(s.w, status, body)
}

// dropUnreadBody is for answers given while (part of) the request body is still unread.
// net/http would otherwise read and discard the rest before answering and again when the
// handler returns, with no deadline: a client that stops sending would never get its answer
// and would hold the connection and its goroutines for good. A small body that arrives at
// once is read and discarded, and the connection kept, so browsers and SDKs need not
// reconnect after a refusal; any other (large, slow, chunked) closes the connection after the
// answer, with the read deadline already past, which skips both reads. HTTP/2 needs neither
// (the stream is reset) and forbids the Connection header. It runs once per request, from
// responseWriter.answering, before the answer's status is written.
func (s *scope) dropUnreadBody() {
	s.bodyUnread = false // dealt with here, once
	if !s.http1 {
		return
	}
	if s.drainSmallBody() {
		return
	}
	s.closeAfter()
	setReadDeadline(s.rw.ResponseWriter, time.Now())
}

// Refused requests keep their connection when the body is at most maxDrain bytes and all of
// it arrives within drainTimeout.
const (
	maxDrain     = 64 << 10
	drainTimeout = 500 * time.Millisecond
)

// drainSmallBody reads and discards the rest of a small body of declared length, within
// drainTimeout, and reports whether all of it came. Chunked bodies are not drained: their
// connection closes after the answer anyway (see readBody).
func (s *scope) drainSmallBody() bool {
	if s.inBody == nil || s.inLength <= 0 || s.inLength > maxDrain {
		return false
	}
	setReadDeadline(s.rw.ResponseWriter, time.Now().Add(drainTimeout))
	n, err := io.Copy(io.Discard, io.LimitReader(s.inBody, maxDrain+1))
	if err != nil || n != s.inLength {
		return false
	}
	setReadDeadline(s.rw.ResponseWriter, time.Time{})
	return true
}

// closeAfter asks for the HTTP/1 connection to be closed after this answer.
func (s *scope) closeAfter() {
	if s.http1 {
		s.w.Header()["Connection"] = connectionClose
	}
}

// connectionClose is the Connection header value, shared read-only by requests.
var connectionClose = []string{"close"}
