package metrics

import "github.com/prometheus/client_golang/prometheus"

func newStreamsStalled() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gateway_stream_stalled_total",
		Help: "Streams ended because their client accepted no byte of them for server.write_stall_timeout (their slots and holds settled as for a client that went away, the upstream connection closed), by route.",
	}, []string{"route"})
}

// StreamRoutes makes the gateway_stream_stalled_total series of routes (those that stream),
// and their gateway_stream_encoded_total series of answers the gateway cannot read, exist at 0,
// so that increase() sees their first stall or unreadable answer and alerts find them before
// it happens.
func (m *Metrics) StreamRoutes(routes ...string) {
	for _, r := range routes {
		m.streamsStalled.WithLabelValues(r)
		m.streamsEncoded.WithLabelValues(r, "other")
	}
}

// StreamStalled counts a stream of this route ended for its client's stall. Rare: the series
// is looked up when it happens.
func (r *Route) StreamStalled() {
	r.m.streamsStalled.WithLabelValues(r.name).Inc()
}
