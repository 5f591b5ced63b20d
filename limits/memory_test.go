package limits

import (
	"context"
	"sync"
	"testing"
	"time"
)

// fakeClock is a settable clock for the memory store.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) set(t time.Time)     { c.mu.Lock(); c.t = t; c.mu.Unlock() }
func (c *fakeClock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

// TestMemoryMonthRollover uses the injected clock: a month window resets at
// the calendar boundary (Feb 29 of a leap year -> Mar 1), not after 30 days.
func TestMemoryMonthRollover(t *testing.T) {
	clk := &fakeClock{t: utc(2024, 2, 29, 23, 59, 58)}
	m := NewMemory(WithClock(clk.now))
	r := rule(t, "per_key", 2, "month", Fixed)
	var d Decision
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		m.Take(ctx, []Hit{{Rule: r, ID: "k"}}, &d)
	}
	if d.Allowed || d.Results[0].Reset != 2*time.Second || d.Results[0].RetryAfter != 2*time.Second {
		t.Fatalf("3rd take in February: %+v", d)
	}
	clk.set(utc(2024, 3, 1, 0, 0, 0))
	if m.Take(ctx, []Hit{{Rule: r, ID: "k"}}, &d); !d.Allowed || d.Results[0].Remaining != 1 {
		t.Fatalf("first take in March: %+v", d)
	}
	u, _ := m.Usage(ctx, r, "k")
	if u.Used != 1 || !u.Reset.Equal(utc(2024, 4, 1, 0, 0, 0)) {
		t.Fatalf("March usage %+v", u)
	}
}

// TestMemoryGCRAReplenish: with a fake clock the GCRA is exact: limit 4 per
// 4s gives one unit back per second.
func TestMemoryGCRAReplenish(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	m := NewMemory(WithClock(clk.now))
	r := rule(t, "g", 4, "4s", GCRA)
	var d Decision
	ctx := context.Background()
	for i, want := range []int64{3, 2, 1, 0} {
		if m.Take(ctx, []Hit{{Rule: r, ID: "a"}}, &d); !d.Allowed || d.Results[0].Remaining != want {
			t.Fatalf("take %d: %+v", i, d)
		}
	}
	m.Take(ctx, []Hit{{Rule: r, ID: "a"}}, &d)
	if d.Allowed || d.Results[0].RetryAfter != time.Second || d.Results[0].Reset != 4*time.Second {
		t.Fatalf("5th take: %+v", d)
	}
	clk.add(time.Second)
	if m.Take(ctx, []Hit{{Rule: r, ID: "a"}}, &d); !d.Allowed || d.Results[0].Remaining != 0 {
		t.Fatalf("after 1s: %+v", d)
	}
	clk.add(10 * time.Second)
	if u, _ := m.Usage(ctx, r, "a"); u.Used != 0 || u.Remaining != 4 {
		t.Fatalf("after full replenishment: %+v", u)
	}
}

// TestMemorySweep: entries of finished windows are removed lazily.
func TestMemorySweep(t *testing.T) {
	clk := &fakeClock{t: time.Unix(1_700_000_000, 0)}
	m := NewMemory(WithClock(clk.now))
	r := rule(t, "f", 100, "10s", Fixed)
	g := rule(t, "g", 100, "10s", GCRA)
	var d Decision
	ids := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	for _, id := range ids {
		m.Take(context.Background(), []Hit{{Rule: r, ID: id}, {Rule: g, ID: id}}, &d)
	}
	if m.Len() != 2*len(ids) {
		t.Fatalf("Len %d, want %d", m.Len(), 2*len(ids))
	}
	clk.add(11 * time.Second)
	// Enough Takes to sweep every shard once; they all hit one key.
	for i := 0; i < memShards*sweepEvery; i++ {
		m.Take(context.Background(), []Hit{{Rule: r, ID: "z"}}, &d)
	}
	if m.Len() != 1 {
		t.Fatalf("Len %d after sweeps, want 1 (only the live key)", m.Len())
	}
}

func TestInsertSorted(t *testing.T) {
	var s []int
	for _, v := range []int{5, 1, 5, 3, 63, 0, 3} {
		s = insertSorted(s, v)
	}
	want := []int{0, 1, 3, 5, 63}
	if len(s) != len(want) {
		t.Fatalf("%v", s)
	}
	for i := range want {
		if s[i] != want[i] {
			t.Fatalf("%v", s)
		}
	}
}
