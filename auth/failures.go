package auth

import (
	"net/netip"
	"time"

	"github.com/docsgate/gateway/internal/tally"
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
	// spent their budget stay blocked while the table churns (package tally).
	MaxFailingClients = 100_000
)

// FailureBudget counts failed authentications per client. The zero value is not usable; see
// NewFailureBudget. It is safe for concurrent use.
type FailureBudget struct {
	now    func() time.Time
	counts *tally.Counts[netip.Addr]
}

// NewFailureBudget returns an empty budget reading time from now (time.Now in production).
func NewFailureBudget(now func() time.Time) *FailureBudget {
	return &FailureBudget{now: now, counts: tally.New[netip.Addr](MaxFailingClients, FailureWindow)}
}

// Spent reports whether client has had limit failures in its current window, and if so how
// long until the window ends.
func (b *FailureBudget) Spent(client netip.Addr, limit int) (time.Duration, bool) {
	return b.counts.Reached(client, limit, b.now())
}

// Fail counts one failure for client.
func (b *FailureBudget) Fail(client netip.Addr) {
	b.counts.Add(client, b.now())
}

// Len is the number of clients tracked.
func (b *FailureBudget) Len() int {
	return b.counts.Len()
}
