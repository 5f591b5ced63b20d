package auth

import (
	"net/netip"
	"sync"
	"testing"
	"time"
)

// A client's window starts at its first failure and lasts a minute; past the limit the client
// is told how long is left, and once the window is over it starts afresh.
func TestFailureBudgetWindow(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	b := NewFailureBudget(clock.now)
	a := netip.MustParseAddr("198.51.100.7")
	other := netip.MustParseAddr("198.51.100.8")
	clock.add(20 * time.Second) // not aligned to a minute: the window is the client's own
	for i := range 3 {
		if _, spent := b.Spent(a, 3); spent {
			t.Fatalf("spent after %d failures of 3", i)
		}
		b.Fail(a)
		clock.add(time.Second)
	}
	left, spent := b.Spent(a, 3)
	if !spent || left != 57*time.Second {
		t.Fatalf("after 3 failures of 3: spent %t, %v left, want 57s", spent, left)
	}
	if _, spent := b.Spent(other, 3); spent {
		t.Fatal("another client shares the budget")
	}
	if _, spent := b.Spent(a, 4); spent {
		t.Fatal("a higher limit (after a reload) still refuses")
	}
	clock.add(56 * time.Second)
	if left, spent := b.Spent(a, 3); !spent || left != time.Second {
		t.Fatalf("a second before the end: spent %t, %v left", spent, left)
	}
	clock.add(time.Second)
	if _, spent := b.Spent(a, 3); spent {
		t.Fatal("still spent after the window")
	}
	b.Fail(a) // a new window from now, with one failure
	clock.add(59 * time.Second)
	b.Fail(a)
	b.Fail(a)
	if left, spent := b.Spent(a, 3); !spent || left != time.Second {
		t.Fatalf("new window: spent %t, %v left", spent, left)
	}
}

// A flood from more addresses than the table holds keeps it at its bound, and the clients that
// spent their budget stay blocked while it churns; expired entries make room first.
func TestFailureBudgetBounded(t *testing.T) {
	clock := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	b := NewFailureBudget(clock.now)
	blocked := netip.MustParseAddr("203.0.113.9")
	for range 30 {
		b.Fail(blocked)
	}
	addr := func(i int) netip.Addr {
		return netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
	}
	for i := range 3 * MaxFailingClients {
		b.Fail(addr(i))
	}
	if n := b.Len(); n > MaxFailingClients || n < MaxFailingClients*9/10 {
		t.Fatalf("%d clients tracked after a flood from %d addresses, want at most %d (and the table used)", n, 3*MaxFailingClients, MaxFailingClients)
	}
	if _, spent := b.Spent(blocked, 30); !spent {
		t.Fatal("a client that spent its budget was forgotten during the flood")
	}
	// A minute later everything has expired: new clients take the place of expired ones
	// and the table stays bounded.
	clock.add(time.Minute)
	for i := range MaxFailingClients {
		b.Fail(addr(10_000_000 + i))
	}
	if n := b.Len(); n > MaxFailingClients {
		t.Fatalf("%d clients tracked, want at most %d", n, MaxFailingClients)
	}
	if _, spent := b.Spent(blocked, 30); spent {
		t.Fatal("blocked past its window")
	}
}

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// The check every request makes when auth.failure_limit is on: a client with a few failures
// in a table of many.
func BenchmarkFailureBudgetSpent(b *testing.B) {
	fb := NewFailureBudget(time.Now)
	for i := range 10_000 {
		fb.Fail(netip.AddrFrom4([4]byte{10, 0, byte(i >> 8), byte(i)}))
	}
	a := netip.AddrFrom4([4]byte{10, 0, 0, 7})
	b.ReportAllocs()
	for b.Loop() {
		if _, spent := fb.Spent(a, 30); spent {
			b.Fatal("spent")
		}
	}
}
