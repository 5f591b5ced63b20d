package proxy

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/limits"
)

// Usage reads, without consuming anything, every enabled limit that counts by what
// (project, org, ip or key) for subject: a project id, an org (or unmapped domain), an IP
// address, or an API key (used only to compute its digest, never kept). An org's limits are
// those of its plan; a key's those of its own plan or its org's (registry mode). Projects and
// IPs are read with the default limits: they belong to no single tenant. All of them are read
// in one store call.
func (g *Gateway) Usage(ctx context.Context, what, subject string) ([]limits.Usage, error) {
	hits, err := g.usageHits(ctx, what, subject)
	if err != nil {
		return nil, err
	}
	return g.readUsages(ctx, hits)
}

// UsageViews is Usage as the admin listener's /usage answers show it: the same views as the
// tenants' own GET /gateway/usage, shadow limits included.
func (g *Gateway) UsageViews(ctx context.Context, what, subject string) ([]limits.View, error) {
	hits, err := g.usageHits(ctx, what, subject)
	if err != nil {
		return nil, err
	}
	return g.views(ctx, hits)
}

// readUsages reads hits in one store call.
func (g *Gateway) readUsages(ctx context.Context, hits []limits.Hit) ([]limits.Usage, error) {
	if len(hits) == 0 {
		return []limits.Usage{}, nil
	}
	us, err := g.limiter.Usages(ctx, hits)
	if err != nil {
		return nil, fmt.Errorf("proxy: usage: %w", err)
	}
	return us, nil
}

// views reads hits in one store call and shows them; the one place both usage answers, the
// tenants' and the operators', are made.
func (g *Gateway) views(ctx context.Context, hits []limits.Hit) ([]limits.View, error) {
	us, err := g.readUsages(ctx, hits)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	out := make([]limits.View, len(us))
	for i := range us {
		out[i] = limits.NewView(hits[i].Rule, us[i], now)
	}
	return out, nil
}

// usageHits are the counters Usage reads.
func (g *Gateway) usageHits(ctx context.Context, what, subject string) ([]limits.Hit, error) {
	sn := g.snap.Load()
	b, ok := parseBy(what)
	if !ok {
		return nil, fmt.Errorf("proxy: usage: unknown subject kind %q", what)
	}
	var id, plan string
	switch b {
	case byProject:
		id = safeID(subject)
	case byOrg:
		id = subject
		if _, configured := sn.orgMetrics[subject]; !configured || subject == otherOrg {
			id = safeID(subject)
		}
		plan = sn.orgPlan[subject]
	case byIP:
		a, err := netip.ParseAddr(subject)
		if err != nil {
			return nil, fmt.Errorf("proxy: usage: %q is not an IP address", subject)
		}
		id = sn.addrID(a.Unmap())
	case byKey:
		id = auth.Digest(subject)
		if g.registry != nil {
			e, ok, err := g.registry.Lookup(ctx, id)
			if err != nil {
				return nil, fmt.Errorf("proxy: usage: key registry: %w", err)
			}
			if ok {
				plan = e.Plan
				if plan == "" {
					plan = sn.orgPlan[e.Org]
				}
			}
		}
	}
	hits := []limits.Hit{}
	for _, l := range sn.limitsOfPlan(plan) {
		if l.by == b {
			hits = append(hits, limits.Hit{Rule: l.rule, ID: id})
		}
	}
	return hits, nil
}
