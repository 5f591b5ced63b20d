package rls

import (
	"strings"

	"github.com/docsgate/gateway/config"
)

// table is rate_limit_service.domains compiled: each domain's mappings by their entries'
// keys, in order. It never changes; a reload compiles a new one.
type table struct {
	domains map[string]*domain
	names   []string // the configured domains, for the metrics
}

// domain is one domain's mappings, by the keys of their entries joined (keysOf).
type domain struct {
	byKeys map[string][]*mapping
}

// mapping is one descriptor mapping: entries' values it requires ("" any), the limits it counts.
type mapping struct {
	values    []string
	limits    []string
	keyDigest bool // the last entry's value is a key's digest, resolved by the registry
}

func compile(cfg *config.RateLimitService) *table {
	t := &table{domains: map[string]*domain{}}
	if cfg == nil {
		return t
	}
	for _, d := range cfg.Domains {
		dm := &domain{byKeys: map[string][]*mapping{}}
		for _, m := range d.Descriptors {
			keys := make([]string, len(m.Entries))
			values := make([]string, len(m.Entries))
			for i, e := range m.Entries {
				keys[i], values[i] = e.Key, e.Value
			}
			k := strings.Join(keys, "\x00")
			dm.byKeys[k] = append(dm.byKeys[k], &mapping{values: values, limits: m.Limits, keyDigest: m.IDKind() == config.RateLimitIDKeyDigest})
		}
		t.domains[d.Domain] = dm
		t.names = append(t.names, d.Domain)
	}
	return t
}

// match is the mapping of a descriptor whose entries have keys (joined: keysOf) and values,
// or nil: the mapping whose required values the descriptor has, one requiring values first
// (the most specific; in the config's order among equals).
func (d *domain) match(keys string, values []string) *mapping {
	var best *mapping
	bestFixed := -1
	for _, m := range d.byKeys[keys] {
		fixed, ok := 0, true
		for i, v := range m.values {
			if v == "" {
				continue
			}
			if v != values[i] {
				ok = false
				break
			}
			fixed++
		}
		if ok && fixed > bestFixed {
			best, bestFixed = m, fixed
		}
	}
	return best
}
