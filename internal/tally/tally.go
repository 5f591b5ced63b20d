// Package tally counts events per id over a window from each id's first event, in a bounded table.
//
// Tally counts events per id in process, each id over a window that starts at its
// first event, in a table of bounded size. The gateway bounds clients with it: failed
// authentications per address (auth.FailureBudget) and the usage endpoint's answers per
// address and per key (proxy).
//
// A window that starts at an id's first event (not at a wall-clock minute) means a client
// cannot spend two budgets in a row across a boundary. The table holds at most its capacity,
// so a flood of ids holds a few MiB at most: a new id in a full shard takes the place of a
// sampled one, an expired one if the sample holds any, else the one with the fewest events, so
// the ids that spent their budget stay counted while a flood churns the table; an id evicted
// with few events merely starts over.
package tally

import (
	"hash/maphash"
	"math"
	"sync"
	"time"
)

const (
	shards = 32
	sample = 8
)

// Counts counts events per id. The zero value is not usable; see New. It is safe for
// concurrent use.
type Counts[K comparable] struct {
	window   int64 // ns
	shardCap int
	seed     maphash.Seed
	shards   [shards]shard[K]
}

type shard[K comparable] struct {
	mu sync.Mutex
	m  map[K]count
}

// count is one id's events in its current window.
type count struct {
	start int64 // the window's start, Unix ns
	n     int32
}

// New returns empty counts of ids over window, holding at most capacity ids (rounded down to
// whole shards).
func New[K comparable](capacity int, window time.Duration) *Counts[K] {
	c := &Counts[K]{window: int64(window), shardCap: capacity / shards, seed: maphash.MakeSeed()}
	for i := range c.shards {
		c.shards[i].m = make(map[K]count)
	}
	return c
}

func (c *Counts[K]) shard(id K) *shard[K] {
	return &c.shards[maphash.Comparable(c.seed, id)%shards]
}

// Reached reports whether id has had limit events in its window at now, and if so how long
// until that window ends.
func (c *Counts[K]) Reached(id K, limit int, now time.Time) (time.Duration, bool) {
	t := now.UnixNano()
	sh := c.shard(id)
	sh.mu.Lock()
	e, ok := sh.m[id]
	sh.mu.Unlock()
	return c.reached(e, ok, limit, t)
}

func (c *Counts[K]) reached(e count, ok bool, limit int, now int64) (time.Duration, bool) {
	left := e.start + c.window - now
	if !ok || left <= 0 || int64(e.n) < int64(limit) {
		return 0, false
	}
	return time.Duration(left), true
}

// Add counts one event for id at now.
func (c *Counts[K]) Add(id K, now time.Time) {
	t := now.UnixNano()
	sh := c.shard(id)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.m[id]
	sh.add(id, e, ok, c, t)
}

// Take counts one event for id at now unless id has had limit events in its window: then it
// counts nothing and returns false and how long until that window ends.
func (c *Counts[K]) Take(id K, limit int, now time.Time) (bool, time.Duration) {
	t := now.UnixNano()
	sh := c.shard(id)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e, ok := sh.m[id]
	if left, reached := c.reached(e, ok, limit, t); reached {
		return false, left
	}
	sh.add(id, e, ok, c, t)
	return true, 0
}

// add counts one event for id, whose entry is e when ok (the caller holds the lock).
func (sh *shard[K]) add(id K, e count, ok bool, c *Counts[K], now int64) {
	switch {
	case ok && now-e.start < c.window:
		if e.n < math.MaxInt32 {
			e.n++
		}
	case !ok && len(sh.m) >= c.shardCap:
		sh.evict(now, c.window)
		fallthrough
	default:
		e = count{start: now, n: 1}
	}
	sh.m[id] = e
}

// evict makes room in a full shard (the caller holds its lock): it drops the expired entries
// of a small sample (Go randomizes where a map's iteration starts), or failing that the
// sampled id with the fewest events, the oldest among equals.
func (sh *shard[K]) evict(now, window int64) {
	var victim K
	var least count
	expired, found, i := false, false, 0
	for k, e := range sh.m {
		switch {
		case now-e.start >= window:
			delete(sh.m, k)
			expired = true
		case !found || e.n < least.n || (e.n == least.n && e.start < least.start):
			victim, least, found = k, e, true
		}
		if i++; i == sample {
			break
		}
	}
	if !expired && found {
		delete(sh.m, victim)
	}
}

// Len is the number of ids tracked.
func (c *Counts[K]) Len() int {
	n := 0
	for i := range c.shards {
		c.shards[i].mu.Lock()
		n += len(c.shards[i].m)
		c.shards[i].mu.Unlock()
	}
	return n
}
