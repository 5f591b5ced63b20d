package engine

import (
	"context"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/docsgate/gateway/limits"
)

// holdKeeper keeps the token holds and stream slots of an answer in flight from expiring: a
// hold lives reserve_ttl from its last refresh, so that the holds of a gateway that died come
// back, but a live answer must never drop out of its limits however long it runs, or a
// streams cap would admit past itself. Every limits.RefreshEvery (a quarter of the shortest
// reserve_ttl), one store write off the request path, until the answer is settled. One timer
// per answer with holds, none per part. Each refresh leaves in the tokens holds what the
// answer has passed so far, which the store charges if the hold expires unsettled (this
// gateway died): such an answer loses only what passed since its last refresh.
type holdKeeper struct {
	mu    sync.Mutex // held by a refresh under way, and by stop
	done  bool
	timer *time.Timer
}

// Progress says, at any moment and from any goroutine, what an answer in flight has passed so
// far of a tokens limit r: its charge had it ended then (see limits.Refresher).
type Progress interface {
	Passed(r *limits.Rule) int64
}

// KeepHolds starts refreshing the holds an admitted request's decision took (a.Held) while
// its answer lives; route names it in the log, and each refresh leaves in the tokens holds
// what p (nil: nothing is known) says the answer has passed. Call it once the request is
// forwarded.
func (e *Engine) KeepHolds(a *Admission, route string, p Progress) {
	every := limits.RefreshEvery(a.held)
	if every <= 0 {
		return
	}
	k := &a.keeper
	hold, held := a.hold, a.held
	// Each refresh is bounded so that one may fail and the next still lands in time (see
	// limits.RefreshEvery), and so that a settle waiting for it (stop) keeps most of its own
	// bound.
	bound := min(every/2, afterTimeout/2)
	refresh := func() {
		k.mu.Lock()
		defer k.mu.Unlock()
		if k.done {
			return
		}
		var passed func(r *limits.Rule) int64 // made here, off the request path
		if p != nil {
			passed = p.Passed
		}
		ctx, cancel := context.WithTimeout(context.Background(), bound)
		lapsed, err := e.o.Limiter.Refresh(ctx, hold, held, passed)
		cancel()
		if err != nil {
			// The next refresh takes again what expires meanwhile.
			e.log.Warn("refreshing the holds of an answer in flight failed", zap.String("route", route), zap.Error(err))
		}
		if len(lapsed) > 0 {
			// Redis lost them, or was out of reach for most of reserve_ttl: taken again.
			e.log.Warn("holds of an answer in flight had expired; taken again", zap.String("route", route), zap.Strings("limits", lapsed))
		}
		k.timer.Reset(every)
	}
	k.mu.Lock()
	k.timer = time.AfterFunc(every, refresh)
	k.mu.Unlock()
}

// Grow grows the hold an admitted request's answer has of h to want tokens, as far as the
// tenant's allowance has room net of the used tokens and the other live holds, and returns the
// hold it has now: one store call, atomic with every other decision and hold on the limit,
// bounded by redis.timeout.
func (e *Engine) Grow(a *Admission, h limits.Hit, want int64) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), e.o.GrowTimeout)
	defer cancel()
	return e.o.Limiter.Grow(ctx, a.hold, h, want)
}

// stop ends the refreshes of an answer that has ended, waiting for one under way: a refresh
// after the settle would take the settled holds again. Call it before the settle, off the
// request path.
func (k *holdKeeper) stop() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.done = true
	if k.timer != nil {
		k.timer.Stop()
	}
}
