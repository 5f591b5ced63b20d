package proxy

import (
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/metrics"
	"github.com/docsgate/gateway/validate"
)

// route is one compiled entry of the route table.
type route struct {
	name   string
	method string
	path   string
	key    auth.Kind
	stream bool
	cors   bool // assistant routes: keys are public, browsers call them
	// validate checks a body and returns the length of its conversation text, what a
	// prompt's tokens are estimated from; nil: the body is forwarded unchecked (size cap
	// only), and its whole length counts as text.
	validate func([]byte) (text int, err error)
	// conversation is the validator of an assistant route, which bounds caps (its entry's
	// max_messages and max_parts_per_message); compileRoutes makes validate of them.
	conversation func(validate.Bounds, []byte) (int, error)
	bounds       validate.Bounds
	// bodyCode is the error code of a refused body: invalid_request on the routes that had
	// it before invalid_body existed (agent_job, assistant_message: their clients rely on
	// it; a case-folded field is invalid_body there too), invalid_body on the others.
	bodyCode string
	metrics  *metrics.Route
	// sets holds the limits applied in one decision after the body is validated, by plan
	// name; "" is the default set.
	sets map[string]*limitSet
	// hasDomain: the path names an assistant {domain}, so requests count per org.
	hasDomain bool
	// deprecation holds Deprecation, Sunset and Link headers for every response; nil when
	// the route is not deprecated.
	deprecation http.Header
	// cfgKey names the config entry that added the route ("routes[3]"), for errors.
	cfgKey string
	// span is spanName's, made once when tracing is on ("" elsewhere).
	span string
}

// builtin is the platform's operations: the spec's two and the v2 assistant route of AI SDK
// 5 and later. Their method, path, key family and validators are fixed, and config entries
// with their names may only adjust the rest (limits, deprecation, the assistant routes'
// conversation bounds).
func builtin() []route {
	bounds := validate.Bounds{Messages: config.DefaultMaxMessages, PartsPerMessage: config.DefaultMaxPartsPerMessage}
	return []route{
		{name: "agent_job", method: http.MethodPost, path: "/v2/agent/{projectId}/job",
			key: auth.Admin, validate: agentJob, bodyCode: codeInvalidRequest},
		{name: "assistant_message", method: http.MethodPost, path: "/discovery/v1/assistant/{domain}/message",
			key: auth.Assistant, stream: true, conversation: validate.Bounds.AssistantMessageText, bounds: bounds, bodyCode: codeInvalidRequest},
		{name: "assistant_message_v2", method: http.MethodPost, path: "/discovery/v2/assistant/{domain}/message",
			key: auth.Assistant, stream: true, conversation: validate.Bounds.AssistantMessageV2Text, bounds: bounds, bodyCode: codeInvalidBody},
	}
}

// agentJob validates an agent job; its answer is no stream, so no tokens are estimated.
func agentJob(body []byte) (int, error) { return 0, validate.AgentJob(body) }

// Pseudo-routes name requests that match no route, for logs and metrics.
const (
	unmatchedRoute = "unmatched"
	preflightRoute = "cors_preflight"
)

// compileRoutes merges the built-in routes with the config's entries. Problems are reported
// with the config key they concern.
func compileRoutes(entries []config.Route) ([]*route, error) {
	routes := builtin()
	nBuiltin := len(routes)
	var problems []config.Problem
	fail := func(key, format string, args ...any) {
		problems = append(problems, config.Problem{Key: key, Msg: fmt.Sprintf(format, args...)})
	}
	for i, e := range entries {
		key := fmt.Sprintf("routes[%d]", i)
		if j := slices.IndexFunc(routes[:nBuiltin], func(r route) bool { return r.name == e.Name }); j >= 0 {
			b := &routes[j]
			if e.Method != "" && e.Method != b.method {
				fail(key+".method", "the built-in route %s is always %s", b.name, b.method)
			}
			if e.Path != "" && e.Path != b.path {
				fail(key+".path", "the built-in route %s is always %s", b.name, b.path)
			}
			if k, _ := auth.ParseKind(e.Key); e.Key != "" && k != b.key {
				fail(key+".key", "the built-in route %s always takes %s keys", b.name, b.key)
			}
			if e.Stream != nil && *e.Stream != b.stream {
				fail(key+".stream", "the built-in route %s is always stream: %t", b.name, b.stream)
			}
			var err error
			if b.deprecation, err = deprecationHeaders(e.Deprecation); err != nil {
				fail(key+".deprecation", "%v", err)
			}
			conversationBounds(b, e, key, fail)
			continue
		}
		if j := slices.IndexFunc(routes[:nBuiltin], func(r route) bool { return r.method == e.Method && r.path == e.Path }); j >= 0 {
			// Before assistant_message_v2 was built in, configs added it as a pass-through
			// route; under its own name such an entry now adjusts the built-in one (above).
			fail(key+".name", "%s %s is the built-in route %s: name the entry %s to adjust it (its limits, deprecation), or remove it",
				e.Method, e.Path, routes[j].name, routes[j].name)
			continue
		}
		r := route{name: e.Name, method: e.Method, path: e.Path, stream: e.Stream != nil && *e.Stream, cfgKey: key}
		var err error
		if r.deprecation, err = deprecationHeaders(e.Deprecation); err != nil {
			fail(key+".deprecation", "%v", err)
		}
		if e.Method == "" {
			fail(key+".method", "is required")
		}
		if e.Path == "" {
			fail(key+".path", "is required")
		}
		var ok bool
		if r.key, ok = auth.ParseKind(e.Key); !ok {
			fail(key+".key", "is required: admin or assistant")
		}
		conversationBounds(&r, e, key, fail)
		routes = append(routes, r)
	}
	if len(problems) > 0 {
		return nil, &config.Error{Problems: problems}
	}
	out := make([]*route, len(routes))
	for i := range routes {
		routes[i].cors = routes[i].key == auth.Assistant
		routes[i].hasDomain = strings.Contains(routes[i].path, "{domain}")
		if conv := routes[i].conversation; conv != nil {
			bounds := routes[i].bounds
			routes[i].validate = func(body []byte) (int, error) { return conv(bounds, body) }
		}
		out[i] = &routes[i]
	}
	return out, nil
}

// conversationBounds applies an entry's max_messages and max_parts_per_message to r, which
// only the assistant routes have (the other routes' bodies hold no conversation).
func conversationBounds(r *route, e config.Route, key string, fail func(key, format string, args ...any)) {
	for _, b := range []struct {
		name string
		set  *int
		dst  *int
	}{{"max_messages", e.MaxMessages, &r.bounds.Messages}, {"max_parts_per_message", e.MaxPartsPerMessage, &r.bounds.PartsPerMessage}} {
		switch {
		case b.set == nil:
		case r.conversation == nil:
			fail(key+"."+b.name, "applies only to the assistant routes (assistant_message, assistant_message_v2), whose bodies hold a conversation")
		default:
			*b.dst = *b.set
		}
	}
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
		current = "routes (" + rt.name + ")"
		if rt.cfgKey != "" {
			current = rt.cfgKey + ".path"
		}
		pattern := rt.method + " " + rt.path
		t.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) { g.serve(sn, rt, w, r) })
		t.probe.Handle(pattern, nop)
		if rt.cors {
			if _, ok := preflights[rt.path]; !ok {
				paths = append(paths, rt.path)
			}
			preflights[rt.path] = append(preflights[rt.path], rt.method)
		}
	}
	pre := &route{name: preflightRoute, metrics: g.metrics.Route(preflightRoute)}
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
	if rt.method == "" {
		return rt.name // the pseudo-route of unmatched requests
	}
	return rt.method + " " + rt.path
}
