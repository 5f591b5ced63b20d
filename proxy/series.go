package proxy

import (
	"slices"

	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/engine"
	"github.com/docsgate/gateway/metrics"
	"github.com/docsgate/gateway/stream"
)

// The label values the request path can give the metrics, created at 0 for a compiled config
// (see metrics/known.go): every route's refusal reasons and upstream error kinds, each stream
// route's finish reasons and token series per org, each deprecated route's orgs, each limit's
// refund reasons. A config that is rejected creates none.

// upstreamErrorKinds are the kinds upstreamErrorKind and forward give.
var upstreamErrorKinds = []string{"unavailable", "timeout", "reset", "canceled"}

// authReasons are the auth rejection reasons of the mode: auth.Check's, too_many_failures
// (auth.failure_limit) and, in registry mode, the registry's.
func authReasons(sn *snapshot, registry bool) []string {
	var out []string
	for _, r := range []auth.Reason{auth.Missing, auth.Malformed, auth.UnknownFamily, auth.WrongKind} {
		out = append(out, r.String())
	}
	if sn.authFailLimit > 0 {
		out = append(out, "too_many_failures")
	}
	if registry {
		out = append(out, "unknown_key", "revoked", "expired", "forbidden", "out_of_scope")
	}
	return out
}

// knownSeries creates the series of sn's routes and limits at 0, in m.
func knownSeries(m *metrics.Metrics, sn *snapshot, routes []*route, registry bool) {
	orgs := make([]string, 0, len(sn.orgMetrics))
	for org := range sn.orgMetrics { // the configured orgs and "other"
		orgs = append(orgs, org)
	}
	slices.Sort(orgs)
	reasons := authReasons(sn, registry)
	for _, rt := range routes {
		rm := rt.metrics
		rm.AuthReasons(reasons...)
		rm.UpstreamKinds(upstreamErrorKinds...)
		if rt.Stream {
			rm.FinishReasons(stream.Results()...)
			rm.StreamOrgs(orgs...)
			for _, set := range rt.sets {
				for _, l := range set.Limits {
					if l.Cutoff {
						m.CutoffSeries(rt.Name, l.Rule.Name)
					}
				}
			}
		}
		if rt.deprecation != nil {
			rm.DeprecatedOrgs(orgs...)
		}
	}
	for _, name := range sn.pol.EnabledLimits() {
		m.RefundReasons(name, engine.RefundReasons()...)
	}
}
