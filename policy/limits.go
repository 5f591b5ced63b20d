package policy

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/limits"
)

// Limit is one limit as a plan applies it: its rule (its counters are the limit's, whatever
// the plan: a plan's rule keeps the limit's name, only the allowance differs) and what its
// tenants are.
type Limit struct {
	Rule   *limits.Rule
	By     By
	Shadow bool // counted and reported, never denies
	Cutoff bool // ends a streamed answer when the tenant's tokens run out
}

// LimitSet is what one route applies to the tenants of one plan, in one decision.
type LimitSet struct {
	Limits []Limit
	// PolicyValue is the RateLimit-Policy header's value, shared read-only by the requests
	// the set decides.
	PolicyValue []string
	counts      Bys // what its limits count by
}

// Counts says whether some limit of the set counts by b.
func (set *LimitSet) Counts(b By) bool { return set.counts.Has(b) }

// builtinRouteLimits are the platform's limits for its operations; both assistant versions
// apply the same ones (counters belong to the limit, so they share one quota).
var builtinRouteLimits = map[string][]string{
	"agent_job":            {"agent_job_per_project"},
	"assistant_message":    {"assistant_per_key", "assistant_per_org", "assistant_per_ip"},
	"assistant_message_v2": {"assistant_per_key", "assistant_per_org", "assistant_per_ip"},
}

// plansOf lists "" (the default limits) and the config's plans, sorted.
func plansOf(cfg *config.Config) []string {
	plans := []string{""}
	for p := range cfg.Plans {
		plans = append(plans, p)
	}
	slices.Sort(plans[1:])
	return plans
}

// compileLimits resolves every limit of every plan ("" for the defaults) into its rule, by
// plan and name, and lists the enabled ones of each plan, sorted by name. notify, when set, is
// the notifications the gateway started with (a change needs a restart): a limit marks
// thresholds, its first refusal and its forecast only where it sends those events and some
// endpoint takes them.
func compileLimits(cfg *config.Config, plans []string, notify *config.Notifications) (byPlan map[string]map[string]Limit, enabled map[string][]Limit, err error) {
	byPlan, enabled = map[string]map[string]Limit{}, map[string][]Limit{}
	for _, plan := range plans {
		set := map[string]Limit{}
		for _, s := range cfg.PlanLimits(plan) {
			l, err := compileLimit(s, notify)
			if err != nil {
				return nil, nil, err
			}
			set[s.Name] = l
			if s.Limit > 0 {
				enabled[plan] = append(enabled[plan], l)
			}
		}
		byPlan[plan] = set
	}
	return byPlan, enabled, nil
}

// compileLimit is one resolved limit's rule.
func compileLimit(s config.LimitSpec, notify *config.Notifications) (Limit, error) {
	var w limits.Window
	if s.Unit != "streams" { // a streams limit has no window
		var err error
		if w, err = limits.ParseWindow(s.Window); err != nil {
			return Limit{}, fmt.Errorf("limits.%s.window: %w", s.Name, err)
		}
	}
	a, err := limits.ParseAlgorithm(s.Algorithm)
	if err != nil {
		return Limit{}, fmt.Errorf("limits.%s.algorithm: %w", s.Name, err)
	}
	b, ok := ParseBy(s.By)
	if !ok {
		return Limit{}, fmt.Errorf("limits.%s.by: %q is not project, key, org or ip", s.Name, s.By)
	}
	u, err := limits.ParseUnit(s.Unit)
	if err != nil {
		return Limit{}, fmt.Errorf("limits.%s.unit: %w", s.Name, err)
	}
	r := &limits.Rule{Name: s.Name, Limit: s.Limit, Window: w, Algorithm: a, Unit: u, Shadow: s.Shadow, History: s.HistoryOf(w)}
	r.Reserve, r.ReserveTTL = s.Reserve, s.ReserveTTL // holds (tokens with a reserve, streams)
	r.EstimateMax = s.EstimateMax
	if err := markEvents(r, s, notify); err != nil {
		return Limit{}, err
	}
	return Limit{Rule: r, By: b, Shadow: s.Shadow, Cutoff: s.Cutoff}, nil
}

// markEvents makes r mark in its counters what its notifications report: the thresholds, the
// first refusal and the forecast the limit sends (a visitor's limit, by ip, only what it sets
// itself) and some endpoint takes.
func markEvents(r *limits.Rule, s config.LimitSpec, notify *config.Notifications) error {
	if notify == nil {
		return nil
	}
	if s.Sends(config.EventThresholdCrossed) && notify.Wants(config.EventThresholdCrossed, s.Name) {
		th, err := limits.NewThresholds(s.Thresholds...)
		if err != nil {
			return fmt.Errorf("limits.%s.thresholds: %w", s.Name, err)
		}
		r.Thresholds = th
	}
	r.Exhausted = !s.Shadow && s.Sends(config.EventExhausted) && notify.Wants(config.EventExhausted, s.Name)
	r.Forecast = s.Sends(config.EventForecast) && notify.Wants(config.EventForecast, s.Name)
	return nil
}

// routeLimitNames are the names of the limits each route applies: the built-in routes'
// defaults, unless the config's entry lists its own.
func routeLimitNames(cfg *config.Config) map[string][]string {
	lists := map[string][]string{}
	for name, l := range builtinRouteLimits {
		lists[name] = l
	}
	for _, e := range cfg.Routes {
		if e.Limits != nil {
			lists[e.Name] = *e.Limits
		}
	}
	return lists
}

// compileSets gives each route its limit sets, one per plan plus the default: the limits it
// applies that the plan enables, in the order the route lists them. A limit the route cannot
// apply (undefined, or counting by something the route does not know) is a problem.
func compileSets(routes []*Route, names map[string][]string, plans []string, byPlan map[string]map[string]Limit) error {
	var ps problems
	for _, rt := range routes {
		rt.sets = map[string]*LimitSet{}
		for _, plan := range plans {
			set := &LimitSet{}
			for _, name := range names[rt.Name] {
				l, ok := byPlan[plan][name]
				if why := rt.cannotApply(name, l, ok); why != "" {
					if plan == "" { // said once, of the default set
						ps.fail("routes", "%s", why)
					}
					continue
				}
				if l.Rule.Limit <= 0 {
					continue // disabled: never asked for, never in headers
				}
				set.Limits = append(set.Limits, l)
				set.counts = set.counts.With(l.By)
			}
			set.PolicyValue = []string{policyHeader(set.Limits)}
			rt.sets[plan] = set
		}
	}
	return ps.err()
}

// cannotApply says why the route cannot apply the limit of that name (ok false: it is not
// defined), or "".
func (rt *Route) cannotApply(name string, l Limit, ok bool) string {
	switch need := pathParam(l.By); {
	case !ok:
		return fmt.Sprintf("%s applies %q, which is not a defined limit", rt.Name, name)
	case need != "" && !strings.Contains(rt.Path, "{"+need+"}"):
		return fmt.Sprintf("%s applies %s, which counts by %s, but its path has no {%s}", rt.Name, name, l.By, need)
	case l.By == ByOrg && rt.Key != auth.Assistant:
		return fmt.Sprintf("%s applies %s, which counts by org, but only assistant routes know their org", rt.Name, name)
	}
	return ""
}

// policyHeader is a RateLimit-Policy value; it only changes with the config.
func policyHeader(ls []Limit) string {
	parts := make([]string, len(ls))
	for i, l := range ls {
		parts[i] = PolicyItem(l.Rule, l.Rule.Limit)
	}
	return strings.Join(parts, ", ")
}

// PolicyItem is one limit's item of a RateLimit-Policy value, with quota as its allowance.
func PolicyItem(r *limits.Rule, quota int64) string {
	if r.Unit == limits.Streams { // answers in flight, in no window
		return fmt.Sprintf("%q;q=%d", r.Name, quota)
	}
	return fmt.Sprintf("%q;q=%d;w=%d", r.Name, quota, int64(r.Window.Nominal()/time.Second))
}

// PolicyFor is the RateLimit-Policy value of a decision of the set: the config's, shared,
// unless a tenant's run-time quota (an override, grants) changed an allowance, which the header
// then shows.
func (set *LimitSet) PolicyFor(dec *limits.Decision) []string {
	for i := range dec.Results {
		if dec.Results[i].Limit != set.Limits[i].Rule.Limit {
			parts := make([]string, len(dec.Results))
			for j := range dec.Results {
				parts[j] = PolicyItem(set.Limits[j].Rule, dec.Results[j].Limit)
			}
			return []string{strings.Join(parts, ", ")}
		}
	}
	return set.PolicyValue
}
