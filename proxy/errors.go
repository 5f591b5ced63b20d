package proxy

import (
	"io"
	"time"

	"github.com/docsgate/gateway/apierror"
)

// fail answers the request with the gateway's own error and records the code for the log.
// The writer deals with a body still unread (responseWriter.answering).
func (s *scope) fail(status int, body apierror.Body) {
	s.code = body.Code
	apierror.Write(s.w, status, body)
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
