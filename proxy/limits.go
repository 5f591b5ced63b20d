package proxy

import (
	"fmt"
	"net/http"
	"strconv"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"

	"github.com/docsgate/gateway/apierror"
	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/engine"
	"github.com/docsgate/gateway/limits"
	"github.com/docsgate/gateway/metrics"
	"github.com/docsgate/gateway/policy"
	"github.com/docsgate/gateway/tracing"
)

// quota is the pipeline's side of the engine: it asks for a request's decision, tells the
// client what it learns of it, and settles the request's account when its answer ends.
type quota struct {
	engine       *engine.Engine
	tracing      *tracing.Spans // nil: off
	log          *zap.Logger
	allowOnError bool      // redis.on_error: allow
	states       sync.Pool // *limitState
}

// limitState is the per-request scratch space of a decision, pooled so that a limited request
// allocates no slices.
type limitState struct {
	d   engine.Decision
	buf []byte
}

// limit applies the route's limits for the request's plan, in three steps: decide (the
// engine's one decision for all of them, one store call), account (metrics and the access
// log's fields) and answer (the rate-limit headers, and the 429 or 503 when the request must
// not be forwarded, in which case it returns false).
func (q *quota) limit(s *scope, r *http.Request) bool {
	if s.route.HasDomain {
		s.orgMetrics = s.snap.orgMetric(s.org)
	}
	set := s.route.setFor(s.plan)
	if len(set.Limits) == 0 {
		s.countOrg(orgAllowed)
		return true
	}
	s.limited = true
	st := q.states.Get().(*limitState)
	defer q.states.Put(st)
	err := q.decide(s, r, set, &st.d)
	s.account(set, &st.d, err)
	if err == nil && st.d.Allowed {
		q.keepCutoffs(s, set)
	}
	return q.answer(s, set, st, err)
}

// decide asks the engine about every limit of set at once, under the ratelimit span: the
// request's ids for its limits, from its path, key, org and address.
func (q *quota) decide(s *scope, r *http.Request, set *routeSet, d *engine.Decision) error {
	req := engine.Request{Set: set.LimitSet, Digest: s.digest, Org: s.org, Label: s.label, Start: s.start}
	if s.route.Key == auth.Admin {
		req.Project = r.PathValue("projectId")
	}
	if set.Counts(policy.ByIP) {
		req.ClientID = s.snap.ipID(s)
	}
	ctx := r.Context()
	var span trace.Span
	if q.tracing != nil {
		ctx, span = q.tracing.Child(ctx, "ratelimit", set.spanAttrs...)
	}
	err := q.engine.Admit(ctx, &req, d, &s.adm)
	if span != nil {
		switch {
		case !span.IsRecording(): // not sampled: nothing to record
		case err != nil:
			span.SetStatus(codes.Error, "limiter_error")
			span.SetAttributes(attribute.String("error.type", "limiter_error"))
		default:
			span.SetAttributes(attribute.Bool("gateway.ratelimit.allowed", d.Allowed))
		}
		span.End()
	}
	return err
}

// account records a decision: the metrics of each limit and of the org, and what the access
// log says (shadow_denied, limiter_error).
func (s *scope) account(set *routeSet, d *engine.Decision, err error) {
	if err != nil {
		for _, m := range set.metrics {
			m.Error.Inc()
		}
		s.limitErr = true
		s.countOrg(orgError)
		return
	}
	for i, l := range set.Limits {
		res, m := &d.Results[i], set.metrics[i]
		near := nearLimit(res)
		// A tenant at 90% of a tokens budget or past it, whether this request is admitted,
		// denied, or only shadow-denied: what the token alert watches.
		if near && m.TokensNear != nil {
			m.TokensNear.Inc()
		}
		switch {
		case d.Allowed && res.Allowed:
			m.Allowed.Inc()
			if near {
				m.NearLimit.Inc()
			}
		case d.Allowed: // a shadow limit that would have denied
			m.ShadowDenied.Inc()
			s.shadowDenied = l.Rule.Name
		case !res.Allowed && !l.Shadow: // a denied request counts only under its deniers
			m.Denied.Inc()
		}
	}
	if d.Allowed {
		s.countOrg(orgAllowed)
		return
	}
	s.countOrg(orgDenied)
}

// nearLimit is the one definition of "near the limit": 10% of it or less remains (90% or more
// is spent), after this request if it was charged, of the tenant's allowance (its override
// and grants included). gateway_ratelimit_near_limit_total counts
// admissions that leave a limit there, gateway_ratelimit_tokens_near_limit_total every decision that
// finds a tokens limit there. Inclusive, because operators read these as "at 90%", as the
// usage page's marks are inclusive ("≥ 80%", "at limit"): a tenant that has spent exactly 90
// of 100 is at 90%.
func nearLimit(res *limits.Result) bool {
	return res.Remaining*10 <= res.Limit
}

// The decisions of gateway_org_requests_total.
const (
	orgAllowed = iota
	orgDenied
	orgError
)

// countOrg counts the request under its org's series (routes with {domain} only).
func (s *scope) countOrg(decision int) {
	m := s.orgMetrics
	if m == nil {
		return
	}
	switch decision {
	case orgAllowed:
		m.Allowed.Inc()
	case orgDenied:
		m.Denied.Inc()
	default:
		m.Error.Inc()
	}
}

// answer writes what the client learns of the decision: the rate-limit headers, and the 429
// (or the 503 of a failed limiter, unless redis.on_error lets the request through). It returns
// whether the request goes on to the upstream.
func (q *quota) answer(s *scope, set *routeSet, st *limitState, err error) bool {
	if err != nil {
		if q.allowOnError {
			return true
		}
		s.w.Header()[hdrRetryAfter] = retryAfterOne
		s.fail(http.StatusServiceUnavailable, apierror.Body{
			Error: "Rate limiting is temporarily unavailable. Please retry in a moment.",
			Code:  apierror.LimiterUnavailable,
		})
		return false
	}
	dec := &st.d.Decision
	h := s.w.Header()
	h[hdrPolicy] = set.PolicyFor(dec)
	var v engine.HeaderValues
	v, st.buf = engine.RateLimitHeaders(st.buf[:0], dec, set.Limits)
	s.header(h, slotRateLimit, hdrRateLimit, v.RateLimit)
	if v.Limit != "" {
		s.header(h, slotLimit, hdrLimit, v.Limit)
		s.header(h, slotRemaining, hdrRemaining, v.Remaining)
		s.header(h, slotReset, hdrReset, v.Reset)
	}
	if dec.Allowed {
		return true
	}
	denied := &dec.Results[engine.Denial(dec, set.Limits)]
	retry := engine.Seconds(engine.UntilAdmitted(denied))
	s.deniedBy = denied.Rule.Name
	h.Set(hdrRetryAfter, strconv.FormatInt(retry, 10))
	s.fail(http.StatusTooManyRequests, apierror.Body{
		Error:      fmt.Sprintf("Rate limit exceeded (%s). Please retry in %s.", denied.Rule.Name, humanSeconds(retry)),
		Code:       apierror.RateLimited,
		Limit:      denied.Rule.Name,
		RetryAfter: &retry,
	})
	return false
}

// retryAfterOne is the Retry-After of a 503, shared read-only by requests.
var retryAfterOne = []string{"1"}

// limitSpanAttrs are the ratelimit span's attributes of set: the store and the limits
// decided, never a key, an id or the script.
func limitSpanAttrs(set *routeSet, store string) []attribute.KeyValue {
	names := make([]string, len(set.Limits))
	for i, l := range set.Limits {
		names[i] = l.Rule.Name
	}
	attrs := []attribute.KeyValue{attribute.StringSlice("gateway.ratelimit.limits", names)}
	if store != "" {
		attrs = append(attrs, attribute.String("db.system.name", store))
	}
	return attrs
}

func humanSeconds(s int64) string {
	switch {
	case s == 1:
		return "1 second"
	case s < 120:
		return strconv.FormatInt(s, 10) + " seconds"
	case s < 2*3600:
		return strconv.FormatInt((s+59)/60, 10) + " minutes"
	}
	return strconv.FormatInt((s+3599)/3600, 10) + " hours"
}

// otherOrg labels every organization the config does not name.
const otherOrg = "other"

// orgLabel is the org's metric label: configured orgs by name, everyone else "other", so the
// label's values are bounded by the config.
func (sn *snapshot) orgLabel(org string) string {
	if _, ok := sn.orgMetrics[org]; ok {
		return org
	}
	return otherOrg
}

// orgMetric picks the org's series: configured orgs have their own, everyone else shares one.
func (sn *snapshot) orgMetric(org string) *metrics.Org {
	if m, ok := sn.orgMetrics[org]; ok {
		return m
	}
	return sn.orgMetrics[otherOrg]
}

// ipID is the per-IP limit's id for the request's client.
func (sn *snapshot) ipID(s *scope) string {
	if s.clientIP.Is4() {
		return s.clientIPString() // shared with the access log
	}
	return sn.pol.AddrID(s.clientIP)
}
