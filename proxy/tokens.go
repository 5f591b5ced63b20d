package proxy

import (
	"context"
	"time"

	"go.uber.org/zap"
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
	g.debits.Add(1)
	go func() {
		defer g.debits.Done()
		ctx, cancel := context.WithTimeout(context.Background(), debitTimeout)
		defer cancel()
		if err := g.limiter.Debit(ctx, hits, n); err != nil {
			// The tokens are lost to the limit (never double-counted): say so, with numbers.
			g.log.Warn("token debit failed", zap.String("route", route), zap.Int64("tokens", n), zap.Error(err))
		}
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
