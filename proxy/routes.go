package proxy

import (
	"fmt"
	"net/http"
	"slices"
	"strings"

	"go.opentelemetry.io/otel/attribute"

	"github.com/docsgate/gateway/apierror"
	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/limits"
	"github.com/docsgate/gateway/metrics"
	"github.com/docsgate/gateway/policy"
	"github.com/docsgate/gateway/validate"
)

// route is one entry of the policy's route table as the HTTP pipeline serves it: its body's
// rules, its metrics, its limit sets' series, its headers.
type route struct {
	*policy.Route
	cors bool // assistant routes: keys are public, browsers call them
	// validate checks a body and returns the length of its conversation text, what a
	// prompt's tokens are estimated from; nil: the body is forwarded unchecked (size cap
	// only), and its whole length counts as text.
	validate func([]byte) (text int, err error)
	// bodyCode is the error code of a refused body: invalid_request on the routes that had
	// it before invalid_body existed (agent_job, assistant_message: their clients rely on
	// it; a case-folded field is invalid_body there too), invalid_body on the others.
	bodyCode string
	metrics  *metrics.Route
	// sets holds the limits applied in one decision after the body is validated, by plan
	// name; "" is the default set.
	sets map[string]*routeSet
	// deprecation holds Deprecation, Sunset and Link headers for every response; nil when
	// the route is not deprecated.
	deprecation http.Header
	// span is spanName's, made once when tracing is on ("" elsewhere).
	span string
	// fwdBlocker says why the forward-auth door cannot decide the route ("": it can).
	fwdBlocker string
}

// routeSet is one plan's limits of a route (policy.LimitSet) with each limit's series of the
// route, and the ratelimit span's attributes.
type routeSet struct {
	*policy.LimitSet
	metrics []*metrics.Limit // in the set's order
	// spanAttrs are the ratelimit span's attributes (tracing on), the same for every request
	// of the set: made once when the config is compiled (see limitSpanAttrs).
	spanAttrs []attribute.KeyValue
}

// setFor is the route's limits for a tenant on plan: the plan's, else the default set.
func (rt *route) setFor(plan string) *routeSet {
	if set := rt.sets[plan]; set != nil {
		return set
	}
	return rt.sets[""]
}

// pseudoRoute is a route that names requests no route takes, for logs and metrics.
func pseudoRoute(name string, m *metrics.Metrics) *route {
	return &route{Route: &policy.Route{Name: name}, metrics: m.Route(name)}
}

// agentJob validates an agent job; its answer is no stream, so no tokens are estimated.
func agentJob(body []byte) (int, error) { return 0, validate.AgentJob(body) }

// Pseudo-routes name requests that match no route, for logs and metrics.
const (
	unmatchedRoute = "unmatched"
	preflightRoute = "cors_preflight"
)

// newRoute serves the policy's route pr: its body's rules (a built-in route's: the agent job's
// fields, an assistant conversation within its bounds), its series in m.
func newRoute(pr *policy.Route, m *metrics.Metrics) *route {
	rt := &route{Route: pr, cors: pr.Key == auth.Assistant, metrics: m.Route(pr.Name), bodyCode: apierror.InvalidBody}
	switch {
	case pr.Name == "agent_job":
		rt.validate, rt.bodyCode = agentJob, apierror.InvalidRequest
	case pr.Conversation && pr.BodyV2:
		bounds := pr.Bounds
		rt.validate = func(body []byte) (int, error) { return bounds.AssistantMessageV2Text(body) }
	case pr.Conversation:
		bounds := pr.Bounds
		rt.validate, rt.bodyCode = func(body []byte) (int, error) { return bounds.AssistantMessageText(body) }, apierror.InvalidRequest
	}
	rt.deprecation = deprecationHeaders(pr.Deprecation)
	rt.fwdBlocker = pr.ForwardAuthBlocker()
	rt.sets = map[string]*routeSet{}
	pr.Sets(func(plan string, set *policy.LimitSet) {
		rs := &routeSet{LimitSet: set, metrics: make([]*metrics.Limit, len(set.Limits))}
		for i, l := range set.Limits {
			rs.metrics[i] = rt.metrics.Limit(l.Rule.Name, l.Rule.Unit == limits.Tokens)
		}
		rt.sets[plan] = rs
	})
	return rt
}

// deprecationHeaders renders a route's Deprecation (RFC 9745), Sunset (RFC 8594) and Link
// headers once.
func deprecationHeaders(d *policy.Deprecation) http.Header {
	if d == nil {
		return nil
	}
	h := http.Header{}
	h.Set("Deprecation", fmt.Sprintf("@%d", d.Since.Unix()))
	if !d.Sunset.IsZero() {
		h.Set("Sunset", d.Sunset.UTC().Format(http.TimeFormat))
	}
	if d.Link != "" {
		h.Set("Link", "<"+d.Link+`>; rel="deprecation"`)
	}
	return h
}

// table is the compiled route table: a ServeMux for matching, and a twin without the
// catch-all to tell 404 from 405 for requests that match nothing.
type table struct {
	mux   *http.ServeMux
	probe *http.ServeMux
}

// buildTable registers every route, the CORS preflights of assistant paths and the catch-all.
// ServeMux panics on invalid or conflicting patterns; that is turned into a config error.
func (g *Gateway) buildTable(sn *snapshot, routes []*route) (t *table, err error) {
	t = &table{mux: http.NewServeMux(), probe: http.NewServeMux()}
	current := ""
	defer func() {
		if p := recover(); p != nil {
			// ServeMux's message spans lines and names source files; its last line says
			// what conflicts with what.
			msg := fmt.Sprint(p)
			if i := strings.LastIndexByte(msg, '\n'); i >= 0 {
				msg = msg[i+1:]
			}
			t, err = nil, &config.Error{Problems: []config.Problem{{Key: current, Msg: msg}}}
		}
	}()
	nop := http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})
	preflights := map[string][]string{} // path -> methods of assistant routes
	var paths []string
	for _, rt := range routes {
		current = "routes (" + rt.Name + ")"
		if rt.CfgKey != "" {
			current = rt.CfgKey + ".path"
		}
		pattern := rt.Method + " " + rt.Path
		t.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) { g.serve(sn, rt, w, r) })
		t.probe.Handle(pattern, nop)
		if rt.cors {
			if _, ok := preflights[rt.Path]; !ok {
				paths = append(paths, rt.Path)
			}
			preflights[rt.Path] = append(preflights[rt.Path], rt.Method)
		}
	}
	pre := pseudoRoute(preflightRoute, g.metrics)
	pre.fwdBlocker = answeredHere
	for _, p := range paths {
		current = "routes (OPTIONS " + p + ")"
		methods := strings.Join(preflights[p], ", ")
		t.mux.HandleFunc("OPTIONS "+p, func(w http.ResponseWriter, r *http.Request) { g.servePreflight(sn, pre, methods, w, r) })
		t.probe.Handle("OPTIONS "+p, nop)
	}
	if su := sn.selfUsage; su != nil {
		current = "self_usage.path"
		t.mux.HandleFunc("GET "+su.path, func(w http.ResponseWriter, r *http.Request) { g.serveSelfUsage(sn, su, w, r) })
		t.mux.HandleFunc("OPTIONS "+su.path, func(w http.ResponseWriter, r *http.Request) { g.servePreflight(sn, pre, su.methods, w, r) })
		t.probe.Handle("GET "+su.path, nop)
		t.probe.Handle("OPTIONS "+su.path, nop)
	}
	t.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { g.serveUnmatched(sn, t, w, r) })
	return t, nil
}

// allowed reports the Allow header of a path that exists with other methods, or "" for a path
// no route has. It runs the probe mux's own 405 logic against a header-only writer, so the
// answer always agrees with how requests are matched.
func (t *table) allowed(r *http.Request) string {
	h, pattern := t.probe.Handler(r)
	if pattern != "" {
		return ""
	}
	hw := headerOnly{h: http.Header{}}
	h.ServeHTTP(&hw, r)
	if hw.code != http.StatusMethodNotAllowed {
		return ""
	}
	// ServeMux adds HEAD for GET patterns; the gateway forwards only the configured method.
	methods := strings.Split(hw.h.Get("Allow"), ", ")
	methods = slices.DeleteFunc(methods, func(m string) bool { return m == http.MethodHead })
	return strings.Join(methods, ", ")
}

type headerOnly struct {
	h    http.Header
	code int
}

func (w *headerOnly) Header() http.Header         { return w.h }
func (w *headerOnly) Write(p []byte) (int, error) { return len(p), nil }
func (w *headerOnly) WriteHeader(code int)        { w.code = code }

// canonicalPath rejects paths that ServeMux would redirect (dot segments, empty segments):
// an API gateway answers 404 rather than guessing what the client meant.
func canonicalPath(p string) bool {
	if p == "" || p[0] != '/' {
		return false
	}
	return !strings.Contains(p, "//") && !strings.Contains(p, "/./") && !strings.Contains(p, "/../") &&
		!strings.HasSuffix(p, "/.") && !strings.HasSuffix(p, "/..")
}

// spanName is the route's server span name: method and path template, never the raw path.
func (rt *route) spanName() string {
	if rt.span != "" {
		return rt.span
	}
	if rt.Method == "" {
		return rt.Name // the pseudo-route of unmatched requests
	}
	return rt.Method + " " + rt.Path
}
