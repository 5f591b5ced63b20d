package h1

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// FuzzPoolAnswer sends a request through the pool to an upstream that answers with the
// fuzzed bytes, then a second request. http.ReadResponse over the same bytes is the oracle:
// the client gets the status and body it reads, or an error when it finds none; and the
// connection goes back to the pool exactly when the answer ended cleanly with nothing after
// it (no leftover or unknown bytes, no Connection: close, no doubt about its framing), which
// shows in whether the second request comes on the same connection. Either way the second
// request gets its own answer.
func FuzzPoolAnswer(f *testing.F) {
	for _, seed := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nWRONG",
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nX-T: 1\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 7\r\n\r\nokWRONG",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
		"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nWRONG",
		"HTTP/1.1 304 Not Modified\r\n\r\n",
		"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\n\r\n",
		"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
		"HTTP/1.1 200 OK\r\n\r\nuntil the end",
		"HTTP/1.1 200 OK\nContent-Length: 2\n\nok",
		"HTTP/1.1 200 OK\r\nContent-Le",
	} {
		f.Add(false, []byte(seed))
		f.Add(true, []byte(seed))
	}
	up := newFuzzUpstream(f)
	f.Fuzz(func(t *testing.T, head bool, answer []byte) {
		method := http.MethodPost
		if head {
			method = http.MethodHead
		}
		want := oracle(method, answer)
		up.next(answer, !want.endsWithConn)
		tr := New(Options{ResponseHeaderTimeout: 2 * time.Second})
		defer tr.Close()
		got := fuzzExchange(t, tr, method, up.url+"/fuzz")
		switch {
		case want.err && got.status != 0 && !got.bodyErr:
			t.Fatalf("the answer is broken (%v) but the pool returned %v", want.why, got)
		case !want.err && got != (outcome{status: want.status, body: want.body}):
			t.Fatalf("got %v, want %d %q", got, want.status, want.body)
		}
		if next := fuzzExchange(t, tr, http.MethodGet, up.url+"/next"); next != (outcome{status: 200, body: "next"}) {
			t.Fatalf("the next request got %v", next)
		}
		if reused := up.reused(); reused != want.reusable {
			t.Fatalf("connection reused %t, want %t (%s)", reused, want.reusable, want.why)
		}
	})
}

// answerOracle is what http.ReadResponse makes of an answer read from memory.
type answerOracle struct {
	err      bool // no answer, or its body broke
	status   int
	body     string
	reusable bool   // it ended cleanly, nothing after it, the connection may serve another
	why      string // why not, for messages
	// endsWithConn: the answer is cut short, or its body runs to the end of the
	// connection, so the upstream must close for the client to see its end. After any other
	// answer the upstream keeps the connection open, where a pool that wrongly reused it
	// would read what follows as the next answer.
	endsWithConn bool
}

func oracle(method string, answer []byte) answerOracle {
	// First as the pool meets it on a connection kept open: an answer that needs more than
	// its bytes would wait, so the upstream must close after it. Then, for those, as the
	// pool meets it on a connection closed after the bytes.
	if o, complete := parseAnswer(method, answer, errNoMoreYet); complete {
		return o
	}
	o, _ := parseAnswer(method, answer, io.EOF)
	o.reusable, o.endsWithConn = false, true
	if o.why == "" {
		o.why = "the answer ends with the connection"
	}
	return o
}

var errNoMoreYet = errors.New("nothing more yet")

// parseAnswer reads answer with the pool's response reader, and the connection giving end
// after its bytes. complete is false when the reading came to the end.
func parseAnswer(method string, answer []byte, end error) (o answerOracle, complete bool) {
	req, _ := http.NewRequest(method, "http://upstream/fuzz", nil)
	r := &endReader{r: bytes.NewReader(answer), end: end}
	br := bufio.NewReaderSize(r, 4<<10) // the pool's buffer size: a longer head is not checked
	res, doubt, err := readResponse(br, req)
	if err != nil {
		return answerOracle{err: true, why: err.Error()}, !r.hit
	}
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return answerOracle{err: true, why: err.Error()}, !r.hit
	}
	o = answerOracle{status: res.StatusCode, body: string(b), reusable: true}
	switch left := br.Buffered() + r.r.Len(); {
	case res.Close:
		o.reusable, o.why = false, "Connection: close, or a body that ends with the connection"
	case doubt:
		o.reusable, o.why = false, "framing in doubt"
	case left > 0:
		o.reusable, o.why = false, "bytes after the answer"
	}
	return o, !r.hit
}

// endReader reads r, then fails with end, and tells whether it did.
type endReader struct {
	r   *bytes.Reader
	end error
	hit bool
}

func (e *endReader) Read(p []byte) (int, error) {
	if e.r.Len() == 0 {
		e.hit = true
		return 0, e.end
	}
	return e.r.Read(p)
}

func fuzzExchange(t *testing.T, tr http.RoundTripper, method, url string) outcome {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, method, url, nil)
	res, err := tr.RoundTrip(req)
	if err != nil {
		if ctx.Err() != nil {
			t.Fatalf("%s %s hung", method, url)
		}
		return outcome{}
	}
	b, err := io.ReadAll(res.Body)
	res.Body.Close()
	if ctx.Err() != nil {
		t.Fatalf("%s %s: the body hung", method, url)
	}
	return outcome{status: res.StatusCode, body: string(b), bodyErr: err != nil}
}

// fuzzUpstream answers /fuzz with the current input, then keeps the connection for /next
// when the answer is whole and clean, or closes it (an answer that ends with the connection,
// or a broken one the pool would otherwise wait on); /next gets 200 "next".
type fuzzUpstream struct {
	url string

	mu        sync.Mutex
	answer    []byte
	keep      bool
	fuzzConn  net.Conn
	nextOnOld bool
}

func newFuzzUpstream(f *testing.F) *fuzzUpstream {
	u := &fuzzUpstream{}
	u.url = rawServer(f, u.serve)
	return u
}

// next sets the answer to the next /fuzz request.
func (u *fuzzUpstream) next(answer []byte, keep bool) {
	u.mu.Lock()
	u.answer, u.keep, u.fuzzConn, u.nextOnOld = answer, keep, nil, false
	u.mu.Unlock()
}

// reused reports whether /next came on the connection /fuzz was answered on.
func (u *fuzzUpstream) reused() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.nextOnOld
}

func (u *fuzzUpstream) serve(c net.Conn, br *bufio.Reader) {
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, req.Body)
		u.mu.Lock()
		answer, keep := u.answer, u.keep
		if strings.HasSuffix(req.URL.Path, "/fuzz") {
			u.fuzzConn = c
		} else {
			u.nextOnOld = u.fuzzConn == c
			answer, keep = []byte("HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nnext"), true
		}
		u.mu.Unlock()
		if _, err := c.Write(answer); err != nil || !keep {
			return
		}
	}
}
