package engine

import (
	"context"
	"time"

	"github.com/docsgate/gateway/limits"
	"github.com/docsgate/gateway/policy"
)

// Counts describes a request whose front door names each limit's tenant id and units itself,
// as Envoy's rate limit service does with its descriptors: Limits[i] is counted by Hits[i]
// (its rule, the tenant's id, Units or Check). Nothing of it is an HTTP request.
type Counts struct {
	Limits []policy.Limit
	Hits   []limits.Hit
	Org    string // for notifications: the tenant's org, when one is known
	Label  string // the registered key's label, when one is known
	Start  time.Time
}

// Decide decides every hit of c at once, all or nothing, into d (one store call, as Admit):
// admitted when every enforced limit has room for its hit's units, and then each takes them
// (a shadow limit too, while it has room); refused, none does. It counts the refusals and
// hands over what the decision crossed, as Admit does. Nothing is held: what it takes, it
// keeps (no refund, no settle). An error is the store's (redis.on_error says what becomes
// of the request).
func (e *Engine) Decide(ctx context.Context, c *Counts, d *Decision) error {
	d.Hits = append(d.Hits[:0], c.Hits...)
	if err := e.take(ctx, d); err != nil {
		return err
	}
	e.countRefusals(c.Limits, c.Start, d)
	if e.o.Crossings != nil {
		e.reportCrossings(c.Limits, c.Org, c.Label, c.Start, d)
	}
	return nil
}

// DebitTokens charges n tokens to the tokens limits of hits (those without a reserve; others
// are ignored) in their current windows, without any check: the tokens are spent (a stream
// that ended, as Envoy reports it), as Finish debits an answer's. One store call, bounded by
// ctx; what it crosses is reported by the store's crossings, as for the proxy's debits.
func (e *Engine) DebitTokens(ctx context.Context, hits []limits.Hit, n int64) error {
	if n <= 0 || len(hits) == 0 {
		return nil
	}
	return e.o.Limiter.Debit(ctx, hits, n)
}
