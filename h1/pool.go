package h1

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"strings"
	"time"
)

// host is the pool's state for one upstream host.
type host struct {
	idle  []*conn // most recently used last
	guess idleGuess
}

// idleGuess is what the pool has seen of the upstream's own idle timeout.
//
// An upstream closes idle keep-alive connections on its own clock, and a request written on a
// connection in the moment the upstream closes it fails: it may have been received, so it is
// not sent again (see RoundTrip). upstream.idle_timeout below the upstream's avoids that
// moment; when it is not (an upstream that keeps connections 5 s against the default 50 s),
// the pool learns the upstream's clock instead of failing a request now and then for ever. A
// connection found closed when taken from the pool, or failing before any answer, was idle
// about as long as the upstream allows; from then on connections idle three quarters of that
// are retired rather than reused. One that answered after being idle shows the upstream
// allows at least that much: a close sooner than that, or sooner than guessFloor, is an
// upstream restart, not its idle timeout, and teaches nothing (it would have the pool dial
// for every request). What is learned lasts guessLife, so a wrong guess costs at most that
// many extra dials, and a right one is learned again, for at most one failed request a
// guessLife instead of a steady trickle.
type idleGuess struct {
	closed time.Duration // shortest idle time after which the upstream closed a connection; 0: none seen
	alive  time.Duration // longest idle time after which a reused connection answered
	start  time.Time     // when these observations began
}

const (
	guessLife  = time.Minute
	guessFloor = 100 * time.Millisecond
)

// fresh forgets observations older than guessLife.
func (g *idleGuess) fresh(now time.Time) {
	if now.Sub(g.start) >= guessLife {
		*g = idleGuess{start: now}
	}
}

// limit is how long a connection may have been idle to be reused.
func (g *idleGuess) limit(now time.Time, configured time.Duration) time.Duration {
	g.fresh(now)
	if g.closed == 0 {
		return configured
	}
	return min(configured, g.closed*3/4)
}

// answered records a connection reused after idle that answered.
func (g *idleGuess) answered(now time.Time, idle time.Duration) {
	g.fresh(now)
	g.alive = max(g.alive, idle)
}

// closedAfter records a connection the upstream closed after idle.
func (g *idleGuess) closedAfter(now time.Time, idle time.Duration) {
	g.fresh(now)
	if idle < guessFloor || idle <= g.alive {
		return
	}
	if g.closed == 0 || idle < g.closed {
		g.closed = idle
	}
}

// getConn returns a live idle connection to key, or dials one.
func (t *Transport) getConn(ctx context.Context, key string) (*conn, error) {
	for {
		t.mu.Lock()
		h := t.hosts[key]
		if h == nil || len(h.idle) == 0 {
			t.mu.Unlock()
			break
		}
		n := len(h.idle)
		c := h.idle[n-1]
		h.idle[n-1] = nil
		h.idle = h.idle[:n-1]
		now := time.Now()
		c.reusedAfter = now.Sub(c.idleAt)
		fresh := c.reusedAfter < h.guess.limit(now, t.o.IdleConnTimeout)
		t.mu.Unlock()
		if !fresh {
			c.close()
			continue
		}
		// Closed by the upstream while idle (its keep-alive timeout, a restart; a 408 before
		// closing), or sent something unasked: never write a request to it. Only a close
		// teaches the pool the upstream's idle clock: bytes left over from an exchange out of
		// step come whenever that exchange ended, and learning from them would have every
		// connection idle that long dialled anew for guessLife.
		switch c.probe.check() {
		case idleOpen:
			return c, nil
		case idleClosed:
			c.close()
			t.closedByUpstream(c)
		default:
			c.close()
		}
	}
	return t.dial(ctx, key)
}

// closedByUpstream records that the upstream closed c, reused after being idle, before it
// answered anything.
func (t *Transport) closedByUpstream(c *conn) {
	if c.reusedAfter == 0 {
		return // a new connection
	}
	t.mu.Lock()
	if h := t.hosts[c.key]; h != nil {
		h.guess.closedAfter(time.Now(), c.reusedAfter)
	}
	t.mu.Unlock()
}

func (t *Transport) dial(ctx context.Context, key string) (*conn, error) {
	addr := key
	if _, _, err := net.SplitHostPort(key); err != nil {
		addr = net.JoinHostPort(strings.Trim(key, "[]"), "80")
	}
	dial := t.o.DialContext
	if dial == nil {
		dial = t.dialer.DialContext
	}
	nc, err := dial(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("upstream: %w", err)
	}
	c := &conn{key: key, nc: nc, probe: newProber(nc)}
	c.lr = limitedReader{r: nc, n: unlimited, limit: t.o.MaxResponseHeaderBytes}
	c.br = bufio.NewReaderSize(&c.lr, 4<<10)
	c.cw = countingWriter{w: nc}
	return c, nil
}

// putConn keeps c for reuse, or closes it when the pool is full or closed.
func (t *Transport) putConn(c *conn) {
	now := time.Now()
	c.idleAt = now
	t.mu.Lock()
	h := t.hosts[c.key]
	if h == nil {
		h = &host{}
		t.hosts[c.key] = h
	}
	if c.reusedAfter > 0 {
		h.guess.answered(now, c.reusedAfter)
	}
	if t.closed || len(h.idle) >= t.o.MaxIdleConns {
		t.mu.Unlock()
		c.close()
		return
	}
	h.idle = append(h.idle, c)
	if t.sweep == nil {
		t.sweep = time.AfterFunc(t.o.IdleConnTimeout, t.sweepIdle)
	}
	t.mu.Unlock()
}

// sweepIdle closes the connections idle past IdleConnTimeout (the oldest are first in each
// list), and runs again while any are left.
func (t *Transport) sweepIdle() {
	var stale []*conn
	t.mu.Lock()
	t.sweep = nil
	left := 0
	for _, h := range t.hosts {
		i := 0
		for i < len(h.idle) && time.Since(h.idle[i].idleAt) >= t.o.IdleConnTimeout {
			stale = append(stale, h.idle[i])
			i++
		}
		rest := append(h.idle[:0], h.idle[i:]...)
		clear(h.idle[len(rest):])
		h.idle = rest
		left += len(rest)
	}
	if left > 0 && !t.closed {
		t.sweep = time.AfterFunc(t.o.IdleConnTimeout/2, t.sweepIdle)
	}
	t.mu.Unlock()
	for _, c := range stale {
		c.close()
	}
}

// CloseIdleConnections closes the idle connections; connections in use close when their
// exchange ends.
func (t *Transport) CloseIdleConnections() {
	var idle []*conn
	t.mu.Lock()
	for _, h := range t.hosts {
		idle = append(idle, h.idle...)
		clear(h.idle)
		h.idle = h.idle[:0]
	}
	t.mu.Unlock()
	for _, c := range idle {
		c.close()
	}
}

// Close closes the idle connections and keeps no more from now on.
func (t *Transport) Close() {
	t.mu.Lock()
	t.closed = true
	if t.sweep != nil {
		t.sweep.Stop()
		t.sweep = nil
	}
	t.mu.Unlock()
	t.CloseIdleConnections()
}
