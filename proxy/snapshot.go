package proxy

import (
	"fmt"

	"github.com/docsgate/gateway/clientip"
	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/cors"
	"github.com/docsgate/gateway/metrics"
	"github.com/docsgate/gateway/policy"
)

// snapshot is everything the config decides that a reload may change, compiled once and
// swapped atomically: a request reads the pointer once and sees one consistent config, its
// policy (routes, limits, plans, orgs) and the HTTP pipeline's own settings.
type snapshot struct {
	pol       *policy.Policy
	table     *table
	unmatched *route // pseudo-route for requests no route takes
	maxBody   int64
	clientIPs clientip.Resolver
	cors      *cors.Policy

	orgMetrics map[string]*metrics.Org // configured org (and "other") -> series
	// authFailLimit is auth.failure_limit; 0 when off. The upstream's 401s and 403s count in
	// both modes, the gateway's own 401s in registry mode (see keyCheck.fail).
	authFailLimit int
	// selfUsage is the tenants' own usage endpoint; nil when self_usage.enabled is false.
	selfUsage *selfUsage
}

// compile turns a validated config, and the policy compiled from it, into a snapshot,
// reporting problems with config keys.
func (g *Gateway) compile(cfg *config.Config, pol *policy.Policy) (*snapshot, error) {
	sn := &snapshot{
		pol:        pol,
		maxBody:    cfg.MaxBodyBytes,
		cors:       cors.New(cfg.CORS.AllowedOrigins, cfg.CORS.MaxAge),
		orgMetrics: map[string]*metrics.Org{otherOrg: g.metrics.Org(otherOrg)},
		unmatched:  pseudoRoute(unmatchedRoute, g.metrics),
	}
	sn.authFailLimit = cfg.Auth.FailureLimit
	for _, p := range cfg.ClientIP.TrustedProxies {
		prefix, err := config.ParsePrefix(p)
		if err != nil {
			return nil, fmt.Errorf("proxy: trusted proxy %q: %w", p, err)
		}
		sn.clientIPs.Trusted = append(sn.clientIPs.Trusted, prefix)
	}
	for _, org := range pol.Orgs() {
		sn.orgMetrics[org] = g.metrics.Org(org)
	}
	routes := make([]*route, len(pol.Routes()))
	for i, pr := range pol.Routes() {
		routes[i] = newRoute(pr, g.metrics)
		if pr.Stream {
			g.metrics.StreamRoutes(pr.Name)
		}
	}
	if g.tracing != nil {
		for _, rt := range routes {
			rt.span = rt.spanName()
			for _, set := range rt.sets {
				set.spanAttrs = limitSpanAttrs(set, g.tracing.Store)
			}
		}
	}
	var err error
	if sn.selfUsage, err = compileSelfUsage(cfg, routes, g.metrics, g.keys.registry != nil); err != nil {
		return nil, err
	}
	if sn.table, err = g.buildTable(sn, routes); err != nil {
		return nil, err
	}
	knownSeries(g.metrics, sn, routes, g.keys.registry != nil)
	return sn, nil
}
