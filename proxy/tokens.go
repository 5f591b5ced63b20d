package proxy

import (
	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/engine"
	"github.com/docsgate/gateway/limits"
	"github.com/docsgate/gateway/stream"
)

// settle records a request's answer once it has ended (see stream.Charge): its tokens in the
// metrics (streams only), and what the engine settles of what the request owes: a debit of
// its tokens limits that hold nothing, its holds and slots. Those are store writes the engine
// makes off the request path, so they never delay a byte of the stream or the end of the
// request. out is nil when no stream began.
func (q *quota) settle(s *scope, out *stream.Outcome) {
	c := stream.ChargeOf(out, s.promptBytes)
	if out != nil {
		prompt, completion, estimated := c.Split(s.metricsEstimateMax(), 0)
		s.route.metrics.Tokens(s.snap.orgLabel(s.org), prompt, completion)
		if estimated {
			s.route.metrics.TokensEstimated(prompt, completion)
		}
	}
	if !s.adm.Owes() {
		return
	}
	q.engine.Finish(&s.adm, engine.Answer{
		Charge:    c,
		Released:  s.released(out),
		Unmetered: out == nil && s.upstreamKind != "canceled", // an answer that is no stream
		Policy:    s.snap.pol,
		Plan:      s.plan,
		Route:     s.route.Name,
	})
}

// trackProgress makes the request's answer publish what it passes (stream.Progress), for the
// refreshes of its holds (engine.KeepHolds); call it before they start.
func (s *scope) trackProgress() engine.Progress {
	s.progress.Start(s.promptBytes)
	s.tapBody.Track(&s.progress)
	return s
}

// Passed implements engine.Progress, from the refreshes' goroutine: it reads only the
// Progress, whose prompt was set before they started and whose counts are atomics.
func (s *scope) Passed(r *limits.Rule) int64 { return s.progress.Passed(r.EstimateMax, r.Reserve) }

// metricsEstimateMax is the estimate cap of the tokens metrics: the largest estimate_max of
// the request's tokens limits, else the default.
func (s *scope) metricsEstimateMax() int64 {
	if m := s.adm.EstimateMax(); m >= 0 {
		return m
	}
	return config.DefaultEstimateMax
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
