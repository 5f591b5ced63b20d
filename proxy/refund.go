package proxy

import (
	"net/http"

	"github.com/docsgate/gateway/engine"
)

// The upstream has the last word on keys: in prefix mode the gateway only checks a key's
// family, so a request with an invented key is counted before the upstream refuses it, and a
// stream of such requests would spend a tenant's quota (agent_job_per_project,
// assistant_per_org) without any real key. When the upstream answers 401 or 403, the request
// did not deserve counting: its units are given back, all in one store call made after the
// answer, off the request path (the request itself still costs exactly one decision before
// it is forwarded). So that refunds are no free pass to hammer the upstream, the refusal
// counts against the client's auth.failure_limit budget like the gateway's own 401s: past it
// the client gets 429 too_many_auth_failures before anything is forwarded.
//
// What it cannot do: a unit is held from the decision until the upstream has answered and
// the refund has run, so attackers with enough requests in flight at once still hold that
// much quota while they are in flight.

// upstreamRefusedKey handles an upstream 401 or 403: the failure counts against the client's
// budget, and what the request took is given back (engine.Refund).
func (g *Gateway) upstreamRefusedKey(s *scope, status int) {
	g.keys.upstreamRefused(s)
	reason := engine.RefundUpstream401
	if status == http.StatusForbidden {
		reason = engine.RefundUpstream403
	}
	if g.quota.engine.Refund(&s.adm, reason, s.route.Name) {
		s.refund = reason
	}
}
