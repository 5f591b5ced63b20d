package config

import (
	"maps"
	"regexp"
	"slices"
	"sort"
	"time"

	"github.com/docsgate/gateway/limits"
)

// Redis is where limit counters live. No addrs: an in-process store, exact for one replica only.
type Redis struct {
	// Addrs: one address is a standalone Redis, several a Redis Cluster; with MasterName, the
	// Sentinel addresses.
	Addrs      []string `yaml:"addrs"`
	MasterName string   `yaml:"master_name"`
	Username   string   `yaml:"username"`
	// Password is better given in the REDIS_PASSWORD environment variable.
	Password string `yaml:"password"`
	DB       int    `yaml:"db"`
	TLS      bool   `yaml:"tls"`
	// Timeout bounds one limiter call, round trip included.
	Timeout time.Duration `yaml:"timeout"`
	// OnError: deny answers 503 limiter_unavailable when Redis fails; allow lets requests through.
	OnError string `yaml:"on_error"`
	// KeyPrefix starts every key name: <prefix>:<limit>:<window>:{<id>} (GCRA limits:
	// <prefix>:<limit>:<window>:gcra:{<id>}).
	KeyPrefix string  `yaml:"key_prefix"`
	Breaker   Breaker `yaml:"breaker"`
	// PoolSize is the number of connections per Redis node; 0 picks max(32, 10 per CPU), so
	// a burst of concurrent requests does not queue for a connection past redis.timeout.
	PoolSize int `yaml:"pool_size"`
	// WaitReplicas, when above 0, admits a request only once that many replicas hold its
	// count: WAIT follows every limiter script in the same pipeline (no extra round trip).
	WaitReplicas int `yaml:"wait_replicas"`
	// Coalesce sends concurrent limiter calls bound for the same Redis node as one pipelined
	// write (a combiner per node on go-redis pipelines); off, each call has its own write
	// and read.
	Coalesce bool `yaml:"coalesce"`
}

// Breaker stops calling a failing Redis node for a while, so a dead node does not add its
// timeout to every request bound for it. There is one breaker per node (each Cluster master),
// so a dead master refuses only the requests whose limits live on it.
type Breaker struct {
	// Failures is the number of consecutive failed calls to a node that opens its breaker.
	Failures int `yaml:"failures"`
	// Cooldown is how long it stays open before one trial call.
	Cooldown time.Duration `yaml:"cooldown"`
}

// Limit is one entry of limits:. For the four built-in names, omitted fields keep the
// built-in values.
type Limit struct {
	// Limit is the number of requests admitted per window; 0 disables the limit.
	Limit *int64 `yaml:"limit"`
	// Window is hour, day or month (calendar, UTC) or a duration such as 10s (epoch-aligned).
	Window string `yaml:"window"`
	// By is what is counted: project, key, org or ip.
	By string `yaml:"by"`
	// Algorithm is fixed (default) or gcra (smooth; burst = limit, refill limit per window).
	Algorithm string `yaml:"algorithm"`
	// Mode is enforce (default) or shadow: counted and reported, never denying.
	Mode string `yaml:"mode"`
	// Unit is requests (default: one per admitted request), tokens (the prompt and
	// completion tokens of streamed answers, debited once an answer's usage is known) or
	// streams (answers in flight; no window).
	Unit string `yaml:"unit"`
	// Reserve (tokens limits) holds that many tokens at admission, admitting only while at
	// least that many remain, and settles the hold to the answer's tokens at its end. 0 (the
	// default): no hold, the answer is debited after it ends.
	Reserve *int64 `yaml:"reserve"`
	// ReserveTTL (tokens limits with a reserve, streams limits) is how long a hold or a slot
	// lives unsettled since its last refresh, so those of a gateway that died come back; a
	// live answer refreshes its own every quarter of it, so it bounds no answer's length.
	// 0: 10m.
	ReserveTTL time.Duration `yaml:"reserve_ttl"`
	// EstimateMax (tokens limits) is the most an answer without a final usage report is
	// charged for its prompt by estimate; absent: DefaultEstimateMax.
	EstimateMax *int64 `yaml:"estimate_max"`
	// History is how many ended windows the limit keeps for /usage/history and /usage/export
	// (fixed windows; a GCRA limit keeps none); absent: 48 for hour, 35 for day, 13 for month,
	// 10 for a duration; 0 keeps none.
	History *int `yaml:"history"`
	// Cutoff (tokens limits with a reserve, enforced) ends an answer in flight, as a valid
	// stream of its protocol, when its tokens would take the tenant past the limit: each
	// answer's hold grows with its running count while the allowance has room. Absent: false.
	Cutoff *bool `yaml:"cutoff"`
	// Thresholds (fixed-window requests and tokens limits, with notifications) are the
	// fractions of the limit in force whose crossing sends quota.threshold_crossed, once per
	// tenant and window; absent: DefaultThresholds once notifications are on, for a limit
	// that sends quota.threshold_crossed (see Events); [] none.
	Thresholds *[]float64 `yaml:"thresholds"`
	// Forecast (fixed-window requests and tokens limits, with notifications) sends
	// quota.forecast when the window's burn rate would run the tenant out before the reset.
	// Absent: false.
	Forecast *bool `yaml:"forecast"`
	// Events (fixed-window requests and tokens limits, with notifications) are the quota
	// events the limit sends (QuotaEventTypes). Absent: a limit of a tenant (by project, key
	// or org) sends quota.threshold_crossed and quota.exhausted, and quota.forecast with
	// Forecast; a limit by ip (one counter per visitor) sends only what its own Thresholds
	// and Forecast set, never quota.exhausted. [] sends none.
	Events *[]string `yaml:"events"`
}

// LimitSpec is a limit with every field resolved.
type LimitSpec struct {
	Name      string
	Limit     int64
	Window    string
	By        string
	Algorithm string
	Shadow    bool
	Unit      string // "requests", "tokens" or "streams"
	// Reserve and ReserveTTL: see Limit.
	Reserve    int64
	ReserveTTL time.Duration
	// EstimateMax: see Limit; DefaultEstimateMax unless set.
	EstimateMax int64
	History     *int // nil: limits.DefaultHistory of the window
	Cutoff      bool // see Limit
	// Thresholds, Forecast and Events: see Limit; resolved, so empty unless notifications
	// are on, the limit counts in fixed windows and sends the events they are for: Events
	// lists exactly the quota events the limit sends.
	Thresholds []float64
	Forecast   bool
	Events     []string
}

// Sends tells whether the limit sends quota events of type event.
func (s *LimitSpec) Sends(event string) bool { return slices.Contains(s.Events, event) }

// Visitor tells whether the limit counts per visitor (by ip) rather than per tenant: its
// events are sent only when it asks for them, and yield to the tenants' when something must
// be dropped.
func (s *LimitSpec) Visitor() bool { return s.By == "ip" }

// DefaultEstimateMax is a tokens limit's estimate_max when it sets none: a long conversation's
// prompt, while one request can never charge a tenant more by estimate than this plus the
// answer text that actually passed.
const DefaultEstimateMax = 4096

// HistoryOf is the number of ended windows s keeps: History, else the default of window w.
func (s *LimitSpec) HistoryOf(w limits.Window) int {
	if s.History != nil {
		return *s.History
	}
	return limits.DefaultHistory(w)
}

// BuiltinLimits are the platform's documented limits.
func BuiltinLimits() []LimitSpec {
	return []LimitSpec{
		{Name: "agent_job_per_project", Limit: 100, Window: "hour", By: "project", Algorithm: "fixed", Unit: "requests", EstimateMax: DefaultEstimateMax},
		{Name: "assistant_per_key", Limit: 10000, Window: "month", By: "key", Algorithm: "fixed", Unit: "requests", EstimateMax: DefaultEstimateMax},
		{Name: "assistant_per_org", Limit: 10000, Window: "hour", By: "org", Algorithm: "fixed", Unit: "requests", EstimateMax: DefaultEstimateMax},
		{Name: "assistant_per_ip", Limit: 10000, Window: "day", By: "ip", Algorithm: "fixed", Unit: "requests", EstimateMax: DefaultEstimateMax},
	}
}

// ResolvedLimits merges limits: over the built-in limits, sorted by name.
func (c *Config) ResolvedLimits() []LimitSpec {
	specs := c.mergedLimits()
	c.notifyDefaults(specs)
	return specs
}

// mergedLimits are the built-in limits with limits: over them, sorted by name, their
// notification fields as the file sets them (notifyDefaults resolves them).
func (c *Config) mergedLimits() []LimitSpec {
	specs := BuiltinLimits()
	for name, l := range c.Limits {
		i := slices.IndexFunc(specs, func(s LimitSpec) bool { return s.Name == name })
		if i < 0 {
			specs = append(specs, LimitSpec{Name: name, Algorithm: "fixed", Unit: "requests", EstimateMax: DefaultEstimateMax})
			i = len(specs) - 1
		}
		specs[i].override(l)
	}
	sort.Slice(specs, func(i, j int) bool { return specs[i].Name < specs[j].Name })
	return specs
}

// notifyDefaults resolves thresholds, forecast and events: nothing where notifications are
// off or a limit has no fixed windows; else the events the limit sends (Limit.Events, or its
// defaults), the default thresholds where it sends quota.threshold_crossed and sets none, and
// no thresholds or forecast where it does not send their events.
func (c *Config) notifyDefaults(specs []LimitSpec) {
	for i := range specs {
		s := &specs[i]
		if !c.Notifications.Enabled() || !windowed(*s) {
			s.Thresholds, s.Forecast, s.Events = nil, false, nil
			continue
		}
		events := s.Events
		if events == nil {
			events = defaultEvents(s)
		}
		if !slices.Contains(events, EventThresholdCrossed) {
			s.Thresholds = nil
		} else if s.Thresholds == nil {
			s.Thresholds = slices.Clone(DefaultThresholds)
		}
		s.Forecast = s.Forecast && slices.Contains(events, EventForecast)
		s.Events = []string{}
		for _, e := range QuotaEventTypes { // in a fixed order, only what is actually sent
			if slices.Contains(events, e) && (e != EventThresholdCrossed || len(s.Thresholds) > 0) && (e != EventForecast || s.Forecast) {
				s.Events = append(s.Events, e)
			}
		}
	}
}

// defaultEvents are the quota events of a limit that sets no events: a tenant's limit sends
// every one it is configured for; a visitor's (by ip) only those its own thresholds and
// forecast set, so that a crowd of addresses makes no events unless asked to.
func defaultEvents(s *LimitSpec) []string {
	var events []string
	if !s.Visitor() || len(s.Thresholds) > 0 {
		events = append(events, EventThresholdCrossed)
	}
	if !s.Visitor() {
		events = append(events, EventExhausted)
	}
	if s.Forecast {
		events = append(events, EventForecast)
	}
	return events
}

// PlanLimits resolves a plan's overrides over the base limits: every limit, with the plan's
// values where it sets them. What a limit counts by never changes (validation refuses it).
func (c *Config) PlanLimits(plan string) []LimitSpec {
	specs := c.mergedLimits()
	for i := range specs {
		if l, ok := c.Plans[plan][specs[i].Name]; ok {
			l.By, l.Unit = "", ""
			specs[i].override(l)
		}
	}
	c.notifyDefaults(specs)
	return specs
}

// override applies the fields an entry sets.
func (s *LimitSpec) override(l Limit) {
	if l.Limit != nil {
		s.Limit = *l.Limit
	}
	if l.Window != "" {
		s.Window = l.Window
	}
	if l.By != "" {
		s.By = l.By
	}
	if l.Algorithm != "" {
		s.Algorithm = l.Algorithm
	}
	if l.Mode != "" {
		s.Shadow = l.Mode == "shadow"
	}
	if l.Unit != "" {
		s.Unit = l.Unit
	}
	if l.Reserve != nil {
		s.Reserve = *l.Reserve
	}
	if l.ReserveTTL != 0 {
		s.ReserveTTL = l.ReserveTTL
	}
	if l.EstimateMax != nil {
		s.EstimateMax = *l.EstimateMax
	}
	if l.History != nil {
		s.History = l.History
	}
	if l.Cutoff != nil {
		s.Cutoff = *l.Cutoff
	}
	if l.Thresholds != nil {
		s.Thresholds = append([]float64{}, *l.Thresholds...) // non-nil: [] is none, not the default
	}
	if l.Forecast != nil {
		s.Forecast = *l.Forecast
	}
	if l.Events != nil {
		s.Events = append([]string{}, *l.Events...) // non-nil: [] is none, not the default
	}
}

// OrgOf maps an assistant domain to its organization; an unmapped domain is an org of its own.
func (c *Config) OrgOf() map[string]string {
	m := make(map[string]string)
	for org, o := range c.Orgs {
		for _, d := range o.Domains {
			m[d] = org
		}
	}
	return m
}

var limitName = regexp.MustCompile(`^[a-z][a-z0-9_]{0,63}$`)

func (v *validator) limits(c *Config) {
	switch c.Redis.OnError {
	case "deny", "allow":
	default:
		v.fail("redis.on_error", "%q is not deny or allow", c.Redis.OnError)
	}
	v.positive("redis.timeout", c.Redis.Timeout)
	if c.Redis.PoolSize < 0 {
		v.fail("redis.pool_size", "must not be negative (0 picks a size from the CPU count)")
	}
	if c.Redis.WaitReplicas < 0 {
		v.fail("redis.wait_replicas", "must not be negative (0 does not wait for replicas)")
	}
	if c.Redis.DB < 0 {
		v.fail("redis.db", "must not be negative")
	}
	if c.Redis.MasterName != "" && len(c.Redis.Addrs) == 0 {
		v.fail("redis.addrs", "must list the Sentinel addresses when master_name is set")
	}
	for i, a := range c.Redis.Addrs {
		v.listenAddr(indexKey("redis.addrs", i), a)
	}
	if c.Quota.AuditMax < 1 || c.Quota.AuditMax > MaxAuditMax {
		v.fail("quota.audit_max", "%d: must be from 1 to %d", c.Quota.AuditMax, MaxAuditMax)
	}
	if !limitName.MatchString(c.Redis.KeyPrefix) {
		v.fail("redis.key_prefix", "%q must be lower_snake_case", c.Redis.KeyPrefix)
	}
	if c.Redis.Breaker.Failures < 1 {
		v.fail("redis.breaker.failures", "must be at least 1")
	}
	v.positive("redis.breaker.cooldown", c.Redis.Breaker.Cooldown)
	if c.ClientIP.IPv6Prefix < 1 || c.ClientIP.IPv6Prefix > 128 {
		v.fail("client_ip.ipv6_prefix", "must be between 1 and 128")
	}

	seenDomain := map[string]string{}
	for org, o := range c.Orgs {
		if org == "" {
			v.fail("orgs", "an organization name is empty")
		}
		if _, ok := c.Plans[o.Plan]; o.Plan != "" && !ok {
			v.fail("orgs."+org+".plan", "%q is not a plan defined under plans%s", o.Plan, Suggest(o.Plan, slices.Sorted(maps.Keys(c.Plans))))
		}
		for _, d := range o.Domains {
			if other, ok := seenDomain[d]; ok && other != org {
				v.fail("orgs."+org, "domain %q also belongs to %s", d, other)
			}
			seenDomain[d] = org
		}
	}

	for name, l := range c.Limits {
		v.limit("limits."+name, name, l, false)
	}
	base := map[string]LimitSpec{}
	for _, s := range c.ResolvedLimits() {
		base[s.Name] = s
	}
	for plan, overrides := range c.Plans {
		if !limitName.MatchString(plan) {
			v.fail("plans."+plan, "the name must be lower_snake_case")
		}
		for name, l := range overrides {
			key := "plans." + plan + "." + name
			b, ok := base[name]
			if !ok {
				v.fail(key, "%q is not a defined limit: a plan only changes existing limits%s", name, Suggest(name, slices.Sorted(maps.Keys(base))))
				continue
			}
			if l.By != "" && l.By != b.By {
				v.fail(key+".by", "a plan cannot change what %s counts by (%s)", name, b.By)
			}
			if l.Unit != "" && l.Unit != b.Unit {
				v.fail(key+".unit", "a plan cannot change what %s counts (%s)", name, b.Unit)
			}
			v.limit(key, name, Limit{Limit: l.Limit, Window: l.Window, By: b.By, Algorithm: l.Algorithm, Mode: l.Mode, Reserve: l.Reserve, ReserveTTL: l.ReserveTTL, EstimateMax: l.EstimateMax, History: l.History, Cutoff: l.Cutoff, Thresholds: l.Thresholds, Forecast: l.Forecast, Events: l.Events}, true)
		}
	}
	v.tokensLimits(c)
	v.holdLimits(c)
	v.cutoffLimits(c)
	v.exactLimits(c)
	for i, r := range c.Routes {
		if r.Limits == nil {
			continue
		}
		seen := map[string]bool{}
		for j, name := range *r.Limits {
			key := indexKey(indexKey("routes", i)+".limits", j)
			if _, ok := base[name]; !ok {
				v.fail(key, "%q is not a defined limit%s", name, Suggest(name, slices.Sorted(maps.Keys(base))))
			}
			if seen[name] {
				v.fail(key, "%q is listed twice: it would be counted twice", name)
			}
			seen[name] = true
		}
	}
}

// limit checks one limit definition. Fields may be omitted for built-in limits and in plans
// (partial), where they keep the base values.
func (v *validator) limit(key, name string, l Limit, partial bool) {
	if !limitName.MatchString(name) {
		v.fail(key, "the name must be lower_snake_case (it becomes a metric label and part of Redis keys)")
	}
	optional := partial || slices.ContainsFunc(BuiltinLimits(), func(s LimitSpec) bool { return s.Name == name })
	if l.Limit == nil && !optional {
		v.fail(key+".limit", "is required")
	} else if l.Limit != nil && *l.Limit < 0 {
		v.fail(key+".limit", "must not be negative (0 disables the limit)")
	}
	if l.Window == "" && !optional && l.Unit != "streams" {
		v.fail(key+".window", "is required: hour, day, month or a duration such as 15m")
	} else if l.Window != "" {
		if _, err := limits.ParseWindow(l.Window); err != nil {
			v.fail(key+".window", "%q is not hour, day, month or a whole-second duration such as 15m", l.Window)
		}
	}
	switch l.By {
	case "project", "key", "org", "ip":
	case "":
		if !optional {
			v.fail(key+".by", "is required: project, key, org or ip")
		}
	default:
		v.fail(key+".by", "%q is not project, key, org or ip", l.By)
	}
	if _, err := limits.ParseAlgorithm(l.Algorithm); err != nil {
		v.fail(key+".algorithm", "%q is not fixed or gcra", l.Algorithm)
	}
	if l.History != nil && (*l.History < 0 || *l.History > limits.MaxHistory) {
		v.fail(key+".history", "%d is not a number of windows from 0 to %d", *l.History, limits.MaxHistory)
	} else if l.History != nil && *l.History > 0 && l.Algorithm == "gcra" {
		v.fail(key+".history", "a gcra limit has no windows to keep (history counts fixed windows)")
	}
	switch l.Mode {
	case "", "enforce", "shadow":
	default:
		v.fail(key+".mode", "%q is not enforce or shadow", l.Mode)
	}
	switch l.Unit {
	case "", "requests":
	case "tokens", "streams": // checked once resolved (tokensLimits, holdLimits)
	default:
		v.fail(key+".unit", "%q is not requests, tokens or streams", l.Unit)
	}
	if l.Reserve != nil && *l.Reserve < 0 {
		v.fail(key+".reserve", "must not be negative (0 holds nothing)")
	}
	if l.EstimateMax != nil && (*l.EstimateMax < 0 || *l.EstimateMax > limits.MaxLimit) {
		v.fail(key+".estimate_max", "%d is not a number of tokens from 0 to %d", *l.EstimateMax, int64(limits.MaxLimit))
	}
	if l.ReserveTTL < 0 || l.ReserveTTL > 0 && l.ReserveTTL < time.Second {
		v.fail(key+".reserve_ttl", "%s: must be at least 1s (0 is 10m)", l.ReserveTTL)
	}
}

// exactLimits refuses, as resolved (defaults and every plan), limits a store cannot count
// exactly (limits.CheckLimit): above 2^53 − 1, or GCRA limits of more than one unit per
// microsecond. A plan's problem is reported under the plan's entry.
func (v *validator) exactLimits(c *Config) {
	check := func(key func(name string) string, specs []LimitSpec) {
		for _, s := range specs {
			w, err1 := limits.ParseWindow(s.Window)
			a, err2 := limits.ParseAlgorithm(s.Algorithm)
			if s.Unit == "streams" {
				err1 = nil // no window (holdLimits)
			}
			if err1 != nil || err2 != nil {
				continue // reported by limit
			}
			if err := limits.CheckLimit(s.Limit, w, a); err != nil {
				v.fail(key(s.Name), "%v", err)
			}
		}
	}
	base := c.ResolvedLimits()
	check(func(name string) string { return "limits." + name + ".limit" }, base)
	for plan, overrides := range c.Plans {
		var specs []LimitSpec
		for _, s := range c.PlanLimits(plan) {
			if _, ok := overrides[s.Name]; ok { // the others are the defaults, checked above
				specs = append(specs, s)
			}
		}
		check(func(name string) string {
			if overrides[name].Limit != nil {
				return "plans." + plan + "." + name + ".limit"
			}
			return "plans." + plan + "." + name
		}, specs)
	}
}

// tokensLimits checks tokens limits as resolved, defaults and every plan: they count in fixed
// windows (a debit adds to the current window), and by org, key or ip, the tenants of the
// assistant routes whose answers carry a token usage (a project is an agent job's, whose
// answer carries none). Only they take estimate_max.
func (v *validator) tokensLimits(c *Config) {
	check := func(prefix string, specs []LimitSpec, set func(name string) bool) {
		for _, s := range specs {
			if s.Unit != "tokens" {
				if set(s.Name) {
					v.fail(prefix+s.Name+".estimate_max", "only a tokens limit charges an estimate")
				}
				continue
			}
			if s.Algorithm != "" && s.Algorithm != "fixed" {
				v.fail(prefix+s.Name+".algorithm", "a tokens limit counts in fixed windows (algorithm: fixed)")
			}
			if s.By != "org" && s.By != "key" && s.By != "ip" {
				v.fail(prefix+s.Name+".by", "a tokens limit counts by org, key or ip, not %s", s.By)
			}
		}
	}
	check("limits.", c.ResolvedLimits(), func(name string) bool { return c.Limits[name].EstimateMax != nil })
	for plan := range c.Plans {
		check("plans."+plan+".", c.PlanLimits(plan), func(name string) bool { return c.Plans[plan][name].EstimateMax != nil })
	}
}

// holdLimits checks, as resolved (defaults and every plan), what holds need: a reserve only
// on a tokens limit, and no larger than the limit (it would never admit); a reserve_ttl only
// where something is held; a streams limit without window (it counts answers in flight, not
// per window) and without algorithm.
func (v *validator) holdLimits(c *Config) {
	check := func(prefix string, specs []LimitSpec) {
		for _, s := range specs {
			key := prefix + s.Name
			if s.Reserve > 0 && s.Unit != "tokens" {
				v.fail(key+".reserve", "only a tokens limit holds a reserve")
			}
			if s.Unit == "tokens" && s.Limit > 0 && s.Reserve > s.Limit {
				v.fail(key+".reserve", "%d is more than the limit (%d): nothing would be admitted", s.Reserve, s.Limit)
			}
			if s.ReserveTTL != 0 && s.Unit != "streams" && (s.Unit != "tokens" || s.Reserve == 0) {
				v.fail(key+".reserve_ttl", "only a tokens limit with a reserve or a streams limit holds anything to expire")
			}
			if s.Unit != "streams" {
				continue
			}
			if s.Window != "" {
				v.fail(key+".window", "a streams limit counts answers in flight and has no window")
			}
			if s.Algorithm != "" && s.Algorithm != "fixed" {
				v.fail(key+".algorithm", "a streams limit has no algorithm")
			}
		}
	}
	check("limits.", c.ResolvedLimits())
	for plan := range c.Plans {
		check("plans."+plan+".", c.PlanLimits(plan))
	}
}

// cutoffLimits checks, as resolved (defaults and every plan), what cutoff needs: a tokens
// limit (only tokens run out in the middle of an answer), with a reserve (the hold that grows
// with the answer's running count), enforced (a shadow limit never ends anything). A plan's
// problem is reported under the plan's entry.
func (v *validator) cutoffLimits(c *Config) {
	check := func(prefix string, specs []LimitSpec, own func(name string) bool) {
		for _, s := range specs {
			if !s.Cutoff || !own(s.Name) {
				continue
			}
			key := prefix + s.Name + ".cutoff"
			switch {
			case s.Unit != "tokens":
				v.fail(key, "only a tokens limit ends an answer in flight (%s counts %s)", s.Name, s.Unit)
			case s.Reserve <= 0:
				v.fail(key, "needs a reserve: an answer's hold grows with its tokens from the reserve on")
			case s.Shadow:
				v.fail(key, "a shadow limit never ends an answer: set cutoff: false where mode is shadow")
			}
		}
	}
	check("limits.", c.ResolvedLimits(), func(string) bool { return true })
	for plan, overrides := range c.Plans {
		// The plan's own entries: the others are the defaults, checked above.
		check("plans."+plan+".", c.PlanLimits(plan), func(name string) bool { _, ok := overrides[name]; return ok })
	}
}
