package proxy

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/docsgate/gateway/limits"
)

// Failed authentications are counted per client IP, in process, in a limits.Memory store of
// their own: past auth.failure_limit per minute, a client gets 429 too_many_auth_failures and
// none of its keys is looked up. A spray of invented keys then costs the registry (and Redis
// behind it) at most failure_limit lookups per client and minute.

// authFailRule builds the rule for auth.failure_limit; nil when it is off.
func authFailRule(limit int) *limits.Rule {
	if limit <= 0 {
		return nil
	}
	w, _ := limits.ParseWindow("1m") // a constant: cannot fail
	return &limits.Rule{Name: "auth_failures", Limit: int64(limit), Window: w}
}

// authFailuresSpent answers the request with 429 when its client has spent its failure
// budget, and reports whether it did.
func (g *Gateway) authFailuresSpent(s *scope) bool {
	rule := s.snap.authFail
	if rule == nil {
		return false
	}
	u, err := g.authFailures.Usage(context.Background(), rule, s.snap.ipID(s))
	if err != nil || u.Used < u.Limit {
		return false
	}
	retry := max(int64(time.Until(u.Reset)+time.Second-1)/int64(time.Second), 1)
	s.route.metrics.AuthRejected("too_many_failures")
	s.w.Header().Set(hdrRetryAfter, strconv.FormatInt(retry, 10))
	s.fail(http.StatusTooManyRequests, errorBody{
		Error:      fmt.Sprintf("Too many failed authentications from this address. Please retry in %s.", humanSeconds(retry)),
		Code:       codeTooManyAuthFailures,
		RetryAfter: &retry,
	})
	return true
}

// countAuthFailure adds one failed authentication to the client's budget.
func (g *Gateway) countAuthFailure(s *scope) {
	rule := s.snap.authFail
	if rule == nil {
		return
	}
	var d limits.Decision
	_ = g.authFailures.Take(context.Background(), []limits.Hit{{Rule: rule, ID: s.snap.ipID(s)}}, &d)
}
