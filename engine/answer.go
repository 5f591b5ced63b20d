package engine

import (
	"context"
	"math"
	"slices"

	"go.uber.org/zap"

	"github.com/docsgate/gateway/limits"
	"github.com/docsgate/gateway/policy"
)

// Charge is what an answer costs one tokens limit, given the limit's estimate_max and the
// reserve it held (0: none); the stream package's Charge is one.
type Charge interface {
	Of(estimateMax, reserve int64) int64
}

// Answer is how an admitted request's answer ended, as its front door saw it.
type Answer struct {
	// Charge is what the answer costs.
	Charge Charge
	// Released: the answer costs nothing and its holds are given back (the upstream refused
	// it, failed before any answer text, or never answered while the client stayed).
	Released bool
	// Unmetered: no stream was read and the client did not go away (an answer that is no
	// stream): the tokens limits that hold nothing are not debited, a hold is settled to 0.
	Unmetered bool
	// Policy and Plan are those the request was decided by (see inForce).
	Policy *policy.Policy
	Plan   string
	Route  string // for the log
}

// Finish settles what an admitted request owes once its answer has ended, for whatever reason
// (finish, cut, upstream error, client gone): its tokens are debited to the tokens limits that
// hold nothing, its holds settled to the answer's tokens (or released when it costs nothing),
// its stream slots given back. One store write per amount, off the request path; a hold whose
// write fails comes back after reserve_ttl.
func (e *Engine) Finish(a *Admission, ans Answer) {
	e.debit(a, ans)
	e.settle(a, ans)
}

// debit charges the answer's tokens to the request's tokens limits that hold nothing: one
// store write made off the request path, so it never delays a byte of the stream or the end of
// the request.
func (e *Engine) debit(a *Admission, ans Answer) {
	if len(a.tokenHits) == 0 || ans.Released || ans.Unmetered {
		return
	}
	byAmount(a.tokenHits, func(h limits.Hit) int64 { return ans.Charge.Of(h.Rule.EstimateMax, 0) }, func(hits []limits.Hit, n int64) {
		if n <= 0 {
			return
		}
		hits = e.inForce(ans, hits)
		e.afterAnswer(func(ctx context.Context) {
			if err := e.o.Limiter.Debit(ctx, hits, n); err != nil {
				// The tokens are lost to the limit (never double-counted): say so, with numbers.
				e.log.Warn("token debit failed", zap.String("route", ans.Route), zap.Int64("tokens", n), zap.Error(err))
			}
		})
	})
}

// settle ends the request's token holds and stream slots: a slot is given back; a hold
// becomes the answer's tokens (capped by the hold when no text passed), or is released when
// the answer costs nothing.
func (e *Engine) settle(a *Admission, ans Answer) {
	if len(a.held) == 0 {
		return
	}
	amount := func(h limits.Hit) int64 {
		switch {
		case ans.Released:
			return -1
		case h.Rule.Unit != limits.Tokens:
			return anyAmount
		case ans.Unmetered:
			return 0
		}
		return ans.Charge.Of(h.Rule.EstimateMax, h.Rule.Reserve)
	}
	hold, keeper := a.hold, &a.keeper
	byAmount(a.held, amount, func(held []limits.Hit, n int64) {
		n = max(n, -1) // slots alone: given back, nothing charged
		held = e.inForce(ans, held)
		e.afterAnswer(func(ctx context.Context) {
			keeper.stop() // no refresh may follow the settle
			expired, err := e.o.Limiter.Settle(ctx, hold, held, n)
			if err != nil {
				// The holds and slots come back when their reserve_ttl ends; the tokens are lost.
				e.log.Warn("settling holds failed", zap.String("route", ans.Route), zap.Int64("tokens", n), zap.Error(err))
			}
			for _, name := range expired {
				e.o.Metrics.HoldExpired(name)
			}
		})
	})
}

// anyAmount is the amount of a hit that takes any (a stream slot is given back whatever a
// settle charges).
const anyAmount = math.MinInt64

// byAmount calls each with the hits that share an amount, and that amount: one store write
// per amount. A request's limits rarely differ in what they are charged, so the common case
// is one call with hits itself. Hits whose amount is anyAmount go with the first group
// (anyAmount itself when every hit's is).
func byAmount(hits []limits.Hit, amount func(limits.Hit) int64, each func(hits []limits.Hit, n int64)) {
	for len(hits) > 0 {
		n, split := int64(anyAmount), false
		for _, h := range hits {
			switch a := amount(h); {
			case a == anyAmount || a == n:
			case n == anyAmount:
				n = a
			default:
				split = true
			}
		}
		if !split {
			each(hits, n)
			return
		}
		var same, rest []limits.Hit
		for _, h := range hits {
			if a := amount(h); a == anyAmount || a == n {
				same = append(same, h)
			} else {
				rest = append(rest, h)
			}
		}
		each(same, n)
		hits = rest
	}
}

// inForce maps the hits of an answer admitted under an earlier policy to the rules of the
// policy in force where they count in the same counter (the same limit and plan, unit and
// algorithm), so that an answer that ends after a reload changed the limit's window is charged
// in the window the limit counts in now: the one it ends in. A hit whose limit changed its
// unit or algorithm, or is gone, keeps its rule (its counter).
func (e *Engine) inForce(ans Answer, hits []limits.Hit) []limits.Hit {
	p := e.pol.Load()
	if p == ans.Policy {
		return hits
	}
	out := slices.Clone(hits)
	for i, h := range out {
		for _, l := range p.LimitsOfPlan(ans.Plan) {
			if r := l.Rule; r.Name == h.Rule.Name && r.Unit == h.Rule.Unit && r.Algorithm == h.Rule.Algorithm {
				out[i].Rule = r
			}
		}
	}
	return out
}

// Reasons of gateway_ratelimit_refunds_total.
const (
	RefundUpstream401 = "upstream_401"
	RefundUpstream403 = "upstream_403"
)

// Refund gives back what an admitted request took, because the upstream refused its key
// (reason: RefundUpstream401 or RefundUpstream403): in prefix mode the gateway only checks a
// key's family, so a request with an invented key is counted before the upstream refuses it,
// and a stream of such requests would spend a tenant's quota without any real key. All in one
// store call made off the request path. It reports whether there was anything to give back.
//
// What it cannot do: a unit is held from the decision until the upstream has answered and the
// refund has run, so attackers with enough requests in flight at once still hold that much
// quota while they are in flight.
func (e *Engine) Refund(a *Admission, reason, route string) bool {
	if len(a.taken) == 0 {
		return false
	}
	taken := a.taken
	e.afterAnswer(func(ctx context.Context) {
		if err := e.o.Limiter.Refund(ctx, taken); err != nil {
			// The units stay taken: the tenant is under-served until the window ends, never
			// over it.
			e.log.Warn("refund failed", zap.String("route", route), zap.String("reason", reason), zap.Int("limits", len(taken)), zap.Error(err))
			return
		}
		for i := range taken {
			e.o.Metrics.Refunded(taken[i].Rule.Name, reason)
		}
	})
	return true
}

// RefundReasons are every reason Refund gives back units for.
func RefundReasons() []string { return []string{RefundUpstream401, RefundUpstream403} }

// EstimateMax is the estimate cap of an admitted request's token metrics: the largest
// estimate_max of its tokens limits, else -1 (none).
func (a *Admission) EstimateMax() int64 {
	m := int64(-1)
	for _, h := range a.tokenHits {
		m = max(m, h.Rule.EstimateMax)
	}
	for _, h := range a.held {
		if h.Rule.Unit == limits.Tokens {
			m = max(m, h.Rule.EstimateMax)
		}
	}
	return m
}

// Owes says whether the request owes anything when its answer ends (tokens to debit, holds or
// slots to settle).
func (a *Admission) Owes() bool { return len(a.tokenHits) > 0 || len(a.held) > 0 }
