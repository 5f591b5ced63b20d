package proxy

import (
	"context"
	"fmt"
	"net/netip"

	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/limits"
)

// Usage reads, without consuming anything, every enabled limit that counts by what
// (project, org, ip or key) for subject: a project id, an org (or unmapped domain), an IP
// address, or an API key (used only to compute its digest, never kept). An org's limits are
// those of its plan; a key's those of its own plan or its org's (registry mode). Projects and
// IPs are read with the default limits: they belong to no single tenant.
func (g *Gateway) Usage(ctx context.Context, what, subject string) ([]limits.Usage, error) {
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
	out := []limits.Usage{}
	for _, l := range sn.limitsOfPlan(plan) {
		if l.by != b {
			continue
		}
		u, err := g.limiter.Usage(ctx, l.rule, id)
		if err != nil {
			return nil, fmt.Errorf("proxy: usage of %s: %w", l.rule.Name, err)
		}
		out = append(out, u)
	}
	return out, nil
}
