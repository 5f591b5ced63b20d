// Package policy is the gateway's compiled config: routes, limits, plans, how a request's tenant ids are found, thresholds; one immutable snapshot, swapped whole on reload.
package policy

import (
	"maps"
	"slices"

	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/limits"
)

// Policy is one config compiled: what every front door decides a request by, and what the
// operators' reads and writes resolve limits and tenants with. Nothing in it changes once it
// is compiled; a reload compiles a new one.
type Policy struct {
	routes []*Route
	// limits are every enabled limit by plan ("" for the defaults), sorted by name, for
	// usage read-back.
	limits   map[string][]Limit
	orgOf    map[string]string // assistant domain -> configured org
	orgPlan  map[string]string // configured org -> its plan
	orgs     []string          // the configured orgs, sorted
	ipv6Bits int
}

// Compile turns a validated config into a policy, reporting problems with the config keys
// they concern. notify, when set, is the notifications the gateway started with: the limits
// mark the crossings some endpoint takes (see compileLimits).
func Compile(cfg *config.Config, notify *config.Notifications) (*Policy, error) {
	p := &Policy{orgOf: cfg.OrgOf(), orgPlan: map[string]string{}, ipv6Bits: cfg.ClientIP.IPv6Prefix}
	for org, o := range cfg.Orgs {
		p.orgs = append(p.orgs, org)
		if o.Plan != "" {
			p.orgPlan[org] = o.Plan
		}
	}
	slices.Sort(p.orgs)
	var err error
	if p.routes, err = compileRoutes(cfg.Routes); err != nil {
		return nil, err
	}
	plans := plansOf(cfg)
	byPlan, enabled, err := compileLimits(cfg, plans, notify)
	if err != nil {
		return nil, err
	}
	p.limits = enabled
	if err := compileSets(p.routes, routeLimitNames(cfg), plans, byPlan); err != nil {
		return nil, err
	}
	if err := forwardAuthOnly(p.routes); err != nil {
		return nil, err
	}
	return p, nil
}

// Routes is the route table: the built-in routes first, then the config's, in its order.
func (p *Policy) Routes() []*Route { return p.routes }

// RouteKind is the key family of the route of that name (what a key's scopes may name).
func (p *Policy) RouteKind(name string) (auth.Kind, bool) {
	for _, rt := range p.routes {
		if rt.Name == name {
			return rt.Key, true
		}
	}
	return 0, false
}

// Orgs are the configured orgs, sorted.
func (p *Policy) Orgs() []string { return p.orgs }

// Configured says whether org is one the config names.
func (p *Policy) Configured(org string) bool {
	_, ok := slices.BinarySearch(p.orgs, org)
	return ok
}

// OrgOf is the org of an assistant domain: the configured org that lists it, else the domain
// itself (as SafeID makes it): an unmapped domain is an org of its own.
func (p *Policy) OrgOf(domain string) string {
	if org := p.orgOf[domain]; org != "" {
		return org
	}
	return SafeID(domain)
}

// PlanOf is an org's plan ("" for the default limits).
func (p *Policy) PlanOf(org string) string { return p.orgPlan[org] }

// Plans are the plans that enable some limit, sorted, "" (the default limits) first when it
// does.
func (p *Policy) Plans() []string {
	return slices.Sorted(maps.Keys(p.limits))
}

// HasPlan says whether plan enables some limit (a plan that enables none reads as unknown:
// the defaults apply to its tenants' reads).
func (p *Policy) HasPlan(plan string) bool {
	_, ok := p.limits[plan]
	return ok
}

// LimitsOfPlan is every enabled limit of plan, sorted by name; the defaults' for a plan the
// config does not have.
func (p *Policy) LimitsOfPlan(plan string) []Limit {
	if ls, ok := p.limits[plan]; ok {
		return ls
	}
	return p.limits[""]
}

// EnabledLimits lists, sorted, the names of the limits enabled by default or in some plan.
func (p *Policy) EnabledLimits() []string {
	var names []string
	for _, ls := range p.limits {
		for _, l := range ls {
			if !slices.Contains(names, l.Rule.Name) {
				names = append(names, l.Rule.Name)
			}
		}
	}
	slices.Sort(names)
	return names
}

// LimitBy is what the limit name counts by (the same in every plan); 0 for no enabled limit.
func (p *Policy) LimitBy(name string) By {
	for _, ls := range p.limits {
		for _, l := range ls {
			if l.Rule.Name == name {
				return l.By
			}
		}
	}
	return 0
}

// ListedWindow is the window in which the usage page lists a limit's refusals: its default
// limits', else the first plan's that enables it (zero for a limit without windows or not
// enabled).
func (p *Policy) ListedWindow(name string) limits.Window {
	for _, plan := range p.Plans() {
		for _, l := range p.limits[plan] {
			if l.Rule.Name == name {
				return l.Rule.Window
			}
		}
	}
	return limits.Window{}
}

// PlanLimits is one limit as each plan applies it ("" for the defaults).
type PlanLimits struct {
	Name   string
	By     By
	ByPlan map[string]Limit
	plans  map[string]bool // every plan of the config, with or without the limit
}

// PlanLimits is limit name as each plan applies it.
func (p *Policy) PlanLimits(name string) PlanLimits {
	pl := PlanLimits{Name: name, By: p.LimitBy(name), ByPlan: map[string]Limit{}, plans: map[string]bool{}}
	for plan, ls := range p.limits {
		pl.plans[plan] = true
		for _, l := range ls {
			if l.Rule.Name == name {
				pl.ByPlan[plan] = l
			}
		}
	}
	return pl
}

// Reference is the rule whose window an export names: the defaults', else the first plan's.
func (pl PlanLimits) Reference() *limits.Rule {
	if l, ok := pl.ByPlan[""]; ok {
		return l.Rule
	}
	return pl.Rules()[0]
}

// Rules lists the rule of every plan that enables the limit, sorted by plan.
func (pl PlanLimits) Rules() []*limits.Rule {
	plans := slices.Sorted(maps.Keys(pl.ByPlan))
	out := make([]*limits.Rule, len(plans))
	for i, p := range plans {
		out[i] = pl.ByPlan[p].Rule
	}
	return out
}

// RuleFor is the rule that applies to a tenant on plan: its plan's, nil when its plan disables
// the limit; a plan unknown to the config means the defaults.
func (pl PlanLimits) RuleFor(plan string) *limits.Rule {
	if l, ok := pl.ByPlan[plan]; ok {
		return l.Rule
	}
	if pl.plans[plan] {
		return nil
	}
	if l, ok := pl.ByPlan[""]; ok {
		return l.Rule
	}
	return nil
}
