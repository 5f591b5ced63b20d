package proxy

import (
	"fmt"
	"net/http"
	"net/netip"
	"strconv"
	"time"

	"github.com/docsgate/gateway/apierror"
)

// Failed authentications are counted per client IP (auth.FailureBudget): past
// auth.failure_limit in a minute, a client gets 429 too_many_auth_failures, none of its keys
// is looked up and nothing of it is forwarded. What counts: the upstream's 401s and 403s, in
// both modes (their units are given back, see refund.go, so they must cost the client
// something), and in registry mode the gateway's own 401s. In prefix mode the gateway's own
// 401s cost nothing (no lookup, no upstream, no quota), so they do not count.

// failureClient is the budget's key for the request's client: the address, or for IPv6 its
// client_ip.ipv6_prefix (one host usually holds a whole /64), as the per-IP limit counts.
func (sn *snapshot) failureClient(s *scope) netip.Addr {
	a := s.clientIP.Unmap().WithZone("")
	if a.Is4() || !a.IsValid() {
		return a
	}
	p, err := a.Prefix(sn.pol.IPv6Prefix())
	if err != nil {
		return a
	}
	return p.Addr()
}

// spent answers the request with 429 when its client has spent its failure budget, and
// reports whether it did.
func (k *keyCheck) spent(s *scope) bool {
	limit := s.snap.authFailLimit
	if limit <= 0 {
		return false
	}
	left, spent := k.failures.Spent(s.snap.failureClient(s), limit)
	if !spent {
		return false
	}
	retry := max(int64((left+time.Second-1)/time.Second), 1)
	s.route.metrics.AuthRejected("too_many_failures")
	s.w.Header().Set(hdrRetryAfter, strconv.FormatInt(retry, 10))
	s.fail(http.StatusTooManyRequests, apierror.Body{
		Error:      fmt.Sprintf("Too many failed authentications from this address. Please retry in %s.", humanSeconds(retry)),
		Code:       apierror.TooManyAuthFailures,
		RetryAfter: &retry,
	})
	return true
}

// fail adds one of the gateway's own failed authentications (a 401) to the client's budget:
// in registry mode, where each costs a lookup.
func (k *keyCheck) fail(s *scope) {
	if s.snap.authFailLimit > 0 && k.registry != nil {
		k.failures.Fail(s.snap.failureClient(s))
	}
}

// upstreamRefused adds an upstream 401 or 403 to the client's budget, in both modes: its
// units are given back (refund.go), so it must cost the client something.
func (k *keyCheck) upstreamRefused(s *scope) {
	if s.snap.authFailLimit > 0 {
		k.failures.Fail(s.snap.failureClient(s))
	}
}
