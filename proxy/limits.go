package proxy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/limits"
	"github.com/docsgate/gateway/metrics"
)

// Limiter decides all hits of a request at once, all-or-nothing, debits tokens limits after
// answers, gives back what a request took when the upstream refused its key, and reads
// counters back.
type Limiter interface {
	Take(ctx context.Context, hits []limits.Hit, d *limits.Decision) error
	Usage(ctx context.Context, r *limits.Rule, id string) (limits.Usage, error)
	// Usages reads several counters at once, in one round trip (one per Redis node).
	Usages(ctx context.Context, hits []limits.Hit) ([]limits.Usage, error)
	Debit(ctx context.Context, hits []limits.Hit, n int64) error
	Refund(ctx context.Context, taken []limits.Taken) error
	Scan(ctx context.Context, r *limits.Rule, resolve func(id string) *limits.Rule, visit func(id string, u limits.Usage)) error
	Settle(ctx context.Context, hold string, hits []limits.Hit, n int64) ([]string, error)
	Refresh(ctx context.Context, hold string, hits []limits.Hit) ([]string, error)
	Grow(ctx context.Context, hold string, h limits.Hit, want int64) (int64, error)
}

// by says what a limit counts.
type by uint8

const (
	byProject by = iota + 1
	byKey
	byOrg
	byIP
)

// byNames are the config's names of what limits count by, indexed by by.
var byNames = [...]string{byProject: "project", byKey: "key", byOrg: "org", byIP: "ip"}

// String is the config's name: "project", "key", "org" or "ip".
func (b by) String() string {
	if int(b) < len(byNames) {
		return byNames[b]
	}
	return ""
}

func parseBy(s string) (by, bool) {
	for b, name := range byNames {
		if name != "" && name == s {
			return by(b), true
		}
	}
	return 0, false
}

// routeLimit is one limit as applied by one route.
type routeLimit struct {
	rule    *limits.Rule
	by      by
	shadow  bool // counted and reported, never denies
	cutoff  bool // ends a streamed answer when the tenant's tokens run out (cutoff.go)
	metrics *metrics.Limit
	refused *refusalCount // this process's count of its refusals (see refusals.go)
}

// limitSet is what one route applies for one plan, with its RateLimit-Policy value.
type limitSet struct {
	limits      []routeLimit
	policyValue []string // the RateLimit-Policy header value, shared read-only by requests
	// spanAttrs are the ratelimit span's attributes (tracing on), the same for every request
	// of the set: made once when the config is compiled (see limitSpanAttrs).
	spanAttrs []attribute.KeyValue
}

// retryAfterOne is the Retry-After of a 503, shared read-only by requests.
var retryAfterOne = []string{"1"}

// builtinRouteLimits are the platform's limits for its operations; both assistant versions
// apply the same ones (counters belong to the limit, so they share one quota).
var builtinRouteLimits = map[string][]string{
	"agent_job":            {"agent_job_per_project"},
	"assistant_message":    {"assistant_per_key", "assistant_per_org", "assistant_per_ip"},
	"assistant_message_v2": {"assistant_per_key", "assistant_per_org", "assistant_per_ip"},
}

// compiledLimit is a limit with its rule, for one plan.
type compiledLimit struct {
	rule   *limits.Rule
	by     by
	shadow bool
	cutoff bool
}

// compileLimits builds each route's limit sets, one per plan plus the default. A plan's rule
// keeps the limit's name, so its counters are the same keys: only the allowance differs, for
// the tenants on that plan. It returns every enabled limit by plan ("" for the defaults), for
// usage read-back.
//
// notify, when set, is the notifications the gateway started with (a change needs a restart):
// a limit marks thresholds, its first refusal and its forecast only where some endpoint takes
// those events (crossings.go).
func compileLimits(cfg *config.Config, routes []*route, refusals *refusalCounts, notify *config.Notifications) (map[string][]routeLimit, error) {
	plans := []string{""}
	for p := range cfg.Plans {
		plans = append(plans, p)
	}
	slices.Sort(plans[1:])
	byPlan := map[string]map[string]compiledLimit{}
	all := map[string][]routeLimit{}
	for _, plan := range plans {
		set := map[string]compiledLimit{}
		for _, s := range cfg.PlanLimits(plan) {
			var w limits.Window
			if s.Unit != "streams" { // a streams limit has no window
				var err error
				if w, err = limits.ParseWindow(s.Window); err != nil {
					return nil, fmt.Errorf("limits.%s.window: %w", s.Name, err)
				}
			}
			a, err := limits.ParseAlgorithm(s.Algorithm)
			if err != nil {
				return nil, fmt.Errorf("limits.%s.algorithm: %w", s.Name, err)
			}
			b, ok := parseBy(s.By)
			if !ok {
				return nil, fmt.Errorf("limits.%s.by: %q is not project, key, org or ip", s.Name, s.By)
			}
			u, err := limits.ParseUnit(s.Unit)
			if err != nil {
				return nil, fmt.Errorf("limits.%s.unit: %w", s.Name, err)
			}
			c := compiledLimit{rule: &limits.Rule{Name: s.Name, Limit: s.Limit, Window: w, Algorithm: a, Unit: u, Shadow: s.Shadow, History: s.HistoryOf(w)}, by: b, shadow: s.Shadow, cutoff: s.Cutoff}
			set[s.Name] = c
			c.rule.Reserve, c.rule.ReserveTTL = s.Reserve, s.ReserveTTL // holds (tokens with a reserve, streams)
			c.rule.EstimateMax = s.EstimateMax
			if notify != nil {
				// What the limit sends (its events: a visitor's, by ip, only what it sets) and
				// some endpoint takes.
				if s.Sends(config.EventThresholdCrossed) && notify.Wants(config.EventThresholdCrossed, s.Name) {
					th, err := limits.NewThresholds(s.Thresholds...)
					if err != nil {
						return nil, fmt.Errorf("limits.%s.thresholds: %w", s.Name, err)
					}
					c.rule.Thresholds = th
				}
				c.rule.Exhausted = !s.Shadow && s.Sends(config.EventExhausted) && notify.Wants(config.EventExhausted, s.Name)
				c.rule.Forecast = s.Sends(config.EventForecast) && notify.Wants(config.EventForecast, s.Name)
			}
			if s.Limit > 0 {
				all[plan] = append(all[plan], routeLimit{rule: c.rule, by: b, shadow: c.shadow})
			}
		}
		byPlan[plan] = set
	}
	// Each limit's refusals are counted in the window the usage page lists it with: its
	// default limits', else the first plan's that enables it.
	refused := map[string]*refusalCount{}
	for _, plan := range plans {
		for name, c := range byPlan[plan] {
			if _, ok := refused[name]; !ok && c.rule.Limit > 0 {
				refused[name] = refusals.of(name, c.rule.Window)
			}
		}
	}
	lists := map[string][]string{}
	for name, l := range builtinRouteLimits {
		lists[name] = l
	}
	for _, e := range cfg.Routes {
		if e.Limits != nil {
			lists[e.Name] = *e.Limits
		}
	}
	var problems []config.Problem
	for _, rt := range routes {
		rt.sets = map[string]*limitSet{}
		for _, plan := range plans {
			set := &limitSet{}
			for _, name := range lists[rt.name] {
				c, ok := byPlan[plan][name]
				if !ok {
					if plan == "" {
						problems = append(problems, config.Problem{Key: "routes", Msg: fmt.Sprintf("%s applies %q, which is not a defined limit", rt.name, name)})
					}
					continue
				}
				if need := pathParam(c.by); need != "" && !strings.Contains(rt.path, "{"+need+"}") {
					if plan == "" {
						problems = append(problems, config.Problem{Key: "routes", Msg: fmt.Sprintf(
							"%s applies %s, which counts by %s, but its path has no {%s}", rt.name, name, c.by, need)})
					}
					continue
				}
				if c.by == byOrg && rt.key != auth.Assistant {
					if plan == "" {
						problems = append(problems, config.Problem{Key: "routes", Msg: fmt.Sprintf(
							"%s applies %s, which counts by org, but only assistant routes know their org", rt.name, name)})
					}
					continue
				}
				if c.rule.Limit <= 0 {
					continue // disabled: never asked for, never in headers
				}
				set.limits = append(set.limits, routeLimit{rule: c.rule, by: c.by, shadow: c.shadow, cutoff: c.cutoff, metrics: rt.metrics.Limit(name, c.rule.Unit == limits.Tokens), refused: refused[name]})
			}
			set.policyValue = []string{policyHeader(set.limits)}
			rt.sets[plan] = set
		}
	}
	if len(problems) > 0 {
		return nil, &config.Error{Problems: problems}
	}
	return all, nil
}

func pathParam(b by) string {
	switch b {
	case byProject:
		return "projectId"
	case byOrg:
		return "domain"
	}
	return ""
}

// policyHeader is a RateLimit-Policy value; it only changes with the config.
func policyHeader(ls []routeLimit) string {
	parts := make([]string, len(ls))
	for i, l := range ls {
		parts[i] = policyItem(l.rule, l.rule.Limit)
	}
	return strings.Join(parts, ", ")
}

func policyItem(r *limits.Rule, quota int64) string {
	if r.Unit == limits.Streams { // answers in flight, in no window
		return fmt.Sprintf("%q;q=%d", r.Name, quota)
	}
	return fmt.Sprintf("%q;q=%d;w=%d", r.Name, quota, int64(r.Window.Nominal()/time.Second))
}

// policyFor is the RateLimit-Policy value of a decision: the config's, shared, unless a
// tenant's run-time quota (an override, grants) changed an allowance, which the header then
// shows.
func (set *limitSet) policyFor(dec *limits.Decision) []string {
	for i := range dec.Results {
		if dec.Results[i].Limit != set.limits[i].rule.Limit {
			parts := make([]string, len(dec.Results))
			for j := range dec.Results {
				parts[j] = policyItem(set.limits[j].rule, dec.Results[j].Limit)
			}
			return []string{strings.Join(parts, ", ")}
		}
	}
	return set.policyValue
}

// limitState is the per-request scratch space of a decision, pooled so that a limited request
// allocates no slices.
type limitState struct {
	hits []limits.Hit
	dec  limits.Decision
	buf  []byte
}

// limit applies the route's limits for the request's plan, in three steps: decide (one
// decision for all of them, one store call), account (metrics, the access log's fields and
// what a refund gives back) and answer (the rate-limit headers, and the 429 or 503 when the
// request must not be forwarded, in which case it returns false).
//
// A shadow limit never denies: the store admits the request when the enforced limits have
// room and charges it to every shadow limit that still has room too.
func (g *Gateway) limit(s *scope, r *http.Request) bool {
	if s.route.hasDomain {
		s.orgMetrics = s.snap.orgMetric(s.org)
	}
	set := s.route.sets[s.plan]
	if set == nil {
		set = s.route.sets[""]
	}
	if len(set.limits) == 0 {
		s.countOrg(orgAllowed)
		return true
	}
	s.limited = true
	st := g.limitStates.Get().(*limitState)
	defer g.limitStates.Put(st)
	dec, err := g.decide(s, r, set, st)
	s.account(set, st.hits, dec, err)
	if err == nil && dec.Allowed {
		g.keepCutoffs(s, set)
	}
	if err == nil && g.crossings != nil {
		g.reportCrossings(s, set, st.hits, dec)
	}
	return g.answer(s, set, st, dec, err)
}

// decide asks the store about every limit of set at once: the request's hits (what each
// limit counts for it) go into st, the decision comes back in st.dec. The tokens limits among
// them are kept on the scope, to be debited with the answer's tokens (see countTokens).
func (g *Gateway) decide(s *scope, r *http.Request, set *limitSet, st *limitState) (*limits.Decision, error) {
	st.hits = st.hits[:0]
	if s.tokenHits == nil {
		s.tokenHits = s.tokenHitsBuf[:0]
	}
	tokens := false
	for _, l := range set.limits {
		st.hits = append(st.hits, limits.Hit{Rule: l.rule, ID: s.limitID(l.by, r)})
		tokens = tokens || l.rule.Unit == limits.Tokens
	}
	dec, err := g.take(set, st.hits, &st.dec, r)
	if tokens {
		for i, h := range st.hits {
			if h.Rule.Unit != limits.Tokens {
				continue
			}
			// The allowance the charge of the answer's tokens measures thresholds against.
			if err == nil && i < len(dec.Results) {
				st.hits[i].Allow = dec.Results[i].Limit
			}
			s.tokenHits = append(s.tokenHits, st.hits[i])
		}
	}
	return dec, err
}

// account records a decision: the metrics of each limit and of the org, what the access log
// says (shadow_denied, limiter_error) and, when admitted, the units taken (for a refund).
func (s *scope) account(set *limitSet, hits []limits.Hit, dec *limits.Decision, err error) {
	if err != nil {
		for _, l := range set.limits {
			l.metrics.Error.Inc()
		}
		s.limitErr = true
		s.countOrg(orgError)
		return
	}
	for i, l := range set.limits {
		res := &dec.Results[i]
		near := nearLimit(res)
		// A tenant at 90% of a tokens budget or past it, whether this request is admitted,
		// denied, or only shadow-denied: what the token alert watches.
		if near && l.metrics.TokensNear != nil {
			l.metrics.TokensNear.Inc()
		}
		switch {
		case dec.Allowed && res.Allowed:
			l.metrics.Allowed.Inc()
			if near {
				l.metrics.NearLimit.Inc()
			}
		case dec.Allowed: // a shadow limit that would have denied
			l.metrics.ShadowDenied.Inc()
			l.refused.add(true, s.start)
			s.shadowDenied = l.rule.Name
		case !res.Allowed && !l.shadow: // a denied request counts only under its deniers
			l.metrics.Denied.Inc()
			l.refused.add(false, s.start)
		}
	}
	if dec.Allowed {
		s.keepTaken(hits, dec) // every enforced limit, and the shadow limits that had room
		s.keepHeld(hits, dec)
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
// (or the 503 of a failed limiter, unless redis.on_error lets the request through). It
// returns whether the request goes on to the upstream.
func (g *Gateway) answer(s *scope, set *limitSet, st *limitState, dec *limits.Decision, err error) bool {
	if err != nil {
		if g.allowOnLimiterError {
			return true
		}
		s.w.Header()[hdrRetryAfter] = retryAfterOne
		s.fail(http.StatusServiceUnavailable, errorBody{
			Error: "Rate limiting is temporarily unavailable. Please retry in a moment.",
			Code:  codeLimiterUnavailable,
		})
		return false
	}
	h := s.w.Header()
	h[hdrPolicy] = set.policyFor(dec)
	st.buf = s.rateLimitHeaders(h, st.buf[:0], dec, set.limits)
	if dec.Allowed {
		return true
	}
	denied := &dec.Results[enforcedDenial(set.limits, dec)]
	retry := seconds(untilAdmitted(denied))
	s.deniedBy = denied.Rule.Name
	h.Set(hdrRetryAfter, strconv.FormatInt(retry, 10))
	s.fail(http.StatusTooManyRequests, errorBody{
		Error:      fmt.Sprintf("Rate limit exceeded (%s). Please retry in %s.", denied.Rule.Name, humanSeconds(retry)),
		Code:       codeRateLimited,
		Limit:      denied.Rule.Name,
		RetryAfter: &retry,
	})
	return false
}

// take runs one limiter decision and records its duration.
func (g *Gateway) take(set *limitSet, hits []limits.Hit, d *limits.Decision, r *http.Request) (*limits.Decision, error) {
	ctx := r.Context()
	var span trace.Span
	if g.tracing != nil {
		ctx, span = g.childSpan(ctx, "ratelimit", set.spanAttrs...)
	}
	start := time.Now()
	err := g.limiter.Take(ctx, hits, d)
	kind := limits.Classify(err)
	g.metrics.LimiterCall(time.Since(start).Seconds(), string(kind))
	if kind == limits.KindData {
		g.dataErrors.log(g.log, err)
	}
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
	return d, err
}

// limitSpanAttrs are the ratelimit span's attributes of set: the store and the limits
// decided, never a key, an id or the script.
func limitSpanAttrs(set *limitSet, store string) []attribute.KeyValue {
	names := make([]string, len(set.limits))
	for i, l := range set.limits {
		names[i] = l.rule.Name
	}
	attrs := []attribute.KeyValue{attribute.StringSlice("gateway.ratelimit.limits", names)}
	if store != "" {
		attrs = append(attrs, attribute.String("db.system.name", store))
	}
	return attrs
}

// enforcedDenial is the index of the first enforced limit that denied.
func enforcedDenial(ls []routeLimit, d *limits.Decision) int {
	for i, l := range ls {
		if !d.Results[i].Allowed && !l.shadow {
			return i
		}
	}
	return d.Denied()
}

// rateLimitHeaders writes both header generations clients parse today: the IETF draft's
// RateLimit (every limit: remaining and seconds to reset) and the older RateLimit-Limit,
// -Remaining and -Reset for the enforced limit with the least remaining (a shadow limit
// never denies, so a client must not back off for it). All values are cut from one string,
// so the four headers cost one allocation.
func (s *scope) rateLimitHeaders(h http.Header, buf []byte, d *limits.Decision, ls []routeLimit) []byte {
	least := -1
	for i := range d.Results {
		res := &d.Results[i]
		if i > 0 {
			buf = append(buf, ", "...)
		}
		buf = append(buf, '"')
		buf = append(buf, res.Rule.Name...)
		buf = append(buf, `";r=`...)
		buf = strconv.AppendInt(buf, res.Remaining, 10)
		buf = append(buf, ";t="...)
		buf = strconv.AppendInt(buf, resetSeconds(res), 10)
		if !ls[i].shadow && (least < 0 || res.Remaining < d.Results[least].Remaining) {
			least = i
		}
	}
	ends := [4]int{len(buf)}
	if least < 0 { // only shadow limits: the draft header alone
		s.header(h, slotRateLimit, hdrRateLimit, string(buf))
		return buf
	}
	res := &d.Results[least]
	buf = strconv.AppendInt(buf, res.Limit, 10) // the allowance: the tenant's override and grants included
	ends[1] = len(buf)
	buf = strconv.AppendInt(buf, res.Remaining, 10)
	ends[2] = len(buf)
	// The legacy header keeps its meaning: when the limit is whole again (a GCRA bucket
	// full), not when it admits the next request (that is Retry-After).
	buf = strconv.AppendInt(buf, seconds(res.Reset), 10)
	ends[3] = len(buf)
	all := string(buf)
	s.header(h, slotRateLimit, hdrRateLimit, all[:ends[0]])
	s.header(h, slotLimit, hdrLimit, all[ends[0]:ends[1]])
	s.header(h, slotRemaining, hdrRemaining, all[ends[1]:ends[2]])
	s.header(h, slotReset, hdrReset, all[ends[2]:ends[3]])
	return buf
}

// resetSeconds is a limit's t: when it admits again if it denied, else when it resets.
func resetSeconds(res *limits.Result) int64 {
	if !res.Allowed {
		return seconds(untilAdmitted(res))
	}
	return seconds(res.Reset)
}

// untilAdmitted is how long a denying limit takes to admit a request again, as the store
// said: the end of the window for a fixed window, the next emission for GCRA (which refills
// one unit at a time, long before the bucket is full again), and no later than the end of
// the tenant's override (an override of 0 admits nothing before it).
func untilAdmitted(res *limits.Result) time.Duration {
	if res.Rule.Algorithm == limits.GCRA || res.RetryAfter > 0 {
		return res.RetryAfter
	}
	return res.Reset
}

// seconds rounds up, so a client waiting that long is never early.
func seconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
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

// limitID is what a limit counts for this request. Path values are client-chosen, so odd or
// long ones are replaced by a digest: they become part of Redis key names.
func (s *scope) limitID(b by, r *http.Request) string {
	switch b {
	case byProject:
		return safeID(r.PathValue("projectId"))
	case byKey:
		return s.digest
	case byOrg:
		return s.org
	case byIP:
		return s.snap.ipID(s)
	}
	return ""
}

// ipID is the per-IP limit's id for the request's client.
func (sn *snapshot) ipID(s *scope) string {
	if s.clientIP.Is4() {
		return s.clientIPString() // shared with the access log
	}
	return sn.addrID(s.clientIP)
}

// addrID groups IPv6 clients by prefix (one host usually holds a whole /64).
func (sn *snapshot) addrID(a netip.Addr) string {
	switch {
	case !a.IsValid():
		return "unknown"
	case a.Is4():
		return a.String()
	}
	p, err := a.WithZone("").Prefix(sn.ipv6Bits)
	if err != nil {
		return a.String()
	}
	return p.String()
}

func safeID(v string) string {
	if len(v) > 0 && len(v) <= 128 {
		ok := true
		for i := 0; i < len(v); i++ {
			c := v[i]
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.' || c == '~' || c == '@') {
				ok = false
				break
			}
		}
		if ok {
			return v
		}
	}
	sum := sha256.Sum256([]byte(v))
	return "sha256-" + hex.EncodeToString(sum[:16])
}
