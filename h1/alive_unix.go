//go:build unix

package h1

import (
	"errors"
	"net"
	"syscall"
)

// prober tells whether an idle connection can take a request: nothing to read on it, and not
// closed by the peer. It peeks without blocking, one system call, the same check go-redis
// makes before reusing a connection (net/http's Transport learns the same from the reader
// goroutine it keeps on every connection). It is made once per connection, so a check
// allocates nothing.
type prober struct {
	rc  syscall.RawConn
	buf [1]byte
	ok  bool
	fn  func(fd uintptr)
}

func newProber(c net.Conn) *prober {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil
	}
	p := &prober{rc: rc}
	p.fn = p.peek
	return p
}

func (p *prober) peek(fd uintptr) {
	_, _, err := syscall.Recvfrom(int(fd), p.buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	// EAGAIN: open, nothing sent. No error: either 0 bytes, closed by the peer, or data nobody
	// asked for (a 408, a TLS alert), so the connection is out of step.
	p.ok = errors.Is(err, syscall.EAGAIN)
}

// alive reports whether the connection is open with nothing to read. Without a prober (a
// connection that is not a socket) it assumes so. The peek goes through Control, not Read:
// it never waits, and a read deadline left from the connection's last exchange must not
// fail it.
func (p *prober) alive() bool {
	if p == nil {
		return true
	}
	p.ok = false
	return p.rc.Control(p.fn) == nil && p.ok
}
