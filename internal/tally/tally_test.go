package tally

import (
	"net/netip"
	"sync"
	"testing"
	"time"
)

// Take admits limit events in an id's window, which starts at its first event and not at a
// wall-clock boundary; a refusal counts nothing and says how long is left; after the window
// the id starts afresh. Other ids have their own.
func TestTakeWindow(t *testing.T) {
	c := New[string](1000, time.Minute)
	t0 := time.Date(2026, 11, 27, 13, 0, 59, 0, time.UTC) // a wall-clock minute ends in a second
	for i := range 2 {
		if ok, _ := c.Take("k", 2, t0.Add(time.Duration(i)*10*time.Second)); !ok {
			t.Fatalf("event %d refused", i+1)
		}
	}
	if ok, left := c.Take("k", 2, t0.Add(10*time.Second+time.Millisecond)); ok || left != 50*time.Second-time.Millisecond {
		t.Fatalf("past the limit: %v, %v left, want 49.999s", ok, left)
	}
	if left, reached := c.Reached("k", 2, t0.Add(30*time.Second)); !reached || left != 30*time.Second {
		t.Fatalf("Reached: %v %v", reached, left)
	}
	if ok, _ := c.Take("k", 3, t0.Add(30*time.Second)); !ok {
		t.Fatal("a higher limit (after a reload) still refuses")
	}
	if ok, _ := c.Take("other", 2, t0.Add(30*time.Second)); !ok {
		t.Fatal("another id shares the count")
	}
	if ok, left := c.Take("k", 3, t0.Add(time.Minute-time.Nanosecond)); ok || left != time.Nanosecond {
		t.Fatalf("a moment before the window ends: %v, %v left", ok, left)
	}
	if ok, _ := c.Take("k", 3, t0.Add(time.Minute)); !ok {
		t.Fatal("not afresh after its window")
	}
	if left, reached := c.Reached("k", 1, t0.Add(time.Minute)); !reached || left != time.Minute {
		t.Fatalf("the new window: %v %v", reached, left)
	}
}

// Concurrent takers of one id are admitted exactly limit times in all (run with -race).
func TestTakeConcurrent(t *testing.T) {
	c := New[netip.Addr](1000, time.Minute)
	a := netip.MustParseAddr("2001:db8::1")
	now := time.Now()
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := 0
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 100 {
				if ok, _ := c.Take(a, 250, now); ok {
					mu.Lock()
					admitted++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	if admitted != 250 {
		t.Fatalf("%d admitted, want 250", admitted)
	}
}
