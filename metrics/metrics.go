// Package metrics defines every Prometheus series the gateway exports.
//
// Nothing else in the gateway imports Prometheus. Labels never hold a key, an IP or a project id.
package metrics

import (
	"net/http"
	"sort"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
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
	decisions            *prometheus.CounterVec
	nearLimit            *prometheus.CounterVec
	limiterDuration      prometheus.Histogram
	limiterErrors        *prometheus.CounterVec
	breakerOpen          *prometheus.GaugeVec
	orgRequests          *prometheus.CounterVec
	deprecated           *prometheus.CounterVec
	streamTokens         *prometheus.CounterVec
	streamTokensEstim    *prometheus.CounterVec
	tokenLimitNear       *prometheus.CounterVec
	spansDropped         prometheus.Counter
	refunds              *prometheus.CounterVec   // refunds.go
	rlsRequests          *prometheus.CounterVec   // ratelimitservice.go
	rlsDuration          *prometheus.HistogramVec // ratelimitservice.go
	holdsExpired         *prometheus.CounterVec   // holds.go
	streamsStalled       *prometheus.CounterVec   // stalls.go
	streamCutoffs        *prometheus.CounterVec   // cutoffs.go
	streamsEncoded       *prometheus.CounterVec   // encoded.go
	notify               notifications            // notifications.go
	process              process                  // build.go
}

// Latency buckets from 1 ms to 30 s: gateway overhead sits at the low end, streamed answers at
// the high end.
var latencyBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

// New registers the gateway's collectors, plus the Go and process collectors and the old names
// of renamed metrics (see Renames), on reg.
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
			Help: "Streamed answers by finish reason: error when an error part passed (data stream 3: part, UI message stream error chunk), else the finish reason of the finish part (data stream d: part, UI message stream finish chunk), incomplete when none passed.",
		}, []string{"route", "reason"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gateway_ratelimit_decisions_total",
			Help: "Limit decisions by route, limit and decision (allowed, denied, shadow_denied, error). A denied request counts only under the limits that denied it; shadow_denied counts requests a shadow-mode limit would have denied.",
		}, []string{"route", "limit", "decision"}),
		nearLimit: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gateway_ratelimit_near_limit_total",
			Help: "Admitted requests that left 10% of a limit or less (90% or more spent).",
		}, []string{"route", "limit"}),
		limiterDuration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "gateway_ratelimit_decision_duration_seconds",
			Help:    "Time of one limiter decision (all limits of a request), round trip to Redis included.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25},
		}),
		limiterErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gateway_ratelimit_decision_errors_total",
			Help: "Limiter decisions that failed, by kind: node (the Redis node failed: refused or broken connections, LOADING, READONLY, CLUSTERDOWN, ...), timeout (no answer within redis.timeout), breaker_open (not called), data (Redis answered with an error about one key's data, e.g. WRONGTYPE; never moves the breaker), canceled (the request went away).",
		}, []string{"kind"}),
		breakerOpen: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gateway_ratelimit_breaker_open",
			Help: "1 while the limiter's circuit breaker of a Redis node (host:port; a Cluster master, or the master of a standalone or Sentinel setup) is open: calls bound for that node are refused without calling it; else 0.",
		}, []string{"node"}),
		orgRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gateway_org_requests_total",
			Help: "Requests on assistant routes by organization (configured orgs; all others are other) and limit decision.",
		}, []string{"org", "decision"}),
		deprecated: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gateway_deprecated_requests_total",
			Help: "Authenticated requests on deprecated routes, by route and organization (configured orgs; all others are other): who still has to migrate.",
		}, []string{"route", "org"}),
	}
	m.streamTokens = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gateway_stream_tokens_total",
		Help: "Tokens charged for streamed answers, by route, organization (configured orgs; all others are other) and kind (prompt or completion): the usage the upstream reported (data stream, v1: the d: part's, else the sum of the e: parts that passed; UI message stream, v2: the last messageMetadata.usage), else an estimate (see gateway_stream_tokens_estimated_total).",
	}, []string{"route", "org", "kind"})
	m.streamTokensEstim = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gateway_stream_tokens_estimated_total",
		Help: "Tokens charged by estimate for streamed answers that reported no usage (cut, or closed by the client, before it), by route and kind: prompt is the conversation text's bytes / 4 (at most the limit's estimate_max), completion the answer text's UTF-8 bytes that passed / 4, rounded up. Also counted in gateway_stream_tokens_total.",
	}, []string{"route", "kind"})
	m.tokenLimitNear = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gateway_ratelimit_tokens_near_limit_total",
		Help: "Requests decided while their tokens limit was 90% or more spent (admitted, denied or shadow-denied), by route and limit.",
	}, []string{"route", "limit"})
	m.spansDropped = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "gateway_trace_spans_dropped_total",
		Help: "Trace spans not exported: the export queue was full (the collector is down or slow) or the export failed.",
	})
	m.refunds = newRefunds()
	m.rlsRequests, m.rlsDuration = newRLSRequests(), newRLSDuration()
	m.holdsExpired = newHoldsExpired()
	m.streamsStalled = newStreamsStalled()
	m.streamCutoffs = newStreamCutoffs()
	m.streamsEncoded = newStreamsEncoded()
	m.notify = newNotifications()
	m.process = newProcess()
	reg.MustRegister(m.process.collectors()...)
	reg.MustRegister(m.deprecatedCollectors()...)
	reg.MustRegister(m.notify.collectors()...)
	reg.MustRegister(
		m.refunds, m.rlsRequests, m.rlsDuration, m.holdsExpired, m.streamsStalled, m.streamCutoffs, m.streamsEncoded,
		m.orgRequests, m.deprecated, m.streamTokens, m.streamTokensEstim, m.tokenLimitNear, m.spansDropped,
		m.decisions, m.nearLimit, m.limiterDuration, m.limiterErrors, m.breakerOpen,
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

	// The series of a streaming route's answers, resolved when its config is compiled
	// (FinishReasons, StreamOrgs) and read-only once it serves, so that an answer's end costs
	// no label lookup (a label lookup hashes and checks every label value, under a lock):
	// finished by result, tokens by org (prompt, completion), estimated (prompt, completion).
	finished  map[string]prometheus.Counter
	tokens    map[string]*[2]prometheus.Counter
	estimated [2]prometheus.Counter

	// exemplarAt is when each bucket of Duration (latencyBuckets, then +Inf) last took an
	// exemplar, Unix ns (see ObserveDuration).
	exemplarAt []atomic.Int64
}

// exemplarEvery bounds how often a bucket of a route's request histogram takes a new trace-id
// exemplar. A bucket keeps only its latest, and a scrape (every 15 s or more) sees only that,
// while making one costs about 8 allocations (a label map, the exemplar, its timestamp): with
// tracing on, one per request before.
const exemplarEvery = time.Second

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
		exemplarAt:      make([]atomic.Int64, len(latencyBuckets)+1),
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

// Deprecated counts one authenticated use of this (deprecated) route by org, a configured
// organization or "other".
func (r *Route) Deprecated(org string) {
	r.m.deprecated.WithLabelValues(r.name, org).Inc()
}

// StreamFinished counts a streamed answer by its finish reason.
func (r *Route) StreamFinished(reason string) {
	if c, ok := r.finished[reason]; ok {
		c.Inc()
		return
	}
	r.m.streamFinished.WithLabelValues(r.name, reason).Inc()
}

// LimiterErrorKinds creates the gateway_ratelimit_decision_errors_total series of these kinds at 0, so
// that rates and alerts see them before the first error.
func (m *Metrics) LimiterErrorKinds(kinds ...string) {
	for _, k := range kinds {
		m.limiterErrors.WithLabelValues(k)
	}
}

// LimiterCall records one limiter decision's duration and, when it failed, the kind of its
// error ("" when it did not fail).
func (m *Metrics) LimiterCall(seconds float64, errKind string) {
	m.limiterDuration.Observe(seconds)
	if errKind != "" {
		m.limiterErrors.WithLabelValues(errKind).Inc()
	}
}

// BreakerOpen sets gateway_ratelimit_breaker_open of node.
func (m *Metrics) BreakerOpen(node string, open bool) {
	g := m.breakerOpen.WithLabelValues(node)
	if open {
		g.Set(1)
		return
	}
	g.Set(0)
}

// BreakerGone removes node's gateway_ratelimit_breaker_open: the node left the Redis layout.
func (m *Metrics) BreakerGone(node string) {
	m.breakerOpen.DeleteLabelValues(node)
}

// Limit holds the pre-resolved series of one limit applied by one route.
type Limit struct {
	Allowed, Denied, ShadowDenied, Error, NearLimit prometheus.Counter
	// TokensNear counts admissions with 90% or more of a tokens limit spent; nil for
	// requests limits.
	TokensNear prometheus.Counter
}

// Limit resolves the series of limit name applied by this route; tokens says it counts tokens.
func (r *Route) Limit(name string, tokens bool) *Limit {
	d := r.m.decisions
	l := &Limit{
		Allowed:      d.WithLabelValues(r.name, name, "allowed"),
		Denied:       d.WithLabelValues(r.name, name, "denied"),
		ShadowDenied: d.WithLabelValues(r.name, name, "shadow_denied"),
		Error:        d.WithLabelValues(r.name, name, "error"),
		NearLimit:    r.m.nearLimit.WithLabelValues(r.name, name),
	}
	if tokens {
		l.TokensNear = r.m.tokenLimitNear.WithLabelValues(r.name, name)
	}
	return l
}

// Tokens counts a streamed answer's tokens for org (a configured organization or "other").
func (r *Route) Tokens(org string, prompt, completion int64) {
	if c := r.tokens[org]; c != nil {
		addTokens(c, prompt, completion)
		return
	}
	if prompt > 0 {
		r.m.streamTokens.WithLabelValues(r.name, org, "prompt").Add(float64(prompt))
	}
	if completion > 0 {
		r.m.streamTokens.WithLabelValues(r.name, org, "completion").Add(float64(completion))
	}
}

// TokensEstimated counts the tokens charged by estimate for an answer that reported no usage.
func (r *Route) TokensEstimated(prompt, completion int64) {
	if r.estimated[0] != nil {
		addTokens(&r.estimated, prompt, completion)
		return
	}
	if prompt > 0 {
		r.m.streamTokensEstim.WithLabelValues(r.name, "prompt").Add(float64(prompt))
	}
	if completion > 0 {
		r.m.streamTokensEstim.WithLabelValues(r.name, "completion").Add(float64(completion))
	}
}

// addTokens adds prompt and completion tokens to their two series, each when not 0.
func addTokens(c *[2]prometheus.Counter, prompt, completion int64) {
	if prompt > 0 {
		c[0].Add(float64(prompt))
	}
	if completion > 0 {
		c[1].Add(float64(completion))
	}
}

// Org holds one organization's pre-resolved series. Only configured organizations get their
// own label value, so the label's cardinality is bounded by the config.
type Org struct {
	Allowed, Denied, Error prometheus.Counter
}

// Org resolves the series of one organization ("other" for all unconfigured ones).
func (m *Metrics) Org(name string) *Org {
	return &Org{
		Allowed: m.orgRequests.WithLabelValues(name, "allowed"),
		Denied:  m.orgRequests.WithLabelValues(name, "denied"),
		Error:   m.orgRequests.WithLabelValues(name, "error"),
	}
}

// Handler serves the exposition of g (the registry New registered on), in OpenMetrics when
// the scraper asks for it, which carries the request histogram's trace exemplars.
func Handler(g prometheus.Gatherer) http.Handler {
	return promhttp.HandlerFor(g, promhttp.HandlerOpts{EnableOpenMetrics: true})
}

// ObserveDuration records a request's duration, with its trace id as an exemplar when it was
// traced and sampled ("" otherwise) and its bucket has taken none for exemplarEvery.
func (r *Route) ObserveDuration(seconds float64, traceID string) {
	if traceID != "" && r.takeExemplar(seconds) {
		if eo, ok := r.Duration.(prometheus.ExemplarObserver); ok {
			eo.ObserveWithExemplar(seconds, prometheus.Labels{"trace_id": traceID})
			return
		}
	}
	r.Duration.Observe(seconds)
}

// takeExemplar says whether an observation of seconds may replace its bucket's exemplar now
// (see exemplarEvery); the histogram's bucket is the first whose upper bound is not below it.
func (r *Route) takeExemplar(seconds float64) bool {
	at := &r.exemplarAt[sort.SearchFloat64s(latencyBuckets, seconds)]
	now, last := time.Now().UnixNano(), at.Load()
	return now-last >= int64(exemplarEvery) && at.CompareAndSwap(last, now)
}

// TraceSpansDropped counts spans the exporter never sent (queue full, or export failed).
func (m *Metrics) TraceSpansDropped(n int) {
	m.spansDropped.Add(float64(n))
}
