package engine

import (
	"context"
	"fmt"
	"net/netip"
	"time"

	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/limits"
	"github.com/docsgate/gateway/policy"
)

// Usage reads, without consuming anything, every enabled limit that counts by what
// (project, org, ip or key) for subject: a project id, an org (or unmapped domain), an IP
// address, or an API key (used only to compute its digest, never kept). An org's limits are
// those of its plan; a key's those of its own plan or its org's (registry mode). Projects and
// IPs are read with the default limits: they belong to no single tenant. All of them are read
// in one store call.
func (e *Engine) Usage(ctx context.Context, what, subject string) ([]limits.Usage, error) {
	hits, err := e.usageHits(ctx, what, subject)
	if err != nil {
		return nil, err
	}
	return e.readUsages(ctx, hits)
}

// UsageViews is Usage as the admin listener's /usage answers show it: the same views as the
// tenants' own GET /gateway/usage, shadow limits included.
func (e *Engine) UsageViews(ctx context.Context, what, subject string) ([]limits.View, error) {
	hits, err := e.usageHits(ctx, what, subject)
	if err != nil {
		return nil, err
	}
	return e.views(ctx, hits)
}

// readUsages reads hits in one store call.
func (e *Engine) readUsages(ctx context.Context, hits []limits.Hit) ([]limits.Usage, error) {
	if len(hits) == 0 {
		return []limits.Usage{}, nil
	}
	us, err := e.o.Limiter.Usages(ctx, hits)
	if err != nil {
		return nil, fmt.Errorf("engine: usage: %w", err)
	}
	return us, nil
}

// views reads hits in one store call and shows them; the one place both usage answers, the
// tenants' and the operators', are made.
func (e *Engine) views(ctx context.Context, hits []limits.Hit) ([]limits.View, error) {
	us, err := e.readUsages(ctx, hits)
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
func (e *Engine) usageHits(ctx context.Context, what, subject string) ([]limits.Hit, error) {
	p := e.pol.Load()
	b, ok := policy.ParseBy(what)
	if !ok {
		return nil, fmt.Errorf("engine: usage: unknown subject kind %q", what)
	}
	var id, plan string
	switch b {
	case policy.ByProject:
		id = policy.SafeID(subject)
	case policy.ByOrg:
		id = subject
		if !p.Configured(subject) {
			id = policy.SafeID(subject)
		}
		plan = p.PlanOf(subject)
	case policy.ByIP:
		a, err := netip.ParseAddr(subject)
		if err != nil {
			return nil, fmt.Errorf("engine: usage: %q is not an IP address", subject)
		}
		id = p.AddrID(a.Unmap())
	case policy.ByKey:
		k, tenant, ok, err := e.key(ctx, auth.Digest(subject))
		if err != nil {
			return nil, fmt.Errorf("engine: usage: %w", err)
		}
		id = tenant // a rotated key's use is its lineage's
		if ok {
			plan = k.Plan
			if plan == "" {
				plan = p.PlanOf(k.Org)
			}
		}
	}
	hits := []limits.Hit{}
	for _, l := range p.LimitsOfPlan(plan) {
		if l.By == b {
			hits = append(hits, limits.Hit{Rule: l.Rule, ID: id})
		}
	}
	return hits, nil
}

// SelfUsage is the tenants' own view of the limits a request like req would be subject to: the
// enforced limits of req.Set that count by what shown holds (shadow limits never refuse, and
// their counters are the operators'), each counting what the request's decision would count,
// read in one store call (none when no limit is shown). The operators' terms of a tenant's
// quota (grants, overrides) stay theirs: the views show the allowance alone.
func (e *Engine) SelfUsage(ctx context.Context, req *Request, shown policy.Bys) ([]limits.View, error) {
	hits := make([]limits.Hit, 0, len(req.Set.Limits))
	for _, l := range req.Set.Limits {
		if !l.Shadow && shown.Has(l.By) {
			hits = append(hits, limits.Hit{Rule: l.Rule, ID: req.id(l.By)})
		}
	}
	views, err := e.views(ctx, hits)
	for i := range views {
		views[i].Granted, views[i].Override = 0, nil
	}
	return views, err
}
