package policy

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/validate"
)

// Route is one entry of the route table: the platform's operations (built in) and the
// pass-through routes the config adds, each with the limits it applies per plan.
type Route struct {
	Name   string
	Method string
	Path   string // a ServeMux pattern's path: /v2/agent/{projectId}/job
	// Params are the names of the path's wildcards, in order.
	Params []string
	Key    auth.Kind
	Stream bool // the answers stream: they are read for their tokens, and flushed part by part
	// HasDomain: the path names an assistant {domain}, so requests count per org.
	HasDomain bool
	// Conversation: the body holds an assistant conversation (the built-in assistant routes),
	// bounded by Bounds; the route's version says how to read it (BodyV2).
	Conversation bool
	BodyV2       bool
	Bounds       validate.Bounds
	// Deprecation, when not nil, marks every answer of the route deprecated.
	Deprecation *Deprecation
	// ForwardAuthOnly: only the forward-auth door serves the route (the public listener
	// answers 404 for it).
	ForwardAuthOnly bool
	// CfgKey names the config entry that added the route ("routes[3]"), for errors; "" for a
	// built-in route.
	CfgKey string
	// sets holds the limits applied in one decision, by plan name; "" is the default set.
	sets map[string]*LimitSet
}

// Deprecation is a route's deprecation (RFC 9745), sunset (RFC 8594) and migration guide.
type Deprecation struct {
	Since  time.Time
	Sunset time.Time // zero: none announced
	Link   string
}

// Limits is the set of limits the route applies to a tenant on plan: the plan's, else the
// default set.
func (r *Route) Limits(plan string) *LimitSet {
	if set := r.sets[plan]; set != nil {
		return set
	}
	return r.sets[""]
}

// Sets calls each with every plan's set of the route's limits ("" for the default set).
func (r *Route) Sets(each func(plan string, set *LimitSet)) {
	for plan, set := range r.sets {
		each(plan, set)
	}
}

// builtin is the platform's operations: the spec's two and the v2 assistant route of AI SDK
// 5 and later. Their method, path, key family and body are fixed, and config entries with
// their names may only adjust the rest (limits, deprecation, the assistant routes'
// conversation bounds).
func builtin() []Route {
	bounds := validate.Bounds{Messages: config.DefaultMaxMessages, PartsPerMessage: config.DefaultMaxPartsPerMessage}
	return []Route{
		{Name: "agent_job", Method: "POST", Path: "/v2/agent/{projectId}/job", Key: auth.Admin},
		{Name: "assistant_message", Method: "POST", Path: "/discovery/v1/assistant/{domain}/message",
			Key: auth.Assistant, Stream: true, Conversation: true, Bounds: bounds},
		{Name: "assistant_message_v2", Method: "POST", Path: "/discovery/v2/assistant/{domain}/message",
			Key: auth.Assistant, Stream: true, Conversation: true, BodyV2: true, Bounds: bounds},
	}
}

// problems collects config problems with the keys they concern.
type problems []config.Problem

func (ps *problems) fail(key, format string, args ...any) {
	*ps = append(*ps, config.Problem{Key: key, Msg: fmt.Sprintf(format, args...)})
}

// err is the config error of the problems, nil when there are none.
func (ps problems) err() error {
	if len(ps) == 0 {
		return nil
	}
	return &config.Error{Problems: ps}
}

// compileRoutes merges the built-in routes with the config's entries. Problems are reported
// with the config key they concern.
func compileRoutes(entries []config.Route) ([]*Route, error) {
	routes := builtin()
	nBuiltin := len(routes)
	var ps problems
	for i, e := range entries {
		key := fmt.Sprintf("routes[%d]", i)
		if j := slices.IndexFunc(routes[:nBuiltin], func(r Route) bool { return r.Name == e.Name }); j >= 0 {
			adjustBuiltin(&routes[j], e, key, &ps)
			continue
		}
		if j := slices.IndexFunc(routes[:nBuiltin], func(r Route) bool { return r.Method == e.Method && r.Path == e.Path }); j >= 0 {
			// Before assistant_message_v2 was built in, configs added it as a pass-through
			// route; under its own name such an entry now adjusts the built-in one (above).
			ps.fail(key+".name", "%s %s is the built-in route %s: name the entry %s to adjust it (its limits, deprecation), or remove it",
				e.Method, e.Path, routes[j].Name, routes[j].Name)
			continue
		}
		routes = append(routes, passThrough(e, key, &ps))
	}
	if err := ps.err(); err != nil {
		return nil, err
	}
	out := make([]*Route, len(routes))
	for i := range routes {
		routes[i].HasDomain = strings.Contains(routes[i].Path, "{domain}")
		routes[i].Params = pathParams(routes[i].Path)
		out[i] = &routes[i]
	}
	return out, nil
}

// adjustBuiltin applies entry e (at key) to the built-in route b: what a built-in route is
// cannot change, its deprecation and conversation bounds can.
func adjustBuiltin(b *Route, e config.Route, key string, ps *problems) {
	if e.Method != "" && e.Method != b.Method {
		ps.fail(key+".method", "the built-in route %s is always %s", b.Name, b.Method)
	}
	if e.Path != "" && e.Path != b.Path {
		ps.fail(key+".path", "the built-in route %s is always %s", b.Name, b.Path)
	}
	if k, _ := auth.ParseKind(e.Key); e.Key != "" && k != b.Key {
		ps.fail(key+".key", "the built-in route %s always takes %s keys", b.Name, b.Key)
	}
	if e.Stream != nil && *e.Stream != b.Stream {
		ps.fail(key+".stream", "the built-in route %s is always stream: %t", b.Name, b.Stream)
	}
	b.Deprecation = deprecation(e.Deprecation, key, ps)
	conversationBounds(b, e, key, ps)
	b.ForwardAuthOnly = e.ForwardAuthOnly // refused where the limits are known: its body is checked
}

// passThrough is the route entry e (at key) adds.
func passThrough(e config.Route, key string, ps *problems) Route {
	r := Route{Name: e.Name, Method: e.Method, Path: e.Path, Stream: e.Stream != nil && *e.Stream, CfgKey: key, ForwardAuthOnly: e.ForwardAuthOnly}
	r.Deprecation = deprecation(e.Deprecation, key, ps)
	if e.Method == "" {
		ps.fail(key+".method", "is required")
	}
	if e.Path == "" {
		ps.fail(key+".path", "is required")
	}
	var ok bool
	if r.Key, ok = auth.ParseKind(e.Key); !ok {
		ps.fail(key+".key", "is required: admin or assistant")
	}
	conversationBounds(&r, e, key, ps)
	return r
}

// deprecation reads an entry's deprecation; nil when it has none (or it is wrong: reported).
func deprecation(d *config.Deprecation, key string, ps *problems) *Deprecation {
	if d == nil {
		return nil
	}
	since, err := config.ParseDate(d.Since)
	if err != nil {
		ps.fail(key+".deprecation", "deprecation.since: %v", err)
		return nil
	}
	out := &Deprecation{Since: since, Link: d.Link}
	if d.Sunset != "" {
		if out.Sunset, err = config.ParseDate(d.Sunset); err != nil {
			ps.fail(key+".deprecation", "deprecation.sunset: %v", err)
			return nil
		}
	}
	return out
}

// conversationBounds applies an entry's max_messages and max_parts_per_message to r, which
// only the assistant routes have (the other routes' bodies hold no conversation).
func conversationBounds(r *Route, e config.Route, key string, ps *problems) {
	for _, b := range []struct {
		name string
		set  *int
		dst  *int
	}{{"max_messages", e.MaxMessages, &r.Bounds.Messages}, {"max_parts_per_message", e.MaxPartsPerMessage, &r.Bounds.PartsPerMessage}} {
		switch {
		case b.set == nil:
		case !r.Conversation:
			ps.fail(key+"."+b.name, "applies only to the assistant routes (assistant_message, assistant_message_v2), whose bodies hold a conversation")
		default:
			*b.dst = *b.set
		}
	}
}

// pathParams are the names of a path pattern's wildcards, in order ({name} and {name...}).
func pathParams(path string) []string {
	var names []string
	for {
		i := strings.IndexByte(path, '{')
		if i < 0 {
			return names
		}
		j := strings.IndexByte(path[i:], '}')
		if j < 0 {
			return names
		}
		name := strings.TrimSuffix(path[i+1:i+j], "...")
		if name != "$" && name != "" {
			names = append(names, name)
		}
		path = path[i+j+1:]
	}
}
