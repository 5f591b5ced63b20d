package metrics

import "github.com/prometheus/client_golang/prometheus"

func newStreamCutoffs() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gateway_stream_cutoffs_total",
		Help: "Streamed answers the gateway ended because their tokens would have taken the tenant past a tokens limit with cutoff (ended as a valid stream of their protocol: an error, then the finish), by route and limit.",
	}, []string{"route", "limit"})
}

// CutoffSeries makes the gateway_stream_cutoffs_total series of a streamed route and a limit
// with cutoff exist at 0, so that increase() sees the first cutoff.
func (m *Metrics) CutoffSeries(route, limit string) {
	m.streamCutoffs.WithLabelValues(route, limit)
}

// StreamCutoff counts an answer of this route ended by limit's cutoff. Rare: the series is
// looked up when it happens.
func (r *Route) StreamCutoff(limit string) {
	r.m.streamCutoffs.WithLabelValues(r.name, limit).Inc()
}
