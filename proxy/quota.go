package proxy

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/docsgate/gateway/limits"
)

// The gateway's side of run-time quotas (see limits/quota.go): it knows the limits, what
// each counts by and which plan a tenant is on, so it checks a limit's name and a tenant's
// id before any store sees them, and picks the rule that applies to the tenant (its plan's
// window and algorithm). Its methods serve the admin listener's /quota endpoints.

// QuotaIDMax bounds an id of a quota action: the longest id the limits count by (a
// project id or an org, 128 characters; a digest is 64, an IPv6 prefix shorter).
const QuotaIDMax = 128

// quotaRule resolves a quota action's limit and id: the rule that applies to the tenant and
// the id as the limit counts it (an IPv6 address becomes its prefix, a digest lower case).
// An unknown or disabled limit wraps limits.ErrUnknownLimit; a bad id is a
// *limits.InvalidError of field "id".
func (g *Gateway) quotaRule(ctx context.Context, name, id string) (*limits.Rule, string, error) {
	sn := g.snap.Load()
	if !slices.Contains(sn.enabledLimits(), name) {
		return nil, "", fmt.Errorf("proxy: quota: %w: %q", limits.ErrUnknownLimit, name)
	}
	b := sn.limitBy(name)
	id, err := sn.quotaID(b, id)
	if err != nil {
		return nil, "", err
	}
	t := g.tenantOf(ctx, sn, b, id)
	for _, l := range sn.limitsOfPlan(t.plan) {
		if l.rule.Name == name {
			return l.rule, id, nil
		}
	}
	return nil, "", fmt.Errorf("proxy: quota: %w: %q is disabled for this tenant's plan %q", limits.ErrUnknownLimit, name, t.plan)
}

// limitsOfPlan is every enabled limit of plan, the defaults' for a plan the config no longer has.
func (sn *snapshot) limitsOfPlan(plan string) []routeLimit {
	if ls, ok := sn.limits[plan]; ok {
		return ls
	}
	return sn.limits[""]
}

// limitBy is what the limit name counts by (the same in every plan).
func (sn *snapshot) limitBy(name string) by {
	for _, ls := range sn.limits {
		for _, l := range ls {
			if l.rule.Name == name {
				return l.by
			}
		}
	}
	return 0
}

// quotaID checks that id is one the limit could count (what /usage/top shows), so nothing
// else ever becomes part of a key name: project ids and orgs as the limiter keeps them
// (characters [A-Za-z0-9._~@-], at most 128, or a configured org's name), an IP address
// (an IPv6 address or prefix becomes the prefix the limit counts), a key's SHA-256 digest.
func (sn *snapshot) quotaID(b by, id string) (string, error) {
	bad := func(want string) error {
		return &limits.InvalidError{Field: "id", Reason: "not " + want}
	}
	if id == "" || len(id) > QuotaIDMax {
		return "", &limits.InvalidError{Field: "id", Reason: fmt.Sprintf("must be 1 to %d characters", QuotaIDMax)}
	}
	switch b {
	case byProject:
		if safeID(id) != id {
			return "", bad("a project id as the limit counts it (characters A-Z a-z 0-9 . _ ~ @ -)")
		}
	case byOrg:
		if _, configured := sn.orgMetrics[id]; (!configured || id == otherOrg) && safeID(id) != id {
			return "", bad("an org: a configured one, or characters A-Z a-z 0-9 . _ ~ @ -")
		}
	case byIP:
		return sn.quotaIP(id)
	case byKey:
		if len(id) != 64 {
			return "", bad("a key's digest (64 hexadecimal characters, as /usage/top shows it)")
		}
		if _, err := hex.DecodeString(id); err != nil {
			return "", bad("a key's digest (64 hexadecimal characters, as /usage/top shows it)")
		}
		return strings.ToLower(id), nil
	default:
		return "", bad("an id of this limit")
	}
	return id, nil
}

// quotaIP is the per-IP limits' id of an IP address, or of an IPv6 prefix of the length the
// limits count (client_ip.ipv6_prefix).
func (sn *snapshot) quotaIP(id string) (string, error) {
	if a, err := netip.ParseAddr(id); err == nil && a.Zone() == "" {
		return sn.addrID(a.Unmap()), nil
	}
	p, err := netip.ParsePrefix(id)
	if err != nil || !p.Addr().Is6() || p.Addr().Is4In6() {
		return "", &limits.InvalidError{Field: "id", Reason: "not an IP address, or an IPv6 prefix as /usage/top shows it"}
	}
	if p.Bits() != sn.ipv6Bits || p.Masked() != p {
		return "", &limits.InvalidError{Field: "id", Reason: fmt.Sprintf("an IPv6 prefix must be the /%d the limits count (client_ip.ipv6_prefix), without host bits", sn.ipv6Bits)}
	}
	return p.String(), nil
}

// quotaTarget is the store and the tenant's rule and id of a quota action.
func (g *Gateway) quotaTarget(ctx context.Context, limit, id string) (limits.QuotaStore, *limits.Rule, string, error) {
	if g.quotas == nil {
		return nil, nil, "", errNoQuotas
	}
	r, id, err := g.quotaRule(ctx, limit, id)
	return g.quotas, r, id, err
}

var errNoQuotas = errors.New("proxy: quota: no store for run-time quotas")

// Grant adds amount to the tenant's allowance of limit for its current window.
func (g *Gateway) Grant(ctx context.Context, limit, id string, amount int64, who limits.Who) (limits.Grant, limits.AuditEntry, error) {
	q, r, id, err := g.quotaTarget(ctx, limit, id)
	if err != nil {
		return limits.Grant{}, limits.AuditEntry{}, err
	}
	return q.Grant(ctx, r, id, amount, who)
}

// SetOverride makes value the tenant's limit until expires.
func (g *Gateway) SetOverride(ctx context.Context, limit, id string, value int64, expires time.Time, who limits.Who) (limits.Override, limits.AuditEntry, error) {
	q, r, id, err := g.quotaTarget(ctx, limit, id)
	if err != nil {
		return limits.Override{}, limits.AuditEntry{}, err
	}
	return q.SetOverride(ctx, r, id, value, expires, who)
}

// EndOverride ends the tenant's override early (limits.ErrNoOverride when it has none).
func (g *Gateway) EndOverride(ctx context.Context, limit, id string, who limits.Who) (limits.AuditEntry, error) {
	q, r, id, err := g.quotaTarget(ctx, limit, id)
	if err != nil {
		return limits.AuditEntry{}, err
	}
	return q.EndOverride(ctx, r, id, who)
}

// Reset empties the tenant's counter of limit for the current window.
func (g *Gateway) Reset(ctx context.Context, limit, id string, who limits.Who) (limits.AuditEntry, error) {
	q, r, id, err := g.quotaTarget(ctx, limit, id)
	if err != nil {
		return limits.AuditEntry{}, err
	}
	return q.Reset(ctx, r, id, who)
}

// Overrides lists every override in force.
func (g *Gateway) Overrides(ctx context.Context) ([]limits.Override, error) {
	if g.quotas == nil {
		return nil, errNoQuotas
	}
	return g.quotas.Overrides(ctx)
}

// Audit returns the newest n entries of the audit trail, newest first.
func (g *Gateway) Audit(ctx context.Context, n int) ([]limits.AuditEntry, error) {
	if g.quotas == nil {
		return nil, errNoQuotas
	}
	return g.quotas.Audit(ctx, n)
}
