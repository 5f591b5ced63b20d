// Package upstreamtest is a hand-written HTTP/1.1 upstream for tests that break the protocol.
//
// Upstreamtest is a hand-written HTTP/1.1 upstream for tests: it answers each request
// with scripted bytes, then keeps, closes, resets or leaves hanging its connection, so a test
// can meet an upstream that breaks the protocol or hangs up the way real servers do. Nothing
// in between (no net/http server) adds, fixes or drops a byte.
package upstreamtest

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

// Pause is a part that writes nothing and waits 20 ms, so the parts around it arrive apart.
const Pause = "<pause>"

// End says what the upstream does with the connection after an answer's parts.
type End string

const (
	Keep  End = "keep"  // reads the next request on it
	Close End = "close" // closes it (FIN)
	Reset End = "reset" // resets it (RST)
	Hang  End = "hang"  // sends nothing more, until the client closes it
)

// Script gives the answer to a request for path: its parts, written in order, and the end.
type Script func(path string) (parts []string, end End)

// Request is one request the upstream read.
type Request struct {
	Path string
	Conn int // the connection it came on, counted from 1
}

// Upstream is a scripted upstream on a free loopback port; it stops with the test.
type Upstream struct {
	URL    string
	script Script

	mu     sync.Mutex
	seen   []Request
	conns  int
	open   int
	byPeer map[string]*net.TCPConn // open connections by the client's address
}

// Start listens on 127.0.0.1 and serves every connection until the test ends (each one at
// most a minute).
func Start(tb testing.TB, script Script) *Upstream {
	tb.Helper()
	u := &Upstream{script: script, byPeer: map[string]*net.TCPConn{}}
	u.URL = Serve(tb, u.serve)
	return u
}

// Serve runs serve on every connection accepted on a free loopback port, each on its own
// goroutine and closed when serve returns, until the test ends; it returns the URL.
func Serve(tb testing.TB, serve func(c *net.TCPConn)) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	var wg sync.WaitGroup
	tb.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				serve(c.(*net.TCPConn))
			}()
		}
	}()
	return "http://" + ln.Addr().String()
}

func (u *Upstream) serve(c *net.TCPConn) {
	peer := c.RemoteAddr().String()
	u.mu.Lock()
	u.conns++
	u.open++
	id := u.conns
	u.byPeer[peer] = c
	u.mu.Unlock()
	defer func() {
		u.mu.Lock()
		u.open--
		delete(u.byPeer, peer)
		u.mu.Unlock()
	}()
	_ = c.SetDeadline(time.Now().Add(time.Minute))
	br := bufio.NewReader(c)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		if _, err := io.Copy(io.Discard, req.Body); err != nil {
			return
		}
		u.mu.Lock()
		u.seen = append(u.seen, Request{req.URL.Path, id})
		u.mu.Unlock()
		parts, end := u.script(req.URL.Path)
		for _, p := range parts {
			if p == Pause {
				time.Sleep(20 * time.Millisecond)
				continue
			}
			if _, err := io.WriteString(c, p); err != nil {
				return
			}
		}
		switch end {
		case Close:
			return
		case Reset:
			_ = c.SetLinger(0)
			return
		case Hang:
			_, _ = io.Copy(io.Discard, br) // until the client closes
			return
		}
	}
}

// Requests returns the requests read so far, in order.
func (u *Upstream) Requests() []Request {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]Request(nil), u.seen...)
}

// Open is the number of connections open at the upstream.
func (u *Upstream) Open() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.open
}

// HasConnFrom reports whether a connection from the client address peer is open.
func (u *Upstream) HasConnFrom(peer string) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.byPeer[peer] != nil
}

// ResetConnFrom resets the upstream's side of the open connection from peer, as a server
// does that closes a connection with a request unread.
func (u *Upstream) ResetConnFrom(peer string) {
	u.mu.Lock()
	c := u.byPeer[peer]
	u.mu.Unlock()
	if c != nil {
		_ = c.SetLinger(0)
		_ = c.Close()
	}
}
