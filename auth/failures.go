package auth

import (
	"hash/maphash"
	"math"
	"net/netip"
	"sync"
	"time"
)

// Failed authentications are counted per client IP, in process: past a limit in a minute, a
// client is refused. On the public listener (auth.failure_limit) it is refused before its
// credentials are even looked at, so a spray of invented keys costs the registry (and Redis
// behind it) at most that many lookups per client and minute. On the admin listener the one
// admin token is compared first (no lookup to save) and the right one is always served:
// only wrong tokens past the limit are refused, so nobody sharing the operator's address
// can lock the operator out.

const (
	// FailureWindow is the period a client's failures are counted over; it starts at the
	// client's first failure (not at a wall-clock minute), so a client cannot spend two
	// budgets in a row across a minute boundary.
	FailureWindow = time.Minute
	// MaxFailingClients bounds the clients tracked at once, and with it the memory a flood
	// from many addresses can make the gateway hold (a few MB at most: one small map entry
	// per client). A new client in a full table takes the place of a sampled one: an expired
	// one if the sample holds any, else the one with the fewest failures, so the clients that
	// spent their budget stay blocked while the table churns.
	MaxFailingClients = 100_000
	failShards        = 32
	failShardCap      = MaxFailingClients / failShards
	failSample        = 8
)

// FailureBudget counts failed authentications per client. The zero value is not usable; see
// NewFailureBudget. It is safe for concurrent use.
type FailureBudget struct {
	now    func() time.Time
	seed   maphash.Seed
	shards [failShards]failShard
}

type failShard struct {
	mu sync.Mutex
	m  map[netip.Addr]failCount
}

// failCount is one client's failures in its current window.
type failCount struct {
	start int64 // window start, Unix ns
	n     int32
}

// NewFailureBudget returns an empty budget reading time from now (time.Now in production).
func NewFailureBudget(now func() time.Time) *FailureBudget {
	b := &FailureBudget{now: now, seed: maphash.MakeSeed()}
	for i := range b.shards {
		b.shards[i].m = make(map[netip.Addr]failCount)
	}
	return b
}

func (b *FailureBudget) shard(client netip.Addr) *failShard {
	a := client.As16()
	return &b.shards[maphash.Bytes(b.seed, a[:])%failShards]
}

// Spent reports whether client has had limit failures in its current window, and if so how
// long until the window ends.
func (b *FailureBudget) Spent(client netip.Addr, limit int) (time.Duration, bool) {
	now := b.now().UnixNano()
	sh := b.shard(client)
	sh.mu.Lock()
	c, ok := sh.m[client]
	sh.mu.Unlock()
	left := c.start + int64(FailureWindow) - now
	if !ok || left <= 0 || int64(c.n) < int64(limit) {
		return 0, false
	}
	return time.Duration(left), true
}

// Fail counts one failure for client.
func (b *FailureBudget) Fail(client netip.Addr) {
	now := b.now().UnixNano()
	sh := b.shard(client)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	c, ok := sh.m[client]
	switch {
	case ok && now-c.start < int64(FailureWindow):
		if c.n < math.MaxInt32 {
			c.n++
		}
	case !ok && len(sh.m) >= failShardCap:
		sh.evict(now)
		fallthrough
	default:
		c = failCount{start: now, n: 1}
	}
	sh.m[client] = c
}

// evict makes room in a full shard (caller holds the lock): it drops the expired entries of
// a small sample (Go randomizes where a map's iteration starts), or failing that the sampled
// client with the fewest failures, the oldest among equals.
func (sh *failShard) evict(now int64) {
	var victim netip.Addr
	var least failCount
	expired, found, i := false, false, 0
	for k, c := range sh.m {
		switch {
		case now-c.start >= int64(FailureWindow):
			delete(sh.m, k)
			expired = true
		case !found || c.n < least.n || (c.n == least.n && c.start < least.start):
			victim, least, found = k, c, true
		}
		if i++; i == failSample {
			break
		}
	}
	if !expired && found {
		delete(sh.m, victim)
	}
}

// Len is the number of clients tracked.
func (b *FailureBudget) Len() int {
	n := 0
	for i := range b.shards {
		b.shards[i].mu.Lock()
		n += len(b.shards[i].m)
		b.shards[i].mu.Unlock()
	}
	return n
}
