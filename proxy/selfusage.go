package proxy

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/docsgate/gateway/apierror"
	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/engine"
	"github.com/docsgate/gateway/limits"
	"github.com/docsgate/gateway/metrics"
	"github.com/docsgate/gateway/policy"
)

// The tenants' own usage endpoint (self_usage.path, GET /gateway/usage by default): a key
// holder names a route and its path parameters, and learns every limit a request of theirs to
// that route would be subject to, how much of each is used and left, and a forecast. It takes
// the routes' own steps, so it answers only what the request would be allowed to see:
//
//   - the key is checked as the route checks it (family, registry, revocation, grants), and a
//     failed authentication counts against auth.failure_limit as there;
//   - the tenant (org, plan) and each limit's id come from the same code as a request's
//     decision (authenticate, scope.limitID): the caller's key, the org of the named domain,
//     the named project where the key may act on it, the caller's own address;
//   - shadow limits are left out: they never refuse, and their counters are the operators';
//   - in prefix mode, where any invented key of the right family passes, only the limits by
//     ip (the caller's own address) are shown, and those by key, org or project only where
//     self_usage.prefix_mode_exposes opts in: otherwise anyone could read any org's or
//     project's counters, and learn its plan, for the price of a made-up key.
//
// It is counted against no configured limit and reads every counter in one store call (one
// script call on Redis, one per node on a Cluster). Its own bound, per client address and then
// per key, in process (selfusagebound.go), keeps it from being a free amplifier of Redis reads.

// selfUsageRoute names the endpoint in logs and metrics.
const selfUsageRoute = "self_usage"

// Bounds on the query: what a legitimate caller sends is a route name and an id or two.
const (
	maxSelfUsageQuery = 2048
	maxSelfUsageValue = 256
)

// selfUsage is the endpoint as one config compiled it.
type selfUsage struct {
	path       string
	perAddress int
	perKey     int
	// shown is what the answers list the limits counting by: all in registry mode; in prefix
	// mode ip and what self_usage.prefix_mode_exposes names.
	shown   policy.Bys
	route   *route            // the pseudo-route of its requests (logs, metrics)
	byName  map[string]*route // the routes a caller may name
	methods string            // of its preflight
}

// probeOf registers routes in a ServeMux to ask which one a path matches; ok is false when
// ServeMux refuses them (conflicting or invalid patterns).
func probeOf(routes []*route) (probe *http.ServeMux, ok bool) {
	defer func() {
		if recover() != nil {
			probe, ok = nil, false
		}
	}()
	probe = http.NewServeMux()
	nop := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	for _, rt := range routes {
		probe.Handle(rt.Method+" "+rt.Path, nop)
	}
	return probe, true
}

// compileSelfUsage checks that no route matches the endpoint's path and prepares it (its
// series in m; registry: auth.mode registry, where every limit is shown); nil when it is
// disabled.
func compileSelfUsage(cfg *config.Config, routes []*route, m *metrics.Metrics, registry bool) (*selfUsage, error) {
	c := cfg.SelfUsage
	if !c.Enabled {
		return nil, nil
	}
	probe, ok := probeOf(routes)
	if !ok {
		return nil, nil // routes that conflict: buildTable says which, as a config error
	}
	for _, rt := range routes {
		req := &http.Request{Method: rt.Method, URL: &url.URL{Path: c.Path}, Host: "gateway"}
		if _, pattern := probe.Handler(req); pattern == rt.Method+" "+rt.Path {
			return nil, &config.Error{Problems: []config.Problem{{Key: "self_usage.path", Msg: fmt.Sprintf(
				"%s is matched by the route %s (%s %s): choose another path, or change the route", c.Path, rt.Name, rt.Method, rt.Path)}}}
		}
	}
	su := &selfUsage{
		path: c.Path, perAddress: c.PerAddressPerMinute, perKey: c.PerKeyPerMinute, methods: http.MethodGet,
		shown:  shownInPrefixMode(c.PrefixModeExposes),
		route:  &route{Route: &policy.Route{Name: selfUsageRoute, Method: http.MethodGet, Path: c.Path}, metrics: m.Route(selfUsageRoute), fwdBlocker: answeredHere},
		byName: map[string]*route{},
	}
	if registry {
		su.shown = policy.AllBys
	}
	for _, rt := range routes {
		su.byName[rt.Name] = rt
	}
	return su, nil
}

// shownInPrefixMode is selfUsage.shown in prefix mode: ip, and the exposed (checked by
// config.Validate).
func shownInPrefixMode(exposed []string) policy.Bys {
	shown := policy.Bys(0).With(policy.ByIP)
	for _, name := range exposed {
		if b, ok := policy.ParseBy(name); ok {
			shown = shown.With(b)
		}
	}
	return shown
}

// serveSelfUsage answers GET self_usage.path.
func (g *Gateway) serveSelfUsage(sn *snapshot, su *selfUsage, w http.ResponseWriter, r *http.Request) {
	s, r := g.begin(sn, su.route, w, r)
	defer g.finish(s, r)
	if _, fwd := w.(*doorWriter); fwd && doorRefuses(s, fwd) {
		return
	}
	if r.Method != http.MethodGet { // ServeMux lets HEAD in
		sn.cors.Decorate(s.w.Header(), r)
		methodNotAllowed(s, r.Method, http.MethodGet)
		return
	}
	if upgradeRefused(s, r) {
		return
	}
	rt, field, msg := su.parse(r)
	if rt == nil || rt.cors {
		// Like the assistant routes, whose widgets call this; the admin routes never answer
		// CORS, and neither does this endpoint about them.
		sn.cors.Decorate(s.w.Header(), r)
	}
	if rt == nil {
		s.field = field
		s.fail(http.StatusBadRequest, apierror.Body{Error: msg, Code: apierror.InvalidRequest, Field: field})
		return
	}
	if g.selfUsageAdmitted(s, su, rt, r) {
		g.answerSelfUsage(s, rt, su.shown, r)
	}
}

// selfUsageAdmitted applies the endpoint's bounds and the route's authentication, answering
// the request when it refuses it: the address's bound before anything of the key is looked at
// (invented keys stop there), then the key, then the key's bound.
func (g *Gateway) selfUsageAdmitted(s *scope, su *selfUsage, rt *route, r *http.Request) bool {
	if ok, retry := g.selfUsageBound.Addr(s.snap.failureClient(s), su.perAddress, s.start); !ok {
		selfUsageRefused(s, "self_usage.per_address_per_minute", "from this address", su.perAddress, retry)
		return false
	}
	// The route's own authentication (a key's scopes must name the route asked about), its
	// refusals counted under this endpoint: a copy of the route, never written, with this
	// endpoint's metrics.
	as := *rt
	as.metrics = su.route.metrics
	s.route = &as
	ok := g.keys.authenticate(s, r)
	s.route = su.route
	if !ok {
		return false
	}
	if ok, retry := g.selfUsageBound.Key(s.digest, su.perKey, s.start); !ok {
		selfUsageRefused(s, "self_usage.per_key_per_minute", "for this key", su.perKey, retry)
		return false
	}
	return true
}

// answerSelfUsage answers what a request of s's key and address to rt would be subject to,
// the limits counting by what shown holds.
func (g *Gateway) answerSelfUsage(s *scope, rt *route, shown policy.Bys, r *http.Request) {
	views, err := g.quota.engine.SelfUsage(r.Context(), selfUsageRequest(s, rt, r), shown)
	if err != nil {
		s.limitErr = true
		s.w.Header()[hdrRetryAfter] = retryAfterOne
		s.fail(http.StatusServiceUnavailable, apierror.Body{
			Error: "Usage is temporarily unavailable. Please retry in a moment.",
			Code:  apierror.LimiterUnavailable,
		})
		return
	}
	data, err := json.Marshal(struct {
		Route  string        `json:"route"`
		Limits []limits.View `json:"limits"`
	}{rt.Name, views})
	if err != nil { // cannot happen for these types
		s.fail(http.StatusInternalServerError, apierror.Body{Error: "Internal error.", Code: "internal"})
		return
	}
	apierror.WriteJSON(s.w, http.StatusOK, data)
}

// selfUsageRefused answers 429 for the endpoint's own bound: bound is its config key, which the
// access log names in denied_by, and whose says in the message which one refused ("from this
// address", "for this key").
func selfUsageRefused(s *scope, bound, whose string, limit int, retry int64) {
	s.deniedBy = bound
	s.w.Header().Set(hdrRetryAfter, strconv.FormatInt(retry, 10))
	s.fail(http.StatusTooManyRequests, apierror.Body{
		Error:      fmt.Sprintf("Too many usage requests %s (%d a minute). Please retry in %s.", whose, limit, humanSeconds(retry)),
		Code:       apierror.RateLimited,
		Limit:      selfUsageRoute,
		RetryAfter: &retry,
	})
}

// selfUsageRequest is what a request of s's key and address to rt would be decided as: its
// plan's set of rt's limits, and the ids the request's decision would count.
func selfUsageRequest(s *scope, rt *route, r *http.Request) *engine.Request {
	set := rt.setFor(s.plan)
	req := &engine.Request{Set: set.LimitSet, Digest: s.digest, Org: s.org}
	if rt.Key == auth.Admin {
		req.Project = r.PathValue("projectId")
	}
	if set.Counts(policy.ByIP) {
		req.ClientID = s.snap.ipID(s)
	}
	return req
}

// parse reads the query: route= and the route's path parameters by name, each exactly once,
// and nothing else. The parameters become r's path values, as the route would see them. On a
// refusal it returns a nil route, the offending parameter and the message.
func (su *selfUsage) parse(r *http.Request) (*route, string, string) {
	raw := r.URL.RawQuery
	if len(raw) > maxSelfUsageQuery {
		return nil, "query", fmt.Sprintf("The query is longer than %d bytes.", maxSelfUsageQuery)
	}
	q, err := url.ParseQuery(raw)
	if err != nil {
		return nil, "query", "The query is not a valid URL query (name=value pairs joined by &)."
	}
	names := make([]string, 0, len(q))
	for name := range q {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		if !safeParamName(name) {
			return nil, "query", "The query names a parameter that is no parameter of this endpoint."
		}
		if len(q[name]) != 1 {
			return nil, name, fmt.Sprintf("%s is given %d times: give it once.", name, len(q[name]))
		}
		if why := badValue(q[name][0]); why != "" {
			return nil, name, fmt.Sprintf("%s %s.", name, why)
		}
	}
	name, ok := q["route"]
	if !ok {
		return nil, "route", "route is required: the name of the route to read the limits of, such as route=assistant_message_v2."
	}
	rt := su.byName[name[0]]
	if rt == nil {
		return nil, "route", "route names no route of this gateway."
	}
	params := rt.Params
	for _, n := range names {
		if n != "route" && !slices.Contains(params, n) {
			return nil, n, fmt.Sprintf("%s is no path parameter of %s (its path is %s).", n, rt.Name, rt.Path)
		}
	}
	for _, p := range params {
		v, ok := q[p]
		if !ok {
			return nil, p, fmt.Sprintf("%s is required: %s's path is %s.", p, rt.Name, rt.Path)
		}
		r.SetPathValue(p, v[0])
	}
	return rt, "", ""
}

// safeParamName accepts the names a path pattern can have, so a refusal can name the
// parameter without echoing anything odd.
func safeParamName(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}

// badValue says what is wrong with a query value, or "".
func badValue(v string) string {
	switch {
	case v == "":
		return "is empty"
	case len(v) > maxSelfUsageValue:
		return fmt.Sprintf("is longer than %d bytes", maxSelfUsageValue)
	case !utf8.ValidString(v):
		return "is not UTF-8"
	case strings.ContainsFunc(v, func(c rune) bool { return unicode.IsControl(c) || unicode.Is(unicode.Cf, c) }):
		return "holds control or format characters"
	}
	return ""
}
