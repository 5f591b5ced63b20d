package proxy

import (
	"container/heap"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/docsgate/gateway/limits"
)

// Top answers, for the limit named (or every enabled limit when name is ""), the n tenants
// with the highest use in the current window, highest fraction first. It reads the store with
// Scan: the cost falls on this call, none on the request path. A tenant's limit is its plan's.
func (g *Gateway) Top(ctx context.Context, name string, n int) ([]limits.TopList, error) {
	sn := g.snap.Load()
	names := sn.enabledLimits()
	if name != "" {
		if !slices.Contains(names, name) {
			return nil, fmt.Errorf("proxy: top: %w: %q", limits.ErrUnknownLimit, name)
		}
		names = []string{name}
	}
	out := make([]limits.TopList, 0, len(names))
	for _, nm := range names {
		l, err := g.top(ctx, sn, nm, n)
		if err != nil {
			return nil, err
		}
		out = append(out, l)
	}
	return out, nil
}

// enabledLimits lists, sorted, the names of the limits enabled by default or in some plan.
func (sn *snapshot) enabledLimits() []string {
	var names []string
	for _, ls := range sn.limits {
		for _, l := range ls {
			if !slices.Contains(names, l.rule.Name) {
				names = append(names, l.rule.Name)
			}
		}
	}
	slices.Sort(names)
	return names
}

// tenant is what the usage views show about the owner of an id.
type tenant struct {
	plan, label, org string
}

// tenantOf finds the plan (and, for keys, the label and org) of an id counted by b.
func (g *Gateway) tenantOf(ctx context.Context, sn *snapshot, b by, id string) tenant {
	switch b {
	case byOrg:
		return tenant{plan: sn.orgPlan[id]}
	case byKey:
		if g.registry == nil {
			return tenant{}
		}
		e, ok, err := g.registry.Lookup(ctx, id)
		if err != nil || !ok {
			return tenant{}
		}
		plan := e.Plan
		if plan == "" {
			plan = sn.orgPlan[e.Org]
		}
		return tenant{plan: plan, label: e.Label, org: e.Org}
	}
	return tenant{} // projects and IPs belong to no single tenant: the default limits
}

func (g *Gateway) top(ctx context.Context, sn *snapshot, name string, n int) (limits.TopList, error) {
	// The limit as each plan applies it ("" first: the defaults). Plans may change the
	// window or algorithm, and with them the keys counted: each variant is scanned once.
	plans := make([]string, 0, len(sn.limits))
	for p := range sn.limits {
		plans = append(plans, p)
	}
	slices.Sort(plans) // "" sorts first
	byPlan := map[string]routeLimit{}
	var variants []*limits.Rule
	for _, p := range plans {
		for _, l := range sn.limits[p] {
			if l.rule.Name != name {
				continue
			}
			byPlan[p] = l
			if !slices.ContainsFunc(variants, func(v *limits.Rule) bool {
				return v.Window == l.rule.Window && v.Algorithm == l.rule.Algorithm
			}) {
				variants = append(variants, l.rule)
			}
		}
	}
	var b by
	for _, l := range byPlan {
		b = l.by
		break
	}
	list := limits.TopList{Limit: name, Window: variants[0].Window.String(), Unit: variants[0].Unit.String(), By: b.String()}
	if variants[0].Unit == limits.Streams {
		list.Window = "" // answers in flight, in no window
	}
	list.Mode = modeOf(byPlan)
	list.Refused = g.refusals.read(name, time.Now())
	// A plan without this limit enabled (or unknown to the config by now) means the defaults.
	ruleFor := func(t tenant) *limits.Rule {
		if l, ok := byPlan[t.plan]; ok {
			return l.rule
		}
		if _, ok := sn.limits[t.plan]; ok {
			return nil // the tenant's plan disables this limit
		}
		if l, ok := byPlan[""]; ok {
			return l.rule
		}
		return nil
	}
	best := &topHeap{}
	for _, v := range variants {
		err := g.limiter.Scan(ctx, v,
			func(id string) *limits.Rule { return ruleFor(g.tenantOf(ctx, sn, b, id)) },
			func(id string, u limits.Usage) {
				e := topEntry{id: id, u: u, fraction: fraction(u)}
				if best.Len() < n {
					heap.Push(best, e)
				} else if e.before(best.items[0]) {
					best.items[0] = e
					heap.Fix(best, 0)
				}
			})
		if err != nil {
			return limits.TopList{}, fmt.Errorf("proxy: top %s: %w", name, err)
		}
	}
	list.Tenants = make([]limits.TopTenant, best.Len())
	for i := len(list.Tenants) - 1; i >= 0; i-- {
		e := heap.Pop(best).(topEntry)
		t := g.tenantOf(ctx, sn, b, e.id)
		list.Tenants[i] = limits.TopTenant{
			ID: e.id, Label: t.label, Org: t.org, Plan: t.plan,
			Used: e.u.Used, Limit: e.u.Limit, Remaining: e.u.Remaining, Fraction: e.fraction, Reset: e.u.Reset,
			Granted: e.u.Granted, Override: e.u.Override, Reserved: e.u.Reserved, Reserves: e.u.Reserves,
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
func modeOf(byPlan map[string]routeLimit) string {
	shadow, enforced := false, false
	for _, l := range byPlan {
		shadow = shadow || l.shadow
		enforced = enforced || !l.shadow
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
