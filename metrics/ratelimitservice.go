package metrics

import "github.com/prometheus/client_golang/prometheus"

// rlsCodes are the outcomes of a ShouldRateLimit call (gateway_rls_requests_total's code).
var rlsCodes = []string{"ok", "over_limit", "invalid_argument", "unavailable", "allowed_on_error"}

func newRLSRequests() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gateway_rls_requests_total",
		Help: "Calls of Envoy's rate limit service (ShouldRateLimit), by domain (a configured one, else unknown) and code (ok, over_limit, invalid_argument, unavailable: the store failed and redis.on_error is deny; allowed_on_error: it failed and on_error is allow).",
	}, []string{"domain", "code"})
}

func newRLSDuration() *prometheus.HistogramVec {
	return prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "gateway_rls_request_duration_seconds",
		Help:    "Time to answer a ShouldRateLimit call, by domain (a configured one, else unknown).",
		Buckets: latencyBuckets,
	}, []string{"domain"})
}

// RLSDomains makes every series of the rate limit service's domains exist at 0 (domains: the
// configured ones and "unknown").
func (m *Metrics) RLSDomains(domains []string) {
	for _, d := range domains {
		m.rlsDuration.WithLabelValues(d)
		for _, c := range rlsCodes {
			m.rlsRequests.WithLabelValues(d, c)
		}
	}
}

// RLSRequest counts one ShouldRateLimit call of domain (a configured one, else "unknown")
// answered with code (one of rlsCodes) after seconds.
func (m *Metrics) RLSRequest(domain, code string, seconds float64) {
	m.rlsRequests.WithLabelValues(domain, code).Inc()
	m.rlsDuration.WithLabelValues(domain).Observe(seconds)
}
