// Package readbound bounds the answers of the tenants' usage endpoint, in process.
//
// Each answer is a store read that no configured limit pays for, so a caller gets so many a
// minute. It counts per client address first (self_usage.per_address_per_minute), before the
// key is even checked: in prefix mode any well-formed key passes, so a bound per key alone is
// no bound for someone inventing keys, and a table of keys they could fill would lock the real
// keys out. Then per key (self_usage.per_key_per_minute), so that one key read from many
// addresses is bounded too.
//
// Each count runs for a minute from its first answer. Both tables are bounded (package tally):
// a flood of addresses or keys churns them, never fills them, and the callers that spent their
// budget stay refused meanwhile; every key is behind its address's bound anyway.
package readbound

import (
	"net/netip"
	"time"

	"github.com/docsgate/gateway/internal/tally"
)

const (
	// window is how long a count runs from its first answer.
	window = time.Minute
	// maxAddrs and maxKeys cap the addresses and keys tracked at once, a few MiB at most (a
	// key's entry is its digest, shared with the request that brought it).
	maxAddrs = 100_000
	maxKeys  = 1 << 16
)

// Bound is the endpoint's bound: per client address, then per key digest.
type Bound struct {
	addrs *tally.Counts[netip.Addr]
	keys  *tally.Counts[string]
}

// New returns an empty bound.
func New() *Bound {
	return &Bound{addrs: tally.New[netip.Addr](maxAddrs, window), keys: tally.New[string](maxKeys, window)}
}

// Addr counts one answer for the client address a at now unless it has had limit in its
// minute: then it returns false and the whole seconds left of that minute (Retry-After).
func (b *Bound) Addr(a netip.Addr, limit int, now time.Time) (bool, int64) {
	return take(b.addrs, a, limit, now)
}

// Key is Addr's count for a key's digest.
func (b *Bound) Key(digest string, limit int, now time.Time) (bool, int64) {
	return take(b.keys, digest, limit, now)
}

// take counts one answer for id at now unless it has had limit in its minute: then it
// returns false and the whole seconds left of that minute, at least 1.
func take[K comparable](c *tally.Counts[K], id K, limit int, now time.Time) (bool, int64) {
	ok, left := c.Take(id, limit, now)
	if ok {
		return true, 0
	}
	return false, max(int64((left+time.Second-1)/time.Second), 1)
}
