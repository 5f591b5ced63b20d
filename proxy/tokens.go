package proxy

import (
	"context"
	"slices"
	"time"

	"go.uber.org/zap"

	"github.com/docsgate/gateway/limits"
)

// debitTimeout bounds one token debit or refund. It runs after the answer, so it delays
// nobody, and it is not cut short by redis.timeout (the request path's budget): on a loaded
// Redis a write cut short would be lost.
const debitTimeout = 5 * time.Second

// countTokens records a streamed answer's tokens once it has ended, the usage it reported or
// else the estimate (streamOutcome.tokens): the metrics, and one debit of the request's
// tokens limits. The debit is one store write made off the request path, so it never
// delays a byte of the stream or the end of the request.
func (g *Gateway) countTokens(s *scope, out *streamOutcome) {
	prompt, completion, estimated := out.tokens(s.bodyBytes)
	s.route.metrics.Tokens(s.snap.orgLabel(s.org), prompt, completion)
	if estimated {
		s.route.metrics.TokensEstimated(prompt, completion)
	}
	n := prompt + completion
	if n <= 0 || len(s.tokenHits) == 0 || g.limiter == nil {
		return
	}
	hits, route := s.tokenHits, s.route.name
	g.afterAnswer(func(ctx context.Context) {
		if err := g.limiter.Debit(ctx, hits, n); err != nil {
			// The tokens are lost to the limit (never double-counted): say so, with numbers.
			g.log.Warn("token debit failed", zap.String("route", route), zap.Int64("tokens", n), zap.Error(err))
		}
	})
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
// becomes the answer's tokens (the usage the stream reported, or else the estimate, as
// countTokens charges them, so a client that went away pays for what passed), or is released
// when the upstream failed or refused (a 4xx or 5xx answer, an error before any answer text).
// One store write off the request path; a hold whose write fails comes back after reserve_ttl.
func (g *Gateway) settleHolds(s *scope, out *streamOutcome) {
	if len(s.held) == 0 || g.limiter == nil {
		return
	}
	n := int64(-1) // released
	switch {
	case s.upstreamKind == "canceled": // the client went away: charged like a stream without usage
		n = ceilQuarter(int64(s.bodyBytes))
		if out != nil {
			prompt, completion, _ := out.tokens(s.bodyBytes)
			n = prompt + completion
		}
	case s.upstreamStatus >= 400 || s.upstreamStatus == 0: // refused, or no answer at all
	case out == nil: // an answer that is no stream carries no usage
		n = 0
	case s.upstreamKind != "" && out.textBytes == 0 && !out.usage: // broke off before any text
	default:
		prompt, completion, _ := out.tokens(s.bodyBytes)
		n = prompt + completion
	}
	held, hold, route, keeper := s.held, s.hold, s.route.name, &s.keeper
	g.afterAnswer(func(ctx context.Context) {
		keeper.stop() // no refresh may follow the settle
		expired, err := g.limiter.Settle(ctx, hold, held, n)
		if err != nil {
			// The holds and slots come back when their reserve_ttl ends; the tokens are lost.
			g.log.Warn("settling holds failed", zap.String("route", route), zap.Int64("tokens", n), zap.Error(err))
		}
		for _, name := range expired {
			g.metrics.HoldExpired(name)
		}
	})
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
