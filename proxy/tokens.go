package proxy

import (
	"context"
	"github.com/docsgate/gateway/stream"
	"math"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/limits"
)

// debitTimeout bounds one token debit or refund. It runs after the answer, so it delays
// nobody, and it is not cut short by redis.timeout (the request path's budget): on a loaded
// Redis a write cut short would be lost.
const debitTimeout = 5 * time.Second

// countTokens records a streamed answer's tokens once it has ended (see stream.Charge): the
// metrics, and one debit of the request's tokens limits that hold nothing (those with a
// reserve are settled by settleHolds). The debit is one store write made off the request
// path, so it never delays a byte of the stream or the end of the request. out is nil when no
// stream began.
func (g *Gateway) countTokens(s *scope, out *stream.Outcome) {
	c := stream.ChargeOf(out, s.promptBytes)
	if out != nil {
		prompt, completion, estimated := c.Split(s.metricsEstimateMax(), 0)
		s.route.metrics.Tokens(s.snap.orgLabel(s.org), prompt, completion)
		if estimated {
			s.route.metrics.TokensEstimated(prompt, completion)
		}
	}
	if len(s.tokenHits) == 0 || g.limiter == nil || s.released(out) || out == nil && s.upstreamKind != "canceled" {
		return
	}
	route := s.route.name
	byAmount(s.tokenHits, func(h limits.Hit) int64 { return c.Of(h.Rule.EstimateMax, 0) }, func(hits []limits.Hit, n int64) {
		if n <= 0 {
			return
		}
		g.afterAnswer(func(ctx context.Context) {
			if err := g.limiter.Debit(ctx, g.inForce(s, hits), n); err != nil {
				// The tokens are lost to the limit (never double-counted): say so, with numbers.
				g.log.Warn("token debit failed", zap.String("route", route), zap.Int64("tokens", n), zap.Error(err))
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

// metricsEstimateMax is the estimate cap of the tokens metrics: the largest estimate_max of
// the request's tokens limits, else the default.
func (s *scope) metricsEstimateMax() int64 {
	m := int64(-1)
	for _, h := range s.tokenHits {
		m = max(m, h.Rule.EstimateMax)
	}
	for _, h := range s.held {
		if h.Rule.Unit == limits.Tokens {
			m = max(m, h.Rule.EstimateMax)
		}
	}
	if m < 0 {
		return config.DefaultEstimateMax
	}
	return m
}

// released says whether the request's answer costs nothing and its holds are released: the
// upstream refused it (a 4xx or 5xx answer), never answered (the client did not go away: the
// upstream failed), or broke off before any answer text or usage. A client that went away
// pays for what passed (stream.Charge), whenever it left.
func (s *scope) released(out *stream.Outcome) bool {
	switch {
	case s.upstreamKind == "canceled":
		return false
	case s.upstreamStatus >= 400 || s.upstreamStatus == 0:
		return true
	}
	return s.upstreamKind != "" && out != nil && out.TextBytes == 0 && !out.Usage
}

// afterAnswer runs a store write that follows an answer (a token debit, a settle, a refund)
// off the request path, bounded by debitTimeout; Close waits for those under way.
func (g *Gateway) afterAnswer(write func(ctx context.Context)) {
	g.debits.Add(1)
	go func() {
		defer g.debits.Done()
		ctx, cancel := context.WithTimeout(context.Background(), debitTimeout)
		defer cancel()
		write(ctx)
	}()
}

// Close waits, until ctx ends, for the token debits and refunds still under way, so that a
// shutdown does not lose the last answers' tokens or refunds. Call it once the listeners are
// shut down.
func (g *Gateway) Close(ctx context.Context) error {
	done := make(chan struct{})
	go func() { g.debits.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// settleHolds ends the request's token holds and stream slots when its answer has ended, for
// whatever reason (finish, cut, upstream error, client gone): a slot is given back; a hold
// becomes the answer's tokens as stream.Charge has them (capped by the hold when no text
// passed), or is released when the answer costs nothing (released). One store write off the
// request path (one per amount when the held limits' caps give different ones); a hold
// whose write fails comes back after reserve_ttl.
func (g *Gateway) settleHolds(s *scope, out *stream.Outcome) {
	if len(s.held) == 0 || g.limiter == nil {
		return
	}
	c := stream.ChargeOf(out, s.promptBytes)
	released := s.released(out)
	hold, route := s.hold, s.route.name
	amount := func(h limits.Hit) int64 {
		switch {
		case released:
			return -1
		case h.Rule.Unit != limits.Tokens:
			return anyAmount
		case out == nil && s.upstreamKind != "canceled": // an answer that is no stream
			return 0
		}
		return c.Of(h.Rule.EstimateMax, h.Rule.Reserve)
	}
	keeper := &s.keeper
	byAmount(s.held, amount, func(held []limits.Hit, n int64) {
		n = max(n, -1) // slots alone: given back, nothing charged
		g.afterAnswer(func(ctx context.Context) {
			keeper.stop() // no refresh may follow the settle
			expired, err := g.limiter.Settle(ctx, hold, g.inForce(s, held), n)
			if err != nil {
				// The holds and slots come back when their reserve_ttl ends; the tokens are lost.
				g.log.Warn("settling holds failed", zap.String("route", route), zap.Int64("tokens", n), zap.Error(err))
			}
			for _, name := range expired {
				g.metrics.HoldExpired(name)
			}
		})
	})
}

// inForce maps the hits of an answer admitted under an earlier config to the rules of the
// config in force where they count in the same counter (the same limit and plan, unit and
// algorithm), so that an answer that ends after a reload changed the limit's window is charged
// in the window the limit counts in now: the one it ends in. A hit whose limit changed its
// unit or algorithm, or is gone, keeps its rule (its counter).
func (g *Gateway) inForce(s *scope, hits []limits.Hit) []limits.Hit {
	sn := g.snap.Load()
	if sn == s.snap {
		return hits
	}
	out := slices.Clone(hits)
	for i, h := range out {
		for _, l := range sn.limitsOfPlan(s.plan) {
			if r := l.rule; r.Name == h.Rule.Name && r.Unit == h.Rule.Unit && r.Algorithm == h.Rule.Algorithm {
				out[i].Rule = r
			}
		}
	}
	return out
}

// keepHeld records the token holds and stream slots an admitting decision took, to be
// settled when the answer ends. A tokens limit whose hold was taken is settled with it, not
// debited; one without (no reserve, or a shadow limit that had no room for it) is debited.
func (s *scope) keepHeld(hits []limits.Hit, d *limits.Decision) {
	s.hold, s.held = d.Hold, d.Held(hits, s.heldBuf[:0])
	if len(s.held) == 0 {
		return
	}
	debited := s.tokenHits[:0]
	for _, h := range s.tokenHits {
		if !slices.Contains(s.held, h) {
			debited = append(debited, h)
		}
	}
	s.tokenHits = debited
}
