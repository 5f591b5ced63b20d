package engine

import (
	"container/heap"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/docsgate/gateway/limits"
	"github.com/docsgate/gateway/policy"
)

// Top answers, for the limit named (or every enabled limit when name is ""), the n tenants
// with the highest use in the current window, highest fraction first. It reads the store with
// Scan: the cost falls on this call, none on the request path. A tenant's limit is its plan's.
func (e *Engine) Top(ctx context.Context, name string, n int) ([]limits.TopList, error) {
	p := e.pol.Load()
	names := p.EnabledLimits()
	if name != "" {
		if !slices.Contains(names, name) {
			return nil, fmt.Errorf("engine: top: %w: %q", limits.ErrUnknownLimit, name)
		}
		names = []string{name}
	}
	out := make([]limits.TopList, 0, len(names))
	for _, nm := range names {
		l, err := e.top(ctx, p, nm, n)
		if err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, nil
}

// tenant is what the usage views show about the owner of an id.
type tenant struct {
	plan, label, org string
}

// tenantOf finds the plan (and, for keys, the label and org) of an id counted by b.
func (e *Engine) tenantOf(ctx context.Context, p *policy.Policy, b policy.By, id string) tenant {
	switch b {
	case policy.ByOrg:
		return tenant{plan: p.PlanOf(id)}
	case policy.ByKey:
		k, _, ok, err := e.key(ctx, id) // the lineage's newest key
		if err != nil || !ok {
			return tenant{}
		}
		plan := k.Plan
		if plan == "" {
			plan = p.PlanOf(k.Org)
		}
		return tenant{plan: plan, label: k.Label, org: k.Org}
	}
	return tenant{} // projects and IPs belong to no single tenant: the default limits
}

func (e *Engine) top(ctx context.Context, p *policy.Policy, name string, n int) (limits.TopList, error) {
	// The limit as each plan applies it ("" first: the defaults). Plans may change the
	// window or algorithm, and with them the keys counted: each variant is scanned once.
	pl := p.PlanLimits(name)
	var variants []*limits.Rule
	for _, r := range pl.Rules() {
		if !slices.ContainsFunc(variants, func(v *limits.Rule) bool {
			return v.Window == r.Window && v.Algorithm == r.Algorithm
		}) {
			variants = append(variants, r)
		}
	}
	b := pl.By
	list := limits.TopList{Limit: name, Window: variants[0].Window.String(), Unit: variants[0].Unit.String(), By: b.String()}
	if variants[0].Unit == limits.Streams {
		list.Window = "" // answers in flight, in no window
	}
	list.Mode = modeOf(pl.ByPlan)
	list.Refused = e.refusals.read(name, time.Now())
	// A plan without this limit enabled (or unknown to the config by now) means the defaults.
	ruleFor := func(t tenant) *limits.Rule { return pl.RuleFor(t.plan) }
	best := &topHeap{}
	for _, v := range variants {
		err := e.o.Limiter.Scan(ctx, v,
			func(id string) *limits.Rule { return ruleFor(e.tenantOf(ctx, p, b, id)) },
			func(id string, u limits.Usage) {
				te := topEntry{id: id, u: u, fraction: fraction(u)}
				if best.Len() < n {
					heap.Push(best, te)
				} else if te.before(best.items[0]) {
					best.items[0] = te
					heap.Fix(best, 0)
				}
			})
		if err != nil {
			return limits.TopList{}, fmt.Errorf("engine: top %s: %w", name, err)
		}
	}
	list.Tenants = make([]limits.TopTenant, best.Len())
	for i := len(list.Tenants) - 1; i >= 0; i-- {
		te := heap.Pop(best).(topEntry)
		t := e.tenantOf(ctx, p, b, te.id)
		list.Tenants[i] = limits.TopTenant{
			ID: te.id, Label: t.label, Org: t.org, Plan: t.plan,
			Used: te.u.Used, Limit: te.u.Limit, Remaining: te.u.Remaining, Fraction: te.fraction, Reset: te.u.Reset,
			Granted: te.u.Granted, Override: te.u.Override, Reserved: te.u.Reserved, Reserves: te.u.Reserves,
		}
		if r := ruleFor(t); r != nil {
			list.Tenants[i].Shadow = r.Shadow
		}
	}
	if variants[0].Algorithm == limits.Fixed {
		list.History = variants[0].History
	}
	return list, nil
}

// modeOf is a limit's mode over the plans that enable it: "enforce", "shadow" or "mixed".
func modeOf(byPlan map[string]policy.Limit) string {
	shadow, enforced := false, false
	for _, l := range byPlan {
		shadow = shadow || l.Shadow
		enforced = enforced || !l.Shadow
	}
	switch {
	case shadow && enforced:
		return "mixed"
	case shadow:
		return "shadow"
	}
	return "enforce"
}

// fraction is how much of its allowance a tenant used; a tenant whose override of 0
// refuses everything is at its limit.
func fraction(u limits.Usage) float64 {
	if u.Limit <= 0 {
		return 1
	}
	return float64(u.Used) / float64(u.Limit)
}

type topEntry struct {
	id       string
	u        limits.Usage
	fraction float64
}

// before orders the listing: highest fraction first, then most used, then by id.
func (a topEntry) before(b topEntry) bool {
	if a.fraction != b.fraction {
		return a.fraction > b.fraction
	}
	if a.u.Used != b.u.Used {
		return a.u.Used > b.u.Used
	}
	return a.id < b.id
}

// topHeap keeps the n best entries with the worst of them on top.
type topHeap struct{ items []topEntry }

func (h *topHeap) Len() int           { return len(h.items) }
func (h *topHeap) Less(i, j int) bool { return h.items[j].before(h.items[i]) }
func (h *topHeap) Swap(i, j int)      { h.items[i], h.items[j] = h.items[j], h.items[i] }
func (h *topHeap) Push(x any)         { h.items = append(h.items, x.(topEntry)) }
func (h *topHeap) Pop() any {
	e := h.items[len(h.items)-1]
	h.items = h.items[:len(h.items)-1]
	return e
}
