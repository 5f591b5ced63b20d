// Package metrics defines every Prometheus series the gateway exports; nothing else in the
// gateway imports Prometheus. Labels never hold a key, an IP or a project id.
package metrics

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics holds the collectors. Build one per process with New.
type Metrics struct {
	requests             *prometheus.CounterVec
	requestDuration      *prometheus.HistogramVec
	inflight             *prometheus.GaugeVec
	authRejections       *prometheus.CounterVec
	validationRejections *prometheus.CounterVec
	upstreamErrors       *prometheus.CounterVec
	upstreamDuration     *prometheus.HistogramVec
	streamFirstByte      *prometheus.HistogramVec
	streamDuration       *prometheus.HistogramVec
	streamFinished       *prometheus.CounterVec
}

// Latency buckets from 1 ms to 30 s: gateway overhead sits at the low end, streamed answers at
// the high end.
var latencyBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

// New registers the gateway's collectors, plus the Go and process collectors, on reg.
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gateway_requests_total",
			Help: "Requests answered, by route and HTTP status code.",
		}, []string{"route", "code"}),
		requestDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gateway_request_duration_seconds",
			Help:    "Time from request arrival to the end of the response, by route.",
			Buckets: latencyBuckets,
		}, []string{"route"}),
		inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gateway_inflight_requests",
			Help: "Requests being served now, streams included, by route.",
		}, []string{"route"}),
		authRejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gateway_auth_rejections_total",
			Help: "Requests refused for their credentials, by route and reason.",
		}, []string{"route", "reason"}),
		validationRejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gateway_validation_rejections_total",
			Help: "Requests refused for their body, by route and field (array indexes folded to []).",
		}, []string{"route", "field"}),
		upstreamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gateway_upstream_errors_total",
			Help: "Failed upstream exchanges, by route and kind (unavailable, timeout, reset, canceled).",
		}, []string{"route", "kind"}),
		upstreamDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gateway_upstream_duration_seconds",
			Help:    "Time from forwarding a request to the upstream's response headers, by route.",
			Buckets: latencyBuckets,
		}, []string{"route"}),
		streamFirstByte: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gateway_stream_first_byte_seconds",
			Help:    "Time from request arrival to the first streamed body byte sent to the client, by route.",
			Buckets: latencyBuckets,
		}, []string{"route"}),
		streamDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gateway_stream_duration_seconds",
			Help:    "Time from request arrival to the end of a streamed answer, by route.",
			Buckets: latencyBuckets,
		}, []string{"route"}),
		streamFinished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gateway_stream_finished_total",
			Help: "Streamed answers by the finish reason of their d: part; incomplete when none was seen.",
		}, []string{"route", "reason"}),
	}
	reg.MustRegister(
		m.requests, m.requestDuration, m.inflight, m.authRejections, m.validationRejections,
		m.upstreamErrors, m.upstreamDuration, m.streamFirstByte, m.streamDuration, m.streamFinished,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}

// Route holds one route's pre-resolved series, so the request path does no label lookups for
// the common cases.
type Route struct {
	m               *Metrics
	name            string
	codes           map[int]prometheus.Counter // read-only after construction
	Duration        prometheus.Observer
	Inflight        prometheus.Gauge
	UpstreamLatency prometheus.Observer
	FirstByte       prometheus.Observer
	StreamDuration  prometheus.Observer
}

// commonCodes are pre-resolved; others are looked up when they occur.
var commonCodes = []int{200, 201, 202, 204, 400, 401, 403, 404, 405, 408, 413, 415, 429, 499, 500, 502, 503, 504}

// Route resolves the series of one route.
func (m *Metrics) Route(name string) *Route {
	r := &Route{
		m:               m,
		name:            name,
		codes:           make(map[int]prometheus.Counter, len(commonCodes)),
		Duration:        m.requestDuration.WithLabelValues(name),
		Inflight:        m.inflight.WithLabelValues(name),
		UpstreamLatency: m.upstreamDuration.WithLabelValues(name),
		FirstByte:       m.streamFirstByte.WithLabelValues(name),
		StreamDuration:  m.streamDuration.WithLabelValues(name),
	}
	for _, c := range commonCodes {
		r.codes[c] = m.requests.WithLabelValues(name, strconv.Itoa(c))
	}
	return r
}

// Request counts one answered request.
func (r *Route) Request(code int) {
	if c, ok := r.codes[code]; ok {
		c.Inc()
		return
	}
	r.m.requests.WithLabelValues(r.name, strconv.Itoa(code)).Inc()
}

// AuthRejected counts a refusal for credentials; reason is a fixed vocabulary from auth.
func (r *Route) AuthRejected(reason string) {
	r.m.authRejections.WithLabelValues(r.name, reason).Inc()
}

// ValidationRejected counts a refusal for the body; field must come from the validators'
// fixed vocabulary (indexes folded), never from client input.
func (r *Route) ValidationRejected(field string) {
	r.m.validationRejections.WithLabelValues(r.name, field).Inc()
}

// UpstreamError counts a failed upstream exchange.
func (r *Route) UpstreamError(kind string) {
	r.m.upstreamErrors.WithLabelValues(r.name, kind).Inc()
}

// StreamFinished counts a streamed answer by its finish reason.
func (r *Route) StreamFinished(reason string) {
	r.m.streamFinished.WithLabelValues(r.name, reason).Inc()
}
