package h1

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkRoundTrip is one exchange as the gateway makes it: a POST of a chat-sized body
// (2 KiB, known length), the answer read whole, the connection back to the pool.
//
//   - loopback: against a real net/http server on 127.0.0.1, what the gateway meets; most of
//     its time is the server's and the kernel's.
//
//   - canned: on an in-memory connection that answers each request with the same bytes at
//     once, so that ns/op, B/op and allocs/op are the pool's own work (exchange, and
//     net/http's writing of the request and parsing of the answer) without a server and a
//     scheduler beside it, whose noise would hide a few nanoseconds.
//
//     go test -run '^$' -bench BenchmarkRoundTrip -benchmem ./h1/
func BenchmarkRoundTrip(b *testing.B) {
	body := bytes.Repeat([]byte("x"), 2<<10)
	const answer = `{"id":"job_1","status":"queued"}`
	b.Run("loopback", func(b *testing.B) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, answer)
		}))
		b.Cleanup(srv.Close)
		tr := New(Options{})
		b.Cleanup(tr.Close)
		roundTrips(b, tr, srv.URL, body, answer)
	})
	b.Run("canned", func(b *testing.B) {
		var dials atomic.Int64
		head := "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: " + strconv.Itoa(len(answer)) + "\r\n\r\n"
		tr := New(Options{DialContext: func(context.Context, string, string) (net.Conn, error) {
			dials.Add(1)
			return &cannedConn{answer: []byte(head + answer)}, nil
		}})
		b.Cleanup(tr.Close)
		roundTrips(b, tr, "http://upstream.invalid", body, answer)
		if n := dials.Load(); n != 1 {
			b.Fatalf("%d connections dialled, want 1 kept alive", n)
		}
	})
}

func roundTrips(b *testing.B, tr *Transport, url string, body []byte, answer string) {
	buf := make([]byte, 4<<10)
	one := func() {
		req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		res, err := tr.RoundTrip(req)
		if err != nil {
			b.Fatal(err)
		}
		n, err := io.ReadFull(res.Body, buf[:len(answer)])
		if err == nil {
			_, err = res.Body.Read(buf) // io.EOF: the body read to its end, the connection back
		}
		if err != io.EOF || string(buf[:n]) != answer {
			b.Fatalf("answer %q: %v", buf[:n], err)
		}
		res.Body.Close()
	}
	one() // the connection dialled before the timing starts
	b.ReportAllocs()
	for b.Loop() {
		one()
	}
}

// cannedConn is an in-memory connection whose every write of a request is answered with
// answer at once. A request must leave in one write (a body of known length of up to half a
// writer does), and its answer be read whole before the next.
type cannedConn struct {
	answer  []byte
	pending []byte
	closed  bool
}

func (c *cannedConn) Write(p []byte) (int, error) {
	if c.closed {
		return 0, net.ErrClosed
	}
	if len(c.pending) > 0 {
		return 0, errors.New("cannedConn: a request before the last answer was read")
	}
	c.pending = c.answer
	return len(p), nil
}

func (c *cannedConn) Read(p []byte) (int, error) {
	if c.closed {
		return 0, net.ErrClosed
	}
	if len(c.pending) == 0 {
		return 0, errors.New("cannedConn: a read with no request to answer")
	}
	n := copy(p, c.pending)
	c.pending = c.pending[n:]
	return n, nil
}

func (c *cannedConn) Close() error                     { c.closed = true; return nil }
func (c *cannedConn) LocalAddr() net.Addr              { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }
func (c *cannedConn) RemoteAddr() net.Addr             { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 80} }
func (c *cannedConn) SetDeadline(time.Time) error      { return nil }
func (c *cannedConn) SetReadDeadline(time.Time) error  { return nil }
func (c *cannedConn) SetWriteDeadline(time.Time) error { return nil }
