package metrics

import "github.com/prometheus/client_golang/prometheus"

// Series of known label values, created at 0 when the config is compiled (at start and at
// each reload), so that rate() and increase() see their first event and the alerts and
// dashboard panels find every series from the first scrape.

// AuthReasons creates this route's gateway_auth_rejections_total series of reasons.
func (r *Route) AuthReasons(reasons ...string) {
	for _, reason := range reasons {
		r.m.authRejections.WithLabelValues(r.name, reason)
	}
}

// UpstreamKinds creates this route's gateway_upstream_errors_total series of kinds.
func (r *Route) UpstreamKinds(kinds ...string) {
	for _, k := range kinds {
		r.m.upstreamErrors.WithLabelValues(r.name, k)
	}
}

// FinishReasons creates this (streaming) route's gateway_stream_finished_total series of
// reasons, and keeps them for StreamFinished. Call it before the route serves.
func (r *Route) FinishReasons(reasons ...string) {
	r.finished = make(map[string]prometheus.Counter, len(reasons))
	for _, reason := range reasons {
		r.finished[reason] = r.m.streamFinished.WithLabelValues(r.name, reason)
	}
}

// StreamOrgs creates this (streaming) route's gateway_stream_tokens_total series of orgs
// (configured orgs and "other") and gateway_stream_tokens_estimated_total series, and keeps
// them for Tokens and TokensEstimated. Call it before the route serves.
func (r *Route) StreamOrgs(orgs ...string) {
	r.tokens = make(map[string]*[2]prometheus.Counter, len(orgs))
	for _, org := range orgs {
		r.tokens[org] = &[2]prometheus.Counter{
			r.m.streamTokens.WithLabelValues(r.name, org, "prompt"),
			r.m.streamTokens.WithLabelValues(r.name, org, "completion"),
		}
	}
	r.estimated = [2]prometheus.Counter{
		r.m.streamTokensEstim.WithLabelValues(r.name, "prompt"),
		r.m.streamTokensEstim.WithLabelValues(r.name, "completion"),
	}
}

// DeprecatedOrgs creates this (deprecated) route's gateway_deprecated_requests_total series
// of orgs.
func (r *Route) DeprecatedOrgs(orgs ...string) {
	for _, org := range orgs {
		r.m.deprecated.WithLabelValues(r.name, org)
	}
}

// RefundReasons creates limit's gateway_ratelimit_refunds_total series of reasons.
func (m *Metrics) RefundReasons(limit string, reasons ...string) {
	for _, reason := range reasons {
		m.refunds.WithLabelValues(limit, reason)
	}
}
