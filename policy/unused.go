package policy

import (
	"maps"
	"slices"

	"github.com/docsgate/gateway/config"
)

// Unused lists what a valid config defines that nothing applies, as warnings with the keys
// they concern, sorted by key:
//   - an entry of limits: that no route applies (nor a descriptor of rate_limit_service): a misspelt name (agent_jobs_per_project) is a
//     new limit that counts nothing, while the route keeps the limit it meant, so the warning
//     names the closest limit the routes do apply;
//   - in auth.mode prefix, a plan no org names: keys carry a plan only in registry mode (where
//     the registry, not the file, may name it, so no plan is reported there).
//
// The gateway warns of each at start, on reload and in -check-config.
func Unused(cfg *config.Config) []config.Problem {
	applied := map[string]bool{}
	for _, names := range routeLimitNames(cfg) {
		for _, n := range names {
			applied[n] = true
		}
	}
	if s := cfg.RateLimitService; s != nil { // Envoy's descriptors apply limits too
		for _, d := range s.Domains {
			for _, m := range d.Descriptors {
				for _, n := range m.Limits {
					applied[n] = true
				}
			}
		}
	}
	// What a misspelt name may have meant: the applied limits, then the built-in ones.
	known := slices.Sorted(maps.Keys(applied))
	for _, s := range config.BuiltinLimits() {
		if !applied[s.Name] {
			known = append(known, s.Name)
		}
	}
	var ps []config.Problem
	for _, name := range slices.Sorted(maps.Keys(cfg.Limits)) {
		if applied[name] {
			continue
		}
		ps = append(ps, config.Problem{Key: "limits." + name, Msg: "no route applies this limit, so it counts nothing" +
			config.Suggest(name, known) + "; to apply it, list it under routes[].limits of the routes it is for"})
	}
	if cfg.Auth.Mode == "prefix" {
		named := map[string]bool{}
		for _, o := range cfg.Orgs {
			named[o.Plan] = true
		}
		for _, plan := range slices.Sorted(maps.Keys(cfg.Plans)) {
			if !named[plan] {
				ps = append(ps, config.Problem{Key: "plans." + plan,
					Msg: "no org names this plan (orgs.<org>.plan) and keys carry no plan in auth.mode prefix, so it applies to nobody"})
			}
		}
	}
	return ps
}
