package metrics

import "github.com/prometheus/client_golang/prometheus"

func newRefunds() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gateway_ratelimit_refunds_total",
		Help: "Units given back to a limit, by limit and reason (upstream_401, upstream_403: the upstream refused the request's credentials, so the request does not count).",
	}, []string{"limit", "reason"})
}

// Refunded counts one unit given back to limit (a configured limit's name) for reason, a
// fixed vocabulary.
func (m *Metrics) Refunded(limit, reason string) {
	m.refunds.WithLabelValues(limit, reason).Inc()
}
