// Package engine is the quota engine every front door calls: it decides a request's limits all or nothing, holds, settles, refunds and cuts off, and serves every usage and quota read and write.
package engine

import (
	"context"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/limits"
	"github.com/docsgate/gateway/metrics"
	"github.com/docsgate/gateway/policy"
)

// The store's roles, each the engine's own small interface: a store (limits.Redis,
// limits.Memory, limits.Guard) plays them all, and a reader of one role need not know the
// others.

// Decider decides all hits of a request at once, all or nothing.
type Decider interface {
	Take(ctx context.Context, hits []limits.Hit, d *limits.Decision) error
}

// Holder keeps the token holds and stream slots of answers in flight: settles them when the
// answer ends, refreshes them while it lives, grows a hold its answer runs past.
type Holder interface {
	Settle(ctx context.Context, hold string, hits []limits.Hit, n int64) ([]string, error)
	Refresh(ctx context.Context, hold string, hits []limits.Hit, passed func(r *limits.Rule) int64) ([]string, error)
	Grow(ctx context.Context, hold string, h limits.Hit, want int64) (int64, error)
}

// Charger charges what follows an answer: its tokens to the limits that held nothing, and
// back what a request took when the upstream refused its key.
type Charger interface {
	Debit(ctx context.Context, hits []limits.Hit, n int64) error
	Refund(ctx context.Context, taken []limits.Taken) error
}

// Reader reads counters back without consuming anything: several at once (one round trip per
// store node), or every tenant of a rule.
type Reader interface {
	Usages(ctx context.Context, hits []limits.Hit) ([]limits.Usage, error)
	Scan(ctx context.Context, r *limits.Rule, resolve func(id string) *limits.Rule, visit func(id string, u limits.Usage)) error
}

// Limiter is the store behind the request path: every role the requests need.
type Limiter interface {
	Decider
	Holder
	Charger
	Reader
}

// KeyLookup finds registered keys by digest (auth.mode: registry): a key's plan, label and org.
type KeyLookup interface {
	Lookup(ctx context.Context, digest string) (auth.Entry, bool, error)
}

// Options wire an Engine. Limiter, Metrics and Logger are required.
type Options struct {
	// Limiter decides the limits (guarded: its calls are bounded by redis.timeout and a
	// breaker).
	Limiter Limiter
	// Quotas changes tenants' quotas at run time (grants, overrides, resets) and keeps their
	// audit trail: the store behind Limiter, unguarded (operators' calls are bounded by their
	// own deadlines). nil: the quota actions fail.
	Quotas limits.QuotaStore
	// History reads the windows kept for usage history and exports: the store behind Limiter,
	// unguarded like Quotas. nil: history and exports know no limit.
	History limits.HistoryStore
	// Registry, when set, is the key registry (auth.mode: registry): the reads find a key's
	// plan, label and org there.
	Registry KeyLookup
	// Crossings, when set, is told of what a decision was the first in its window to reach
	// (thresholds of a limit's allowance, the first refusal, a forecast), with notifications
	// on. It is called on the request's path: it must only hand the crossing over, never wait.
	Crossings func(Crossing)
	// Notify is the notifications the gateway started with: the limits mark the crossings
	// some endpoint takes (a change needs a restart). Only with Crossings.
	Notify *config.Notifications
	// AllowOnError is redis.on_error: allow: a request whose decision failed goes on, and an
	// answer whose hold cannot be grown goes on.
	AllowOnError bool
	// GrowTimeout bounds the growth of an answer's hold (redis.timeout).
	GrowTimeout time.Duration
	Metrics     *metrics.Metrics
	Logger      *zap.Logger
}

// Engine decides requests against the policy in force and keeps the tenants' accounts.
type Engine struct {
	o          Options
	log        *zap.Logger
	pol        atomic.Pointer[policy.Policy] // in force: Use swaps it
	refusals   *refusalCounts                // each limit's refusals, for the usage page
	dataErrors dataErrorLog                  // limiter replies about one key's data, logged once a minute
	after      sync.WaitGroup                // store writes that follow answers, under way (see Close)
}

// New builds an engine; Use gives it a policy before it decides anything.
func New(o Options) *Engine {
	if o.Crossings == nil {
		o.Notify = nil
	}
	for _, k := range limits.ErrorKinds() {
		o.Metrics.LimiterErrorKinds(string(k))
	}
	return &Engine{o: o, log: o.Logger, refusals: newRefusalCounts(time.Now())}
}

// Compile compiles cfg into a policy for this engine (the limits mark what its notifications
// take); Use puts it in force. The holds-expired series of every tokens limit with a reserve,
// in any plan, exist at 0 from then on.
func (e *Engine) Compile(cfg *config.Config) (*policy.Policy, error) {
	p, err := policy.Compile(cfg, e.o.Notify)
	if err != nil {
		return nil, err
	}
	for _, plan := range append([]string{""}, slices.Collect(maps.Keys(cfg.Plans))...) {
		for _, s := range cfg.PlanLimits(plan) {
			if s.Unit == "tokens" && s.Reserve > 0 {
				e.o.Metrics.HoldLimits(s.Name)
			}
		}
	}
	return p, nil
}

// Use puts p in force for the reads and writes from now on; a request decides by the policy it
// started with. Each limit's refusals are counted in the window the usage page lists it with.
func (e *Engine) Use(p *policy.Policy) {
	for _, name := range p.EnabledLimits() {
		e.refusals.of(name, p.ListedWindow(name))
	}
	e.pol.Store(p)
}

// Policy is the policy in force.
func (e *Engine) Policy() *policy.Policy { return e.pol.Load() }

// afterTimeout bounds one store write that follows an answer (a debit, a settle, a refund). It
// runs after the answer, so it delays nobody, and it is not cut short by redis.timeout (the
// request path's budget): on a loaded Redis a write cut short would be lost.
const afterTimeout = 5 * time.Second

// afterAnswer runs a store write that follows an answer off the request path, bounded by
// afterTimeout; Close waits for those under way.
func (e *Engine) afterAnswer(write func(ctx context.Context)) {
	e.after.Add(1)
	go func() {
		defer e.after.Done()
		ctx, cancel := context.WithTimeout(context.Background(), afterTimeout)
		defer cancel()
		write(ctx)
	}()
}

// Close waits, until ctx ends, for the store writes that follow answers still under way (token
// debits, settles, refunds), so that a shutdown does not lose the last answers' tokens or
// refunds. Call it once the front doors are shut down.
func (e *Engine) Close(ctx context.Context) error {
	done := make(chan struct{})
	go func() { e.after.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
