package engine

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/docsgate/gateway/limits"
	"github.com/docsgate/gateway/policy"
)

// The gateway's side of usage history (see limits/history.go): it knows the limits, their
// plans and what each counts by, so it picks the rule that applies to a tenant and the window
// an export asks for, and adds each tenant's plan, label and org. Its methods serve the admin
// listener's /usage/history and /usage/export.

// History answers a tenant's use of limit name in each kept window, newest first, counted in
// unit ("" for the limit's own: another reads what the limit counted before a change of its
// unit). Each window's limit is the tenant's plan's as configured now, and the current
// window has the allowance in force with its grants and override; in another unit than the
// limit's own neither applies (limitInUnit). An unknown limit wraps limits.ErrUnknownLimit, a
// bad id or unit is a *limits.InvalidError of field "id" or "unit", a GCRA limit wraps
// limits.ErrNoHistory.
func (e *Engine) History(ctx context.Context, name, id, unit string) (limits.TenantHistory, error) {
	if e.o.History == nil {
		return limits.TenantHistory{}, fmt.Errorf("engine: history: %w: %q", limits.ErrUnknownLimit, name)
	}
	own, id, err := e.quotaRule(ctx, name, id)
	if err != nil {
		return limits.TenantHistory{}, err
	}
	rule, err := inUnit(own, unit)
	if err != nil {
		return limits.TenantHistory{}, err
	}
	ws, err := e.o.History.History(ctx, rule, id)
	if err != nil {
		return limits.TenantHistory{}, fmt.Errorf("engine: history: %w", err)
	}
	for i := range ws {
		ws[i].Limit = limitInUnit(own, rule.Unit)
		if rule != own { // no allowance of this unit is in force
			ws[i].Current, ws[i].Allowance, ws[i].Granted, ws[i].Override = false, 0, 0, nil
		}
	}
	return limits.TenantHistory{Limit: name, ID: id, Unit: rule.Unit.String(), Windows: ws}, nil
}

// limitInUnit is the limit that bounds counts of unit under r, the rule in force: r's limit
// when r counts that unit, else 0 (a limit of another unit bounds no such count). History and
// export report it alike.
func limitInUnit(r *limits.Rule, unit limits.Unit) int64 {
	if r == nil || r.Unit != unit {
		return 0
	}
	return r.Limit
}

// Export answers every tenant with use of limit name in one window, counted in unit (as
// History): window is "current", "previous" or a window's start in RFC 3339. The window is the
// limit's as its default limits count it. Every tenant that used the limit is listed, whatever
// its plan: a tenant whose plan counts in other windows (or that counted in other windows
// before a change of the limit's window) is listed with what it counted in the windows that
// began in this one. Besides History's errors: a window that is no window start is a
// *limits.InvalidError of field "window", one that is not kept (or not begun) wraps
// limits.ErrUnknownWindow.
//
// The store is read whole before Export returns (so a failing store is an error, not a cut
// answer) and sorts the tenants by id where it keeps them (limits.Tenants); plans, labels and
// orgs are looked up as the rows are yielded.
func (e *Engine) Export(ctx context.Context, name, window, unit string) (limits.Export, error) {
	p := e.pol.Load()
	if e.o.History == nil || !slices.Contains(p.EnabledLimits(), name) {
		return limits.Export{}, fmt.Errorf("engine: export: %w: %q", limits.ErrUnknownLimit, name)
	}
	pl := p.PlanLimits(name)
	ref, err := inUnit(pl.Reference(), unit)
	if err != nil {
		return limits.Export{}, err
	}
	if ref.Algorithm != limits.Fixed {
		return limits.Export{}, fmt.Errorf("engine: export %s: %w", name, limits.ErrNoHistory)
	}
	start, err := e.exportWindow(ctx, pl, ref, window)
	if err != nil {
		return limits.Export{}, err
	}
	ts, err := e.o.History.ExportSorted(ctx, ref, start, func(string) bool { return true })
	if err != nil {
		return limits.Export{}, fmt.Errorf("engine: export %s: %w", name, err)
	}
	return limits.Export{
		Limit: name, Unit: ref.Unit.String(), Tenants: ts.Len(),
		Start: time.Unix(start, 0).UTC(), End: time.Unix(ref.Window.Shift(start, 1), 0).UTC(),
		Close: func() error { return ts.Close(ctx) }, // a cancelled ctx does not stop it
		Rows:  e.exportRows(ctx, p, pl, ref, ts),
	}, nil
}

// exportWindow is the start of the window an export of pl (counted as ref) names, one that
// some plan keeps.
func (e *Engine) exportWindow(ctx context.Context, pl policy.PlanLimits, ref *limits.Rule, window string) (int64, error) {
	start, back, err := exportStart(ref.Window, window)
	if err != nil { // before the store is asked: a bad window is refused even with it down
		return 0, err
	}
	now, err := e.o.History.Clock(ctx)
	if err != nil {
		return 0, fmt.Errorf("engine: export: %w", err)
	}
	cur, _ := ref.Window.Bounds(now)
	if back >= 0 {
		start = ref.Window.Shift(cur.Unix(), -back)
	}
	// A window is kept when some plan keeps a window that begins in it.
	kept := func(r *limits.Rule) bool {
		if r == nil || r.Algorithm != limits.Fixed {
			return false
		}
		rCur, _ := r.Window.Bounds(now)
		oldest := r.Window.Shift(rCur.Unix(), -r.History)
		return start <= cur.Unix() && ref.Window.Shift(start, 1) > oldest
	}
	if !slices.ContainsFunc(pl.Rules(), kept) {
		return 0, fmt.Errorf("engine: export %s: %w: %s", pl.Name, limits.ErrUnknownWindow, window)
	}
	return start, nil
}

// exportRows yields the tenants of ts, each with its plan, label and org, looked up as the rows
// are yielded, and its limit when it counts in ref's unit.
func (e *Engine) exportRows(ctx context.Context, p *policy.Policy, pl policy.PlanLimits, ref *limits.Rule, ts limits.Tenants) func(yield func(limits.ExportRow, error) bool) {
	return func(yield func(limits.ExportRow, error) bool) {
		for {
			id, used, ok, err := ts.Next(ctx)
			if err != nil {
				yield(limits.ExportRow{}, fmt.Errorf("engine: export %s: %w", pl.Name, err))
				return
			}
			if !ok {
				return
			}
			t := e.tenantOf(ctx, p, pl.By, id)
			row := limits.ExportRow{ID: id, Used: used, Plan: t.plan, Label: t.label, Org: t.org, Limit: limitInUnit(pl.RuleFor(t.plan), ref.Unit)}
			if !yield(row, nil) {
				return
			}
		}
	}
}

// inUnit is r counting in unit ("" or r's own: r itself), to read the counters a limit kept
// before a change of its unit; unit names requests or tokens.
func inUnit(r *limits.Rule, unit string) (*limits.Rule, error) {
	if unit == "" || unit == r.Unit.String() {
		return r, nil
	}
	c := *r
	switch unit {
	case "requests":
		c.Unit, c.Reserve, c.ReserveTTL, c.EstimateMax = limits.Requests, 0, 0, 0
	case "tokens":
		c.Unit, c.Algorithm = limits.Tokens, limits.Fixed
	default:
		return nil, &limits.InvalidError{Field: "unit", Reason: "must be requests or tokens (the units counted in windows)"}
	}
	return &c, nil
}

// exportStart reads an export's window: a window start in RFC 3339 (back -1), or "current"
// (back 0) and "previous" (back 1), windows counted back from the current one.
func exportStart(w limits.Window, window string) (start int64, back int, err error) {
	switch window {
	case "current":
		return 0, 0, nil
	case "previous":
		return 0, 1, nil
	case "":
		return 0, 0, &limits.InvalidError{Field: "window", Reason: "is required: current, previous or a window's start in RFC 3339 (e.g. 2026-11-01T00:00:00Z)"}
	}
	t, err := time.Parse(time.RFC3339, window)
	if err != nil {
		return 0, 0, &limits.InvalidError{Field: "window", Reason: "not current, previous or a time in RFC 3339 (e.g. 2026-11-01T00:00:00Z)"}
	}
	if t.Nanosecond() != 0 || !w.IsStart(t.Unix()) {
		return 0, 0, &limits.InvalidError{Field: "window", Reason: "not the start of a window of this limit (" + w.String() + ", in UTC)"}
	}
	return t.Unix(), -1, nil
}
