package config

import (
	"slices"
	"strings"
)

// RateLimitService serves Envoy's rate limit service (envoy.service.ratelimit.v3, gRPC) on a
// listener of its own: Envoy's rate_limit filter (or an Envoy AI Gateway) asks it about each
// request's descriptors, and the domains map those descriptors to the gateway's limits, which
// count them in the same counters as the proxy's requests. Absent: no such listener.
type RateLimitService struct {
	// Listen is the gRPC listener's address (required), such as 127.0.0.1:8081. It is plain
	// gRPC, without TLS: keep it on loopback or a private network, next to Envoy.
	Listen string `yaml:"listen"`
	// Domains map each Envoy domain's descriptors to limits. A domain or descriptor no entry
	// maps counts nothing and is answered OK, as Envoy's reference service does.
	Domains []RateLimitDomain `yaml:"domains"`
}

// RateLimitDomain maps the descriptors of one Envoy domain (the rate_limit filter's domain).
type RateLimitDomain struct {
	Domain      string                `yaml:"domain"`
	Descriptors []RateLimitDescriptor `yaml:"descriptors"`
}

// RateLimitDescriptor maps a descriptor to limits: a descriptor whose entries have exactly
// these keys, in this order (and these values, where an entry sets one), is counted against
// each limit of Limits, its tenant id being the value of the descriptor's last entry.
type RateLimitDescriptor struct {
	Entries []RateLimitEntry `yaml:"entries"`
	// Limits are the names of the limits (of limits:, or built-in) the descriptor counts
	// against, in the tenant's plan. Requests limits take the descriptor's hits; tokens limits
	// (without a reserve) are checked, and debited the hits Envoy reports when a stream ends.
	Limits []string `yaml:"limits"`
	// ID says what the last entry's value is: "value" (default), the id itself as each limit
	// counts by it (a project id, an org, a client address, a key's digest); or "key_digest",
	// a key's SHA-256 digest (hex) that the key registry resolves: limits by key count the key
	// (its lineage), limits by org its org, in the key's plan (else its org's).
	ID string `yaml:"id"`
}

// RateLimitEntry is one entry of a descriptor: its key, and the value it must have (empty:
// any value).
type RateLimitEntry struct {
	Key   string `yaml:"key"`
	Value string `yaml:"value"`
}

// The ids a descriptor's last entry may hold (RateLimitDescriptor.ID).
const (
	RateLimitIDValue     = "value"
	RateLimitIDKeyDigest = "key_digest"
)

// IDKind is d.ID with its default.
func (d *RateLimitDescriptor) IDKind() string {
	if d.ID == "" {
		return RateLimitIDValue
	}
	return d.ID
}

// entriesKey names entries in one string, to find a mapping given twice: keys and values each
// followed by a NUL (neither holds one).
func entriesKey(entries []RateLimitEntry) string {
	var b strings.Builder
	for _, e := range entries {
		b.WriteString(e.Key)
		b.WriteByte(0)
		b.WriteString(e.Value)
		b.WriteByte(0)
	}
	return b.String()
}

// rateLimitService checks rate_limit_service: every limit named exists and is one the
// service can count, no domain or mapping is given twice.
func (v *validator) rateLimitService(c *Config) {
	s := c.RateLimitService
	if s == nil {
		return
	}
	v.listenAddr("rate_limit_service.listen", s.Listen)
	if s.Listen != "" && (s.Listen == c.Listen || s.Listen == c.AdminListen) {
		v.fail("rate_limit_service.listen", "%q must differ from listen and admin_listen", s.Listen)
	}
	if len(s.Domains) == 0 {
		v.fail("rate_limit_service.domains", "must map at least one domain")
	}
	specs := c.ResolvedLimits()
	names := make([]string, len(specs))
	for i, sp := range specs {
		names[i] = sp.Name
	}
	var domains []string
	for i, d := range s.Domains {
		key := indexKey("rate_limit_service.domains", i)
		switch {
		case d.Domain == "":
			v.fail(key+".domain", "is required")
		case slices.Contains(domains, d.Domain):
			v.fail(key+".domain", "%q is mapped twice", d.Domain)
		}
		domains = append(domains, d.Domain)
		if len(d.Descriptors) == 0 {
			v.fail(key+".descriptors", "must map at least one descriptor")
		}
		var seen []string
		for j, m := range d.Descriptors {
			v.rateLimitDescriptor(indexKey(key+".descriptors", j), m, c, specs, names, &seen)
		}
	}
}

// rateLimitDescriptor checks one mapping of a domain; seen are the domain's mappings so far.
func (v *validator) rateLimitDescriptor(key string, m RateLimitDescriptor, c *Config, specs []LimitSpec, names []string, seen *[]string) {
	if len(m.Entries) == 0 {
		v.fail(key+".entries", "must list at least one entry")
	}
	for k, e := range m.Entries {
		if e.Key == "" || strings.ContainsRune(e.Key, 0) || strings.ContainsRune(e.Value, 0) {
			v.fail(indexKey(key+".entries", k)+".key", "is required (and no key or value holds a NUL)")
		}
	}
	ek := entriesKey(m.Entries)
	if slices.Contains(*seen, ek) {
		v.fail(key+".entries", "the same entries are mapped twice in this domain")
	}
	*seen = append(*seen, ek)
	kind := m.IDKind()
	if kind != RateLimitIDValue && kind != RateLimitIDKeyDigest {
		v.fail(key+".id", "%q is not value or key_digest", m.ID)
	}
	if kind == RateLimitIDKeyDigest && c.Auth.Mode != "registry" {
		v.fail(key+".id", "key_digest needs auth.mode: registry (the registry gives the key's org and plan)")
	}
	if len(m.Limits) == 0 {
		v.fail(key+".limits", "must name at least one limit")
	}
	for k, name := range m.Limits {
		lk := indexKey(key+".limits", k)
		i := slices.IndexFunc(specs, func(s LimitSpec) bool { return s.Name == name })
		switch {
		case i < 0:
			v.fail(lk, "%q is no limit%s", name, Suggest(name, names))
			continue
		case slices.Index(m.Limits, name) < k:
			v.fail(lk, "%q is named twice", name)
		}
		for _, plan := range append([]string{""}, planNames(c)...) {
			if msg := rateLimitable(c.PlanLimits(plan), name); msg != "" {
				where := ""
				if plan != "" {
					where = " in plan " + plan
				}
				v.fail(lk, "%q%s %s", name, where, msg)
				break
			}
		}
		if kind == RateLimitIDKeyDigest && specs[i].By != "key" && specs[i].By != "org" {
			v.fail(lk, "%q counts by %s: a key_digest descriptor counts limits by key or org", name, specs[i].By)
		}
	}
}

// rateLimitable says why the service cannot count the limit name of specs ("" when it can):
// what it cannot settle (stream slots, token holds), it refuses.
func rateLimitable(specs []LimitSpec, name string) string {
	i := slices.IndexFunc(specs, func(s LimitSpec) bool { return s.Name == name })
	switch {
	case i < 0:
		return ""
	case specs[i].Unit == "streams":
		return "counts streams in flight, which only the proxy sees end"
	case specs[i].Unit == "tokens" && specs[i].Reserve > 0:
		return "holds a reserve for an answer the proxy reads: the rate limit service debits tokens limits without a reserve"
	}
	return ""
}

// planNames are the config's plans, sorted.
func planNames(c *Config) []string {
	names := make([]string, 0, len(c.Plans))
	for p := range c.Plans {
		names = append(names, p)
	}
	slices.Sort(names)
	return names
}
