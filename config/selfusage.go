package config

import "strings"

// SelfUsage configures the tenants' own usage endpoint on the public listener: a key holder
// asks which limits a request of theirs to a route would be subject to, and how much of each
// is left.
type SelfUsage struct {
	// Enabled serves the endpoint (default true).
	Enabled bool `yaml:"enabled"`
	// Path is where it answers (default /gateway/usage). No route may match it.
	Path string `yaml:"path"`
	// PerKeyPerMinute is how many answers one key gets in a minute, counted in process by
	// each replica; beyond, 429 rate_limited. It is counted against no configured limit.
	PerKeyPerMinute int `yaml:"per_key_per_minute"`
}

// selfUsageDefaults are the defaults of self_usage.
var selfUsageDefaults = SelfUsage{Enabled: true, Path: "/gateway/usage", PerKeyPerMinute: 60}

// selfUsage checks self_usage. Whether a route matches the path is checked where routes are
// compiled (the public listener's route table).
func (v *validator) selfUsage(s SelfUsage) {
	if !s.Enabled {
		return
	}
	p := s.Path
	if !strings.HasPrefix(p, "/") || len(p) > 256 || strings.ContainsAny(p, "{}?#%*") || strings.HasSuffix(p, "/") ||
		strings.Contains(p, "//") || strings.Contains(p, "/./") || strings.Contains(p, "/../") || strings.HasSuffix(p, "/.") || strings.HasSuffix(p, "/..") {
		v.fail("self_usage.path", "%q must be a plain path such as /gateway/usage: starting with /, no trailing /, no {wildcards}, ?, #, %% or dot segments", p)
	}
	for i := 0; i < len(p); i++ {
		if p[i] <= ' ' || p[i] >= 0x7f {
			v.fail("self_usage.path", "%q must be printable ASCII without spaces", p)
			break
		}
	}
	if s.PerKeyPerMinute < 1 {
		v.fail("self_usage.per_key_per_minute", "must be at least 1")
	}
}
