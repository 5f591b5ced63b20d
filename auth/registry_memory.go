package auth

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// MemoryRegistry keeps entries in process: one replica, entries from the keys file. Lookups
// read an immutable map through an atomic pointer (no lock); writes copy the map.
type MemoryRegistry struct {
	mu      sync.Mutex // serializes writers
	entries atomic.Pointer[map[string]Entry]
	now     func() time.Time
}

var _ Registry = (*MemoryRegistry)(nil)

// NewMemoryRegistry validates entries (and refuses duplicate digests) and returns a registry
// holding them.
func NewMemoryRegistry(entries []Entry) (*MemoryRegistry, error) {
	m := &MemoryRegistry{now: time.Now}
	if err := m.Replace(entries); err != nil {
		return nil, err
	}
	return m, nil
}

// Replace swaps the whole set at once (live reload of the keys file). On error the current
// set is kept.
func (m *MemoryRegistry) Replace(entries []Entry) error {
	next := make(map[string]Entry, len(entries))
	now := m.now()
	for i := range entries {
		if err := entries[i].Validate(); err != nil {
			return fmt.Errorf("auth: keys[%d]: %w", i, err)
		}
		if _, dup := next[entries[i].Digest]; dup {
			return fmt.Errorf("auth: keys[%d]: digest registered twice", i)
		}
		next[entries[i].Digest] = entries[i].normalize(now)
	}
	m.mu.Lock()
	m.entries.Store(&next)
	m.mu.Unlock()
	return nil
}

// Lookup answers from memory; it never fails.
func (m *MemoryRegistry) Lookup(_ context.Context, digest string) (Entry, bool, error) {
	e, ok := (*m.entries.Load())[digest]
	return e, ok, nil
}

// LookupCached is Lookup: everything is in memory, so it always answers (hit true).
func (m *MemoryRegistry) LookupCached(digest string) (e Entry, ok, hit bool) {
	e, ok = (*m.entries.Load())[digest]
	return e, ok, true
}

// Add inserts or replaces an entry.
func (m *MemoryRegistry) Add(_ context.Context, e Entry) error {
	if err := e.Validate(); err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	var err error
	m.update(func(es map[string]Entry) {
		old, ok := es[e.Digest]
		if ok {
			if err = inactiveErr(old, m.now()); err != nil {
				return
			}
			e = e.updating(old)
		}
		es[e.Digest] = e.normalize(m.now())
	})
	return err
}

// Revoke marks an entry revoked now; ErrUnknownKey when it is not registered.
func (m *MemoryRegistry) Revoke(_ context.Context, digest string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	cur := *m.entries.Load()
	e, ok := cur[digest]
	if !ok {
		return ErrUnknownKey
	}
	next := copyMap(cur)
	next[digest] = revokedNow(e.clone(), m.now())
	m.entries.Store(&next)
	return nil
}

// Rotate registers next and schedules old's end (Registry.Rotate), under one lock.
func (m *MemoryRegistry) Rotate(_ context.Context, old string, next Entry, oldEnds time.Time) (Entry, error) {
	if err := next.Validate(); err != nil {
		return Entry{}, fmt.Errorf("auth: %w", err)
	}
	var out Entry
	var err error
	m.update(func(es map[string]Entry) {
		cur, ok := es[old]
		if !ok {
			err = ErrUnknownKey
			return
		}
		now := m.now()
		if out, err = rotation(cur, next, oldEnds, now, func(d string) bool { _, ok := es[d]; return ok }); err != nil {
			return
		}
		es[old] = out
		es[next.Digest] = next.normalize(now)
	})
	return out.clone(), err
}

// List returns copies of every entry, sorted by Created then Digest.
func (m *MemoryRegistry) List(_ context.Context) ([]Entry, error) {
	cur := *m.entries.Load()
	out := make([]Entry, 0, len(cur))
	for _, e := range cur {
		out = append(out, e.clone())
	}
	sortEntries(out)
	return out, nil
}

// Close does nothing.
func (m *MemoryRegistry) Close() error { return nil }

func (m *MemoryRegistry) update(f func(map[string]Entry)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	next := copyMap(*m.entries.Load())
	f(next)
	m.entries.Store(&next)
}

func copyMap(cur map[string]Entry) map[string]Entry {
	next := make(map[string]Entry, len(cur)+1)
	for k, v := range cur {
		next[k] = v
	}
	return next
}
