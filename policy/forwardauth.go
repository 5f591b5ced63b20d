package policy

import (
	"fmt"
	"maps"
	"slices"

	"github.com/docsgate/gateway/limits"
)

// ForwardAuthBlocker says why the forward-auth door cannot decide the route, or "" when it
// can. The door sees a request's method, path and headers, never its body or its answer: a
// route whose body is checked, or that applies a tokens or streams limit in any plan (they
// count the answer, or hold a slot until it ends), needs the gateway's own proxy.
func (r *Route) ForwardAuthBlocker() string {
	if r.ChecksBody() {
		return fmt.Sprintf("%s checks its request body, which a proxy asking the forward-auth door never shows the gateway", r.Name)
	}
	for _, plan := range slices.Sorted(maps.Keys(r.sets)) { // the default set ("") first
		for _, l := range r.sets[plan].Limits {
			if l.Rule.Unit == limits.Requests {
				continue
			}
			in := "its limits"
			if plan != "" {
				in = "plan " + plan
			}
			return fmt.Sprintf("%s applies %s (%s), a %s limit, which needs the answer: the forward-auth door decides request limits only",
				r.Name, l.Rule.Name, in, l.Rule.Unit)
		}
	}
	return ""
}

// forwardAuthOnly refuses routes served only through the forward-auth door that it cannot
// decide.
func forwardAuthOnly(routes []*Route) error {
	var ps problems
	for _, r := range routes {
		if !r.ForwardAuthOnly {
			continue
		}
		key := r.CfgKey
		if key == "" {
			key = "routes (" + r.Name + ")"
		}
		if why := r.ForwardAuthBlocker(); why != "" {
			ps.fail(key+".forward_auth_only", "%s", why)
		}
	}
	return ps.err()
}

// ChecksBody reports whether the gateway checks the route's request bodies: the agent job's
// fields, the assistant routes' conversations.
func (r *Route) ChecksBody() bool { return r.Conversation || r.Name == "agent_job" }
