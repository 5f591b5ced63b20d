package proxy

import (
	"fmt"
	"maps"
	"net/http"
	"slices"

	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/metrics"
)

// snapshot is everything the config decides that a reload may change, compiled once and
// swapped atomically: a request reads the pointer once and sees one consistent config.
type snapshot struct {
	table     *table
	unmatched *route // pseudo-route for requests no route takes
	maxBody   int64
	clientIPs clientIPs
	cors      *cors
	ipv6Bits  int

	limits     map[string][]routeLimit // every enabled limit by plan ("" for the defaults), for usage read-back
	orgOf      map[string]string       // assistant domain -> configured org
	orgPlan    map[string]string       // configured org -> its plan
	orgMetrics map[string]*metrics.Org // configured org (and "other") -> series
	// authFailLimit is auth.failure_limit; 0 when off. The upstream's 401s and 403s count in
	// both modes, the gateway's own 401s in registry mode (see countAuthFailure).
	authFailLimit int
	// selfUsage is the tenants' own usage endpoint; nil when self_usage.enabled is false.
	selfUsage *selfUsage
}

// compile turns a validated config into a snapshot, reporting problems with config keys.
func (g *Gateway) compile(cfg *config.Config) (*snapshot, error) {
	sn := &snapshot{
		maxBody:    cfg.MaxBodyBytes,
		cors:       newCORS(cfg.CORS.AllowedOrigins, cfg.CORS.MaxAge),
		ipv6Bits:   cfg.ClientIP.IPv6Prefix,
		orgOf:      cfg.OrgOf(),
		orgPlan:    map[string]string{},
		orgMetrics: map[string]*metrics.Org{otherOrg: g.metrics.Org(otherOrg)},
		unmatched:  &route{name: unmatchedRoute, metrics: g.metrics.Route(unmatchedRoute)},
	}
	sn.authFailLimit = cfg.Auth.FailureLimit
	for _, p := range cfg.ClientIP.TrustedProxies {
		prefix, err := config.ParsePrefix(p)
		if err != nil {
			return nil, fmt.Errorf("proxy: trusted proxy %q: %w", p, err)
		}
		sn.clientIPs.trusted = append(sn.clientIPs.trusted, prefix)
	}
	for org, o := range cfg.Orgs {
		sn.orgMetrics[org] = g.metrics.Org(org)
		if o.Plan != "" {
			sn.orgPlan[org] = o.Plan
		}
	}

	routes, err := compileRoutes(cfg.Routes)
	if err != nil {
		return nil, err
	}
	for _, rt := range routes {
		rt.metrics = g.metrics.Route(rt.name)
		if rt.stream {
			g.metrics.StreamRoutes(rt.name)
		}
	}
	if sn.limits, err = compileLimits(cfg, routes, g.refusals, g.notify); err != nil {
		return nil, err
	}
	if g.tracing != nil {
		for _, rt := range routes {
			rt.span = rt.spanName()
			for _, set := range rt.sets {
				set.spanAttrs = limitSpanAttrs(set, g.tracing.Store)
			}
		}
	}
	for _, plan := range append([]string{""}, slices.Collect(maps.Keys(cfg.Plans))...) {
		for _, s := range cfg.PlanLimits(plan) {
			if s.Unit == "tokens" && s.Reserve > 0 {
				g.metrics.HoldLimits(s.Name)
			}
		}
	}
	for _, rt := range routes {
		if len(rt.sets[""].limits) > 0 && g.limiter == nil {
			return nil, fmt.Errorf("proxy: route %s applies limits but no limiter is configured", rt.name)
		}
	}
	if sn.selfUsage, err = g.compileSelfUsage(cfg, routes); err != nil {
		return nil, err
	}
	if sn.table, err = g.buildTable(sn, routes); err != nil {
		return nil, err
	}
	g.knownSeries(sn, routes)
	return sn, nil
}

// deprecationHeaders renders a route's Deprecation (RFC 9745), Sunset (RFC 8594) and Link
// headers once.
func deprecationHeaders(d *config.Deprecation) (http.Header, error) {
	if d == nil {
		return nil, nil
	}
	since, err := config.ParseDate(d.Since)
	if err != nil {
		return nil, fmt.Errorf("deprecation.since: %w", err)
	}
	h := http.Header{}
	h.Set("Deprecation", fmt.Sprintf("@%d", since.Unix()))
	if d.Sunset != "" {
		sunset, err := config.ParseDate(d.Sunset)
		if err != nil {
			return nil, fmt.Errorf("deprecation.sunset: %w", err)
		}
		h.Set("Sunset", sunset.UTC().Format(http.TimeFormat))
	}
	if d.Link != "" {
		h.Set("Link", "<"+d.Link+`>; rel="deprecation"`)
	}
	return h, nil
}
