package auth

import (
	"context"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/docsgate/gateway/internal/redistest"
)

// countingStore counts the saves a LastUse makes, and fails them while failing is set.
type countingStore struct {
	MemoryLastUse
	mu      sync.Mutex
	saves   int
	failing bool
}

func (c *countingStore) SaveLastUse(ctx context.Context, m map[string]int64) error {
	c.mu.Lock()
	c.saves++
	failing := c.failing
	c.mu.Unlock()
	if failing {
		return errors.New("down")
	}
	return c.MemoryLastUse.SaveLastUse(ctx, m)
}

// Touch records in memory only; a Flush writes each key's latest minute in one save, nothing
// when nothing changed, and keeps what a failed save could not write for the next.
func TestLastUse(t *testing.T) {
	ctx := t.Context()
	store := &countingStore{}
	lu := NewLastUse(store)
	base := time.Date(2026, 12, 4, 10, 0, 30, 0, time.UTC)
	var wg sync.WaitGroup
	for i := range 1000 { // many requests of two keys in one minute, concurrently
		wg.Add(1)
		go func() {
			defer wg.Done()
			lu.Touch([]string{"a", "b"}[i%2], base.Add(time.Duration(i)*time.Millisecond))
		}()
	}
	wg.Wait()
	if store.saves != 0 {
		t.Fatalf("Touch wrote to the store %d times", store.saves)
	}
	if err := lu.Flush(ctx); err != nil || store.saves != 1 {
		t.Fatalf("flush: %v, %d saves; want one", err, store.saves)
	}
	if err := lu.Flush(ctx); err != nil || store.saves != 1 {
		t.Fatalf("a flush with nothing new saved: %v, %d saves", err, store.saves)
	}
	lu.Touch("a", base.Add(10*time.Second)) // the same minute: nothing to write
	if err := lu.Flush(ctx); err != nil || store.saves != 1 {
		t.Fatalf("a use in a minute recorded already was written: %d saves", store.saves)
	}
	store.failing = true
	lu.Touch("a", base.Add(2*time.Minute))
	if err := lu.Flush(ctx); err == nil {
		t.Fatal("a failed save reported no error")
	}
	store.failing = false
	if err := lu.Flush(ctx); err != nil || store.saves != 3 {
		t.Fatalf("the retry after a failed save: %v, %d saves", err, store.saves)
	}
	uses, err := lu.Load(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wantA, wantB := base.Add(2*time.Minute).Truncate(time.Minute), base.Truncate(time.Minute)
	if !uses["a"].Equal(wantA) || !uses["b"].Equal(wantB) {
		t.Fatalf("last uses %v; want a at %v, b at %v", uses, wantA, wantB)
	}
	lu.Touch("c", base) // not flushed yet: Load shows it all the same
	if uses, _ := lu.Load(ctx); !uses["c"].Equal(wantB) {
		t.Fatalf("Load misses what this replica recorded and did not write yet: %v", uses)
	}
}

// The stores keep the latest minute whatever the order replicas write in: Redis (one sorted
// set, ZADD GT), a Cluster, and the file beside the keys file.
func TestLastUseStores(t *testing.T) {
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { c.Close() })
	cl := redistest.StartCluster(t, 3)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs})
	t.Cleanup(func() { cc.Close() })
	for name, s := range map[string]LastUseStore{
		"redis":   NewRedisLastUse(c, "gw"),
		"cluster": NewRedisLastUse(cc, ""),
		"file":    &FileLastUse{Path: filepath.Join(t.TempDir(), "keys.yaml.last-used")},
		"memory":  &MemoryLastUse{},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			if got, err := s.LoadLastUse(ctx); err != nil || len(got) != 0 {
				t.Fatalf("empty store: %v, %v", got, err)
			}
			if err := s.SaveLastUse(ctx, map[string]int64{"a": 100, "b": 50}); err != nil {
				t.Fatal(err)
			}
			// A replica that writes later what it saw earlier moves nothing back.
			if err := s.SaveLastUse(ctx, map[string]int64{"a": 90, "b": 60}); err != nil {
				t.Fatal(err)
			}
			got, err := s.LoadLastUse(ctx)
			if err != nil || got["a"] != 100 || got["b"] != 60 || len(got) != 2 {
				t.Fatalf("stored %v, %v; want a 100, b 60", got, err)
			}
		})
	}
}

// A key's expiry: the one asked for within the longest lifetime, else the default, else the
// longest; none when neither is set.
func TestLifetimeExpiry(t *testing.T) {
	now := time.Date(2026, 12, 4, 10, 0, 0, 0, time.UTC)
	day := 24 * time.Hour
	at := func(d time.Duration) *time.Time { t := now.Add(d); return &t }
	for _, c := range []struct {
		name  string
		l     Lifetime
		asked *time.Time
		want  *time.Time
		err   bool
	}{
		{"none", Lifetime{}, nil, nil, false},
		{"default", Lifetime{Default: 90 * day, Max: 365 * day}, nil, at(90 * day), false},
		{"max alone", Lifetime{Max: 30 * day}, nil, at(30 * day), false},
		{"asked", Lifetime{Default: 90 * day}, at(400 * day), at(400 * day), false},
		{"asked within max", Lifetime{Max: 30 * day}, at(30 * day), at(30 * day), false},
		{"asked past max", Lifetime{Max: 30 * day}, at(30*day + time.Second), nil, true},
		{"asked in the past", Lifetime{}, at(-time.Second), nil, true},
		{"asked now", Lifetime{}, at(0), nil, true},
	} {
		got, err := c.l.Expiry(c.asked, now)
		if (err != nil) != c.err || (got == nil) != (c.want == nil) || got != nil && !got.Equal(*c.want) {
			t.Errorf("%s: %v, %v; want %v (error %v)", c.name, got, err, c.want, c.err)
		}
	}
}
