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
	rc    syscall.RawConn
	buf   [12]byte // enough for "HTTP/1.1 408"
	state idleState
	fn    func(fd uintptr)
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
	n, _, err := syscall.Recvfrom(int(fd), p.buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	switch {
	case errors.Is(err, syscall.EAGAIN):
		p.state = idleOpen // nothing sent
	case err != nil || n == 0:
		p.state = idleClosed // reset, or the end of the stream
	default:
		p.state = unasked(p.buf[:n])
	}
}

// check says whether the connection is open with nothing to read, and if not, why. Without a
// prober (a connection that is not a socket) it assumes so. The peek goes through Control, not
// Read: it never waits, and a read deadline left from the connection's last exchange must not
// fail it.
func (p *prober) check() idleState {
	if p == nil {
		return idleOpen
	}
	if p.rc.Control(p.fn) != nil {
		return idleClosed
	}
	return p.state
}
