package proxy

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/docsgate/gateway/apierror"
	"github.com/docsgate/gateway/internal/bufpool"
	"github.com/docsgate/gateway/validate"
)

// bodyReader reads requests' bodies in whole before anything is decided on them, within
// server.read_body_timeout, into buffers pooled for streamed routes (whose bodies stay until
// the upstream has them).
type bodyReader struct {
	timeout time.Duration
	pool    bufpool.Classes
}

// read enforces the size cap and content type, reads the whole body within the body timeout,
// validates it against the route's rules and leaves it in place for replay, byte for byte. It
// answers the request itself and returns false when the body is refused.
func (br *bodyReader) read(s *scope, r *http.Request) bool {
	rt := s.route
	if r.ContentLength > s.snap.maxBody {
		tooLarge(s)
		return false
	}
	if rt.validate != nil && !validate.IsJSON(r.Header.Get("Content-Type")) {
		s.fail(http.StatusUnsupportedMediaType, apierror.Body{
			Error: "Unsupported Content-Type: send the body as application/json.",
			Code:  apierror.UnsupportedMediaType,
		})
		return false
	}
	if len(r.TransferEncoding) > 0 {
		// net/http has already dropped any Content-Length that came with Transfer-Encoding
		// (RFC 9112 6.1), so a smuggling attempt cannot be told from an honest chunked body
		// here. Closing the connection after answering any chunked request keeps whatever
		// followed the body from being read as a second request.
		s.closeAfter()
	}
	var body []byte
	if r.ContentLength != 0 || len(r.TransferEncoding) > 0 {
		var ok bool
		if body, ok = br.readWhole(s, r); !ok {
			return false
		}
	}
	s.bodyUnread = false
	s.bodyBytes = len(body)
	s.promptBytes = len(body)
	if rt.validate != nil {
		text, err := rt.validate(body)
		if err != nil {
			rejectBody(s, err)
			return false
		}
		s.promptBytes = text
	}
	br.replace(s, r, body)
	return true
}

// readWhole reads the request's body within the read timeout and the size bound; a refusal
// is answered, and reported by ok false.
func (br *bodyReader) readWhole(s *scope, r *http.Request) (body []byte, ok bool) {
	if !s.http1 {
		// HTTP/1 bodies are bounded from the request's arrival (ServeHTTP).
		setReadDeadline(s.rw.ResponseWriter, time.Now().Add(br.timeout))
	}
	s.inBody = nil // read here: a refusal from now on closes the connection, no second drain
	var buf []byte
	if s.route.Stream {
		buf = br.pool.Get(bodyBufferSize(r.ContentLength, s.snap.maxBody))
	}
	body, err := readAll(r.Body, r.ContentLength, s.snap.maxBody, buf)
	switch {
	case errors.Is(err, errTooLarge):
		tooLarge(s)
		return nil, false
	case errors.Is(err, os.ErrDeadlineExceeded):
		s.fail(http.StatusRequestTimeout, apierror.Body{
			Error: "The request body did not arrive in time.",
			Code:  apierror.RequestTimeout,
		})
		return nil, false
	case err != nil:
		if r.Context().Err() != nil {
			return nil, false // the client went away; there is nobody to answer
		}
		s.fail(http.StatusBadRequest, apierror.Body{Error: "The request body could not be read.", Code: apierror.InvalidRequest})
		return nil, false
	}
	// The whole body is in: clear the deadline, since a streamed answer may run far longer
	// than the body took. (On the refusals above it stays, so nothing can block on the rest
	// of the body.)
	setReadDeadline(s.rw.ResponseWriter, time.Time{})
	return body, true
}

// replace makes the body read into memory the one the upstream request sends.
func (br *bodyReader) replace(s *scope, r *http.Request, body []byte) {
	if s.route.Stream {
		s.body.reset(body, &br.pool)
		r.Body = &s.body
	} else {
		// A body net/http knows to be in memory (io.NopCloser over a bytes.Reader) goes out in
		// the same write as the request's headers; any other is sent after a separate flush
		// of the headers, one more system call per request. A stream keeps replayBody, which
		// lets go of the bytes once read instead of holding them for the stream's life.
		s.shortBody.Reset(body)
		r.Body = io.NopCloser(&s.shortBody)
	}
	r.GetBody = nil // a request whose body was not read yet is retried without it
	r.ContentLength = int64(len(body))
	r.TransferEncoding = nil
	if len(body) == 0 {
		r.Body = http.NoBody
	}
}

func tooLarge(s *scope) {
	s.fail(http.StatusRequestEntityTooLarge, apierror.Body{
		Error: fmt.Sprintf("The request body is larger than the limit of %d bytes.", s.snap.maxBody),
		Code:  apierror.PayloadTooLarge,
	})
}

func rejectBody(s *scope, err error) {
	var ve *validate.Error
	field, code := "", s.route.bodyCode
	if errors.As(err, &ve) {
		field = ve.Field
		if ve.CaseFolded {
			// A known field in a spelling a case-insensitive decoder takes for it: what the
			// upstream would read is not what was checked.
			code = apierror.InvalidBody
		}
	}
	s.field = field
	s.route.metrics.ValidationRejected(validate.FoldIndexes(field))
	s.fail(http.StatusBadRequest, apierror.Body{Error: "Invalid request: " + err.Error() + ".", Code: code, Field: field})
}

var errTooLarge = errors.New("body too large")

// setReadDeadline is http.ResponseController.SetReadDeadline without allocating a controller
// per request; the server's writers (HTTP/1 and HTTP/2) implement it directly.
func setReadDeadline(w http.ResponseWriter, t time.Time) {
	if d, ok := w.(interface{ SetReadDeadline(time.Time) error }); ok {
		_ = d.SetReadDeadline(t)
		return
	}
	_ = http.NewResponseController(w).SetReadDeadline(t)
}

// bodyBufferSize is the capacity readAll needs for a body: its declared length plus the one
// byte that tells a body longer than declared, or a first guess when the length is unknown.
func bodyBufferSize(declared, max int64) int64 {
	if declared < 0 || declared > max {
		return 512
	}
	return declared + 1
}

// readAll reads at most max bytes; one byte more means the body is too large. It reads into
// buf when buf is large enough, else into a buffer sized by the declared Content-Length, so
// the common case allocates once or not at all.
func readAll(body io.Reader, declared, max int64, buf []byte) ([]byte, error) {
	if size := bodyBufferSize(declared, max); int64(cap(buf)) < size {
		buf = make([]byte, 0, size)
	}
	buf = buf[:0]
	for {
		if int64(len(buf)) > max {
			return nil, errTooLarge
		}
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			if int64(len(buf)) > max {
				return nil, errTooLarge
			}
			return buf, nil
		}
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				return nil, errTooLarge
			}
			return nil, err
		}
	}
}
