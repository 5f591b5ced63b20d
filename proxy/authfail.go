package proxy

import (
	"fmt"
	"hash/maphash"
	"math"
	"net/http"
	"net/netip"
	"strconv"
	"sync"
	"time"
)

// Failed authentications are counted per client IP, in process: past auth.failure_limit in a
// minute, a client gets 429 too_many_auth_failures and none of its keys is looked up. A spray
// of invented keys then costs the registry (and Redis behind it) at most failure_limit
// lookups per client and minute. Only registry mode counts: in prefix mode a refused key
// costs no lookup, so there is nothing to protect.

const (
	// failureWindow is the period a client's failures are counted over; it starts at the
	// client's first failure (not at a wall-clock minute), so a client cannot spend two
	// budgets in a row across a minute boundary.
	failureWindow = time.Minute
	// maxFailingClients bounds the clients tracked at once, and with it the memory a flood
	// from many addresses can make the gateway hold (a few MB at most: one small map entry
	// per client). A new client in a full table takes the place of a sampled one: an expired
	// one if the sample holds any, else the one with the fewest failures, so the clients that
	// spent their budget stay blocked while the table churns.
	maxFailingClients = 100_000
	failShards        = 32
	failShardCap      = maxFailingClients / failShards
	failSample        = 8
)

// failureBudget counts failed authentications per client. The zero value is not usable; see
// newFailureBudget.
type failureBudget struct {
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

func newFailureBudget(now func() time.Time) *failureBudget {
	b := &failureBudget{now: now, seed: maphash.MakeSeed()}
	for i := range b.shards {
		b.shards[i].m = make(map[netip.Addr]failCount)
	}
	return b
}

func (b *failureBudget) shard(client netip.Addr) *failShard {
	a := client.As16()
	return &b.shards[maphash.Bytes(b.seed, a[:])%failShards]
}

// spent reports whether client has had limit failures in its current window, and if so how
// long until the window ends.
func (b *failureBudget) spent(client netip.Addr, limit int) (time.Duration, bool) {
	now := b.now().UnixNano()
	sh := b.shard(client)
	sh.mu.Lock()
	c, ok := sh.m[client]
	sh.mu.Unlock()
	left := c.start + int64(failureWindow) - now
	if !ok || left <= 0 || int64(c.n) < int64(limit) {
		return 0, false
	}
	return time.Duration(left), true
}

// fail counts one failure for client.
func (b *failureBudget) fail(client netip.Addr) {
	now := b.now().UnixNano()
	sh := b.shard(client)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	c, ok := sh.m[client]
	switch {
	case ok && now-c.start < int64(failureWindow):
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
		case now-c.start >= int64(failureWindow):
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

// len is the number of clients tracked (tests).
func (b *failureBudget) len() int {
	n := 0
	for i := range b.shards {
		b.shards[i].mu.Lock()
		n += len(b.shards[i].m)
		b.shards[i].mu.Unlock()
	}
	return n
}

// failureClient is the budget's key for the request's client: the address, or for IPv6 its
// client_ip.ipv6_prefix (one host usually holds a whole /64), as the per-IP limit counts.
func (sn *snapshot) failureClient(s *scope) netip.Addr {
	a := s.clientIP.Unmap().WithZone("")
	if a.Is4() || !a.IsValid() {
		return a
	}
	p, err := a.Prefix(sn.ipv6Bits)
	if err != nil {
		return a
	}
	return p.Addr()
}

// authFailuresSpent answers the request with 429 when its client has spent its failure
// budget, and reports whether it did.
func (g *Gateway) authFailuresSpent(s *scope) bool {
	limit := s.snap.authFailLimit
	if limit <= 0 {
		return false
	}
	left, spent := g.authFailures.spent(s.snap.failureClient(s), limit)
	if !spent {
		return false
	}
	retry := max(int64((left+time.Second-1)/time.Second), 1)
	s.route.metrics.AuthRejected("too_many_failures")
	s.w.Header().Set(hdrRetryAfter, strconv.FormatInt(retry, 10))
	s.fail(http.StatusTooManyRequests, errorBody{
		Error:      fmt.Sprintf("Too many failed authentications from this address. Please retry in %s.", humanSeconds(retry)),
		Code:       codeTooManyAuthFailures,
		RetryAfter: &retry,
	})
	return true
}

// countAuthFailure adds one failed authentication to the client's budget.
func (g *Gateway) countAuthFailure(s *scope) {
	if s.snap.authFailLimit > 0 {
		g.authFailures.fail(s.snap.failureClient(s))
	}
}
