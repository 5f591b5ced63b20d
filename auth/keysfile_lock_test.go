package auth

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// One holder at a time; a waiter whose context ends gives up (and never holds the lock
// afterwards); the next one gets it once the holder lets go.
func TestLockKeysFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.yaml")
	unlock, err := LockKeysFile(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := LockKeysFile(ctx, path); err == nil {
		t.Fatal("a second writer got the lock while the first held it")
	}
	var mu sync.Mutex
	holders, maxHolders := 0, 0
	var wg sync.WaitGroup
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			u, err := LockKeysFile(context.Background(), path)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			holders++
			maxHolders = max(maxHolders, holders)
			mu.Unlock()
			time.Sleep(time.Millisecond)
			mu.Lock()
			holders--
			mu.Unlock()
			u()
		}()
	}
	time.Sleep(20 * time.Millisecond)
	unlock()
	wg.Wait()
	if maxHolders != 1 {
		t.Fatalf("%d writers held the lock at once", maxHolders)
	}
	// The abandoned waiter of above gave the lock back: it can be taken now.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	u, err := LockKeysFile(ctx2, path)
	if err != nil {
		t.Fatalf("the lock was left held: %v", err)
	}
	u()
}
