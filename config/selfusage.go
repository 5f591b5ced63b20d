package config

import (
	"slices"
	"strings"
)

// SelfUsage configures the tenants' own usage endpoint on the public listener: a key holder
// asks which limits a request of theirs to a route would be subject to, and how much of each
// is left.
type SelfUsage struct {
	// Enabled serves the endpoint (default true).
	Enabled bool `yaml:"enabled"`
	// Path is where it answers (default /gateway/usage). No route may match it.
	Path string `yaml:"path"`
	// PerAddressPerMinute is how many requests one client address (IPv6: its
	// client_ip.ipv6_prefix) gets answered in a minute from its first, counted in process by
	// each replica before its key is checked; beyond, 429 rate_limited. It comes before the
	// per-key bound so that keys invented at one address stop there (default 120).
	PerAddressPerMinute int `yaml:"per_address_per_minute"`
	// PerKeyPerMinute is how many answers one key gets in a minute from its first, counted in
	// process by each replica; beyond, 429 rate_limited. It is counted against no configured
	// limit (default 60).
	PerKeyPerMinute int `yaml:"per_key_per_minute"`
	// PrefixModeExposes lists what, beyond the caller's own address (the limits by ip), the
	// endpoint shows in auth.mode prefix, where any invented key of the right family passes:
	// "key", "org", "project" (default none). Each one shows every caller the counters of
	// whatever key, org (by any of its domains) or project it names; the gateway warns at
	// start. Registry mode, which ties keys to their orgs, domains and projects, shows them all.
	PrefixModeExposes []string `yaml:"prefix_mode_exposes"`
}

// selfUsageDefaults are the defaults of self_usage.
var selfUsageDefaults = SelfUsage{Enabled: true, Path: "/gateway/usage", PerAddressPerMinute: 120, PerKeyPerMinute: 60}

// selfUsage checks self_usage. Whether a route matches the path is checked where routes are
// compiled (the public listener's route table).
func (v *validator) selfUsage(s SelfUsage) {
	if !s.Enabled {
		return
	}
	v.plainPath("self_usage.path", s.Path, "/gateway/usage")
	if s.PerAddressPerMinute < 1 {
		v.fail("self_usage.per_address_per_minute", "must be at least 1")
	}
	if s.PerKeyPerMinute < 1 {
		v.fail("self_usage.per_key_per_minute", "must be at least 1")
	}
	for i, e := range s.PrefixModeExposes {
		key := indexKey("self_usage.prefix_mode_exposes", i)
		switch {
		case e == "ip":
			v.fail(key, "ip need not be listed: the caller's own address is always shown; list key, org or project")
		case e != "key" && e != "org" && e != "project": // what limits count by, ip aside
			v.fail(key, "%q is not key, org or project", e)
		case slices.Index(s.PrefixModeExposes, e) < i:
			v.fail(key, "%q is listed twice", e)
		}
	}
}

// plainPath checks a path the gateway answers at itself (self_usage.path, forward_auth.path):
// a literal path such as example, which no request can reach in two spellings.
func (v *validator) plainPath(key, p, example string) {
	if !strings.HasPrefix(p, "/") || len(p) > 256 || strings.ContainsAny(p, "{}?#%*") || strings.HasSuffix(p, "/") ||
		strings.Contains(p, "//") || strings.Contains(p, "/./") || strings.Contains(p, "/../") || strings.HasSuffix(p, "/.") || strings.HasSuffix(p, "/..") {
		v.fail(key, "%q must be a plain path such as %s: starting with /, no trailing /, no {wildcards}, ?, #, %% or dot segments", p, example)
	}
	for i := 0; i < len(p); i++ {
		if p[i] <= ' ' || p[i] >= 0x7f {
			v.fail(key, "%q must be printable ASCII without spaces", p)
			break
		}
	}
}
