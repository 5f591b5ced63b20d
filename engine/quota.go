package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/docsgate/gateway/limits"
	"github.com/docsgate/gateway/policy"
)

// The gateway's side of run-time quotas (see limits/quota.go): it knows the limits, what
// each counts by and which plan a tenant is on, so it checks a limit's name and a tenant's
// id before any store sees them, and picks the rule that applies to the tenant (its plan's
// window and algorithm). Its methods serve the admin listener's /quota endpoints.

// quotaRule resolves a quota action's limit and id: the rule that applies to the tenant and
// the id as the limit counts it (an IPv6 address becomes its prefix, a digest lower case).
// An unknown or disabled limit wraps limits.ErrUnknownLimit; a bad id is a
// *limits.InvalidError of field "id".
func (e *Engine) quotaRule(ctx context.Context, name, id string) (*limits.Rule, string, error) {
	p := e.pol.Load()
	if !slices.Contains(p.EnabledLimits(), name) {
		return nil, "", fmt.Errorf("engine: quota: %w: %q", limits.ErrUnknownLimit, name)
	}
	b := p.LimitBy(name)
	id, err := p.QuotaID(b, id)
	if err != nil {
		return nil, "", err
	}
	if b == policy.ByKey {
		// A rotated key's quota is its lineage's: the counter its requests count in.
		if _, id, _, err = e.key(ctx, id); err != nil {
			return nil, "", fmt.Errorf("engine: quota: %w", err)
		}
	}
	t := e.tenantOf(ctx, p, b, id)
	for _, l := range p.LimitsOfPlan(t.plan) {
		if l.Rule.Name == name {
			return l.Rule, id, nil
		}
	}
	return nil, "", fmt.Errorf("engine: quota: %w: %q is disabled for this tenant's plan %q", limits.ErrUnknownLimit, name, t.plan)
}

// quotaTarget is the store and the tenant's rule and id of a quota action.
func (e *Engine) quotaTarget(ctx context.Context, limit, id string) (limits.QuotaStore, *limits.Rule, string, error) {
	if e.o.Quotas == nil {
		return nil, nil, "", errNoQuotas
	}
	r, id, err := e.quotaRule(ctx, limit, id)
	return e.o.Quotas, r, id, err
}

var errNoQuotas = errors.New("engine: quota: no store for run-time quotas")

// Grant adds amount to the tenant's allowance of limit for its current window.
func (e *Engine) Grant(ctx context.Context, limit, id string, amount int64, who limits.Who) (limits.Grant, limits.AuditEntry, error) {
	q, r, id, err := e.quotaTarget(ctx, limit, id)
	if err != nil {
		return limits.Grant{}, limits.AuditEntry{}, err
	}
	return q.Grant(ctx, r, id, amount, who)
}

// SetOverride makes value the tenant's limit until expires.
func (e *Engine) SetOverride(ctx context.Context, limit, id string, value int64, expires time.Time, who limits.Who) (limits.Override, limits.AuditEntry, error) {
	q, r, id, err := e.quotaTarget(ctx, limit, id)
	if err != nil {
		return limits.Override{}, limits.AuditEntry{}, err
	}
	return q.SetOverride(ctx, r, id, value, expires, who)
}

// EndOverride ends the tenant's override early (limits.ErrNoOverride when it has none).
func (e *Engine) EndOverride(ctx context.Context, limit, id string, who limits.Who) (limits.AuditEntry, error) {
	q, r, id, err := e.quotaTarget(ctx, limit, id)
	if err != nil {
		return limits.AuditEntry{}, err
	}
	return q.EndOverride(ctx, r, id, who)
}

// Reset empties the tenant's counter of limit for the current window.
func (e *Engine) Reset(ctx context.Context, limit, id string, who limits.Who) (limits.AuditEntry, error) {
	q, r, id, err := e.quotaTarget(ctx, limit, id)
	if err != nil {
		return limits.AuditEntry{}, err
	}
	return q.Reset(ctx, r, id, who)
}

// Overrides lists every override in force.
func (e *Engine) Overrides(ctx context.Context) ([]limits.Override, error) {
	if e.o.Quotas == nil {
		return nil, errNoQuotas
	}
	return e.o.Quotas.Overrides(ctx)
}

// Audit returns the newest n entries of the audit trail, newest first.
func (e *Engine) Audit(ctx context.Context, n int) ([]limits.AuditEntry, error) {
	if e.o.Quotas == nil {
		return nil, errNoQuotas
	}
	return e.o.Quotas.Audit(ctx, n)
}
