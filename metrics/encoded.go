package metrics

import "github.com/prometheus/client_golang/prometheus"

func newStreamsEncoded() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gateway_stream_encoded_total",
		Help: "Streamed answers the upstream sent with a content coding although the gateway asked for identity, by route and encoding: gzip, deflate, br and zstd are decoded and read as any answer; other is a coding the gateway cannot read, charged as an answer of unknown text (every byte of it counted as text).",
	}, []string{"route", "encoding"})
}

// StreamEncoded counts an answer of this route that came content-coded. Rare: the series is
// looked up when it happens.
func (r *Route) StreamEncoded(encoding string) {
	r.m.streamsEncoded.WithLabelValues(r.name, encoding).Inc()
}
