package metrics

import "github.com/prometheus/client_golang/prometheus"

func newHoldsExpired() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gateway_ratelimit_holds_expired_total",
		Help: "Token holds settled after their reserve_ttl had run out (their answer's tokens are charged all the same, possibly past the limit), by limit: answers longer than reserve_ttl, or a Redis that lost the hold.",
	}, []string{"limit"})
}

// HoldExpired counts one hold of limit (a configured limit's name) settled after it expired.
func (m *Metrics) HoldExpired(limit string) {
	m.holdsExpired.WithLabelValues(limit).Inc()
}

// HoldLimits makes the series of limits (those with holds) exist at 0, so that increase()
// sees their first expired hold and dashboards and alerts find them before it happens.
func (m *Metrics) HoldLimits(limits ...string) {
	for _, l := range limits {
		m.holdsExpired.WithLabelValues(l)
	}
}
