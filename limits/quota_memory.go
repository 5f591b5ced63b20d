package limits

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// memQuotas holds the in-process store's run-time quotas and audit trail. Decisions read it
// under a read lock, and not at all while no tenant has a quota (live is 0), so the store's
// hot path pays one atomic load for the feature.
type memQuotas struct {
	live  atomic.Int64 // entries in m
	mu    sync.RWMutex
	m     map[quotaKey]*quota
	audit auditRing
}

// quotaKey names a tenant's quota of a limit in a unit: a change of the limit's unit does not
// carry a grant of one unit into the other (as the Redis quota hashes, named by unit).
type quotaKey struct {
	limit string
	unit  Unit
	id    string
}

// quota is one tenant's run-time quota of one limit, with its override's particulars.
type quota struct {
	quotaTerms
	reason, actor string
	created       int64 // Unix µs
}

// WithAuditMax makes the store keep the newest n audit entries (default DefaultAuditMax).
func WithAuditMax(n int) MemoryOption {
	return func(m *Memory) {
		if n > 0 {
			m.quotas.audit.max = n
		}
	}
}

// lookup copies the quotas of hs' tenants into them.
func (q *memQuotas) lookup(hs []memHit) {
	if q.live.Load() == 0 {
		return
	}
	q.mu.RLock()
	for i := range hs {
		if e := q.m[quotaKey{hs[i].cr.snap.Name, hs[i].cr.snap.Unit, hs[i].key.id}]; e != nil {
			hs[i].q = e.quotaTerms
		}
	}
	q.mu.RUnlock()
}

// get returns the quota of (r's limit in its unit, id), or zero terms.
func (q *memQuotas) get(r *Rule, id string) (quotaTerms, bool) {
	if q.live.Load() == 0 {
		return quotaTerms{}, false
	}
	q.mu.RLock()
	defer q.mu.RUnlock()
	if e := q.m[quotaKey{r.Name, r.Unit, id}]; e != nil {
		return e.quotaTerms, true
	}
	return quotaTerms{}, false
}

// state is the tenant's standing on cr: its allowance, use and grants (the caller holds
// q.mu; it takes the counter's shard lock).
func (m *Memory) state(cr *compiled, id string, now memTime) QuotaState {
	var terms quotaTerms
	if e := m.quotas.m[quotaKey{cr.snap.Name, cr.snap.Unit, id}]; e != nil {
		terms = e.quotaTerms
	}
	u := m.entryOf(cr, id).usage(cr, terms, now)
	return QuotaState{Limit: u.Limit, Used: u.Used, Granted: u.Granted}
}

// change runs one action on the quota of (cr, id) under the write lock: before and after
// are read around it, and the entry is recorded.
func (m *Memory) change(ctx context.Context, r *Rule, id string, who Who, action string, do func(cr *compiled, q *quota, e *AuditEntry, now memTime) error) (AuditEntry, error) {
	if err := ctx.Err(); err != nil {
		return AuditEntry{}, fmt.Errorf("limits: quota: %w", err)
	}
	cr, err := m.rules.get(r)
	if err != nil {
		return AuditEntry{}, fmt.Errorf("limits: quota: %w", err)
	}
	if !cr.enabled {
		return AuditEntry{}, fmt.Errorf("%w: %q is disabled", ErrUnknownLimit, r.Name)
	}
	qs := &m.quotas
	qs.mu.Lock()
	defer qs.mu.Unlock()
	now := m.clock()
	qs.sweep(now.us)
	m.rollEnded(cr, id, now)
	k := quotaKey{r.Name, r.Unit, id}
	q := qs.m[k]
	if q == nil {
		q = &quota{}
	}
	e := AuditEntry{Time: time.UnixMicro(now.us).UTC(), Actor: who.Actor, Action: action, Limit: r.Name, ID: id, Reason: who.Reason}
	e.Before = m.state(cr, id, now)
	if err := do(cr, q, &e, now); err != nil {
		return AuditEntry{}, err
	}
	if q.live(now.us) {
		if qs.m[k] == nil {
			qs.m[k] = q
			qs.live.Add(1)
		}
	} else if qs.m[k] != nil {
		delete(qs.m, k)
		qs.live.Add(-1)
	}
	e.After = m.state(cr, id, now)
	qs.audit.add(e)
	return e, nil
}

// live: q still holds an override or grants to come.
func (q *quota) live(nowUS int64) bool {
	return q.ox > nowUS || (q.g > 0 && q.ge*1e6 > nowUS)
}

// sweep drops the quotas that have lapsed (the caller holds the write lock).
func (q *memQuotas) sweep(nowUS int64) {
	for k, e := range q.m {
		if !e.live(nowUS) {
			delete(q.m, k)
			q.live.Add(-1)
		}
	}
}

// Grant implements QuotaStore.
func (m *Memory) Grant(ctx context.Context, r *Rule, id string, amount int64, who Who) (Grant, AuditEntry, error) {
	if err := checkGrant(r, amount); err != nil {
		return Grant{}, AuditEntry{}, err
	}
	var out Grant
	e, err := m.change(ctx, r, id, who, ActionGrant, func(cr *compiled, q *quota, e *AuditEntry, now memTime) error {
		_, we := cr.snap.Window.boundsUnix(now.sec)
		if q.ge != we {
			q.g, q.ge = 0, we
		}
		base, _, _ := q.terms(cr.snap.Limit, now.us, we)
		if q.g+amount > MaxLimit-max(base, cr.snap.Limit) {
			return errTooMuch("amount")
		}
		q.g += amount
		out = Grant{Granted: q.g, WindowEnd: time.Unix(we, 0).UTC()}
		e.Amount = amount
		return nil
	})
	return out, e, err
}

// SetOverride implements QuotaStore.
func (m *Memory) SetOverride(ctx context.Context, r *Rule, id string, value int64, expires time.Time, who Who) (Override, AuditEntry, error) {
	var out Override
	e, err := m.change(ctx, r, id, who, ActionOverride, func(cr *compiled, q *quota, e *AuditEntry, now memTime) error {
		if err := checkOverride(cr, value, expires, time.UnixMicro(now.us)); err != nil {
			return err
		}
		_, we := cr.snap.Window.boundsUnix(now.sec)
		if _, g, _ := q.terms(cr.snap.Limit, now.us, we); value > MaxLimit-g {
			return errTooMuch("limit")
		}
		q.ov, q.ox = value, expires.UnixMicro()
		q.reason, q.actor, q.created = who.Reason, who.Actor, now.us
		out = q.override(r.Name, id)
		e.Override = &OverrideTerms{Value: out.Value, Expires: out.Expires}
		return nil
	})
	return out, e, err
}

func (q *quota) override(limit, id string) Override {
	return Override{Limit: limit, ID: id, Value: q.ov, Expires: time.UnixMicro(q.ox).UTC(),
		Reason: q.reason, Actor: q.actor, Created: time.UnixMicro(q.created).UTC()}
}

// EndOverride implements QuotaStore.
func (m *Memory) EndOverride(ctx context.Context, r *Rule, id string, who Who) (AuditEntry, error) {
	return m.change(ctx, r, id, who, ActionOverrideEnd, func(_ *compiled, q *quota, e *AuditEntry, now memTime) error {
		if q.ox <= now.us {
			return ErrNoOverride
		}
		e.Override = &OverrideTerms{Value: q.ov, Expires: time.UnixMicro(q.ox).UTC()} // the terms it ended
		q.ov, q.ox, q.reason, q.actor, q.created = 0, 0, "", "", 0
		return nil
	})
}

// Reset implements QuotaStore: the tenant's counter of cr goes (use 0, a GCRA bucket full).
func (m *Memory) Reset(ctx context.Context, r *Rule, id string, who Who) (AuditEntry, error) {
	return m.change(ctx, r, id, who, ActionReset, func(cr *compiled, _ *quota, _ *AuditEntry, _ memTime) error {
		key := memKey{cr.keyPre, id}
		sh := &m.shards[m.shardOf(key)]
		sh.mu.Lock()
		if e := sh.m[key]; e != nil && (len(e.past) > 0 || cr.snap.Unit == Tokens && len(e.holds) > 0) {
			// The windows kept for history stay (history.go, an ended one moved there by
			// change), and a tokens limit's holds belong to the answers in flight, not to
			// the use.
			e.n = 0
			e.reached, e.exhausted, e.forecast = 0, false, false // a reset window is crossed anew
		} else {
			delete(sh.m, key)
		}
		sh.mu.Unlock()
		return nil
	})
}

// Overrides implements QuotaStore.
func (m *Memory) Overrides(ctx context.Context) ([]Override, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("limits: overrides: %w", err)
	}
	nowUS := m.clock().us
	out := []Override{}
	m.quotas.mu.RLock()
	for k, q := range m.quotas.m {
		if q.ox > nowUS {
			out = append(out, q.override(k.limit, k.id))
		}
	}
	m.quotas.mu.RUnlock()
	sortOverrides(out)
	return out, nil
}

// sortOverrides orders overrides soonest to end first, then by limit and id.
func sortOverrides(os []Override) {
	slices.SortFunc(os, func(a, b Override) int {
		if c := a.Expires.Compare(b.Expires); c != 0 {
			return c
		}
		if c := cmp.Compare(a.Limit, b.Limit); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
}

// Audit implements QuotaStore.
func (m *Memory) Audit(ctx context.Context, n int) ([]AuditEntry, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("limits: audit: %w", err)
	}
	m.quotas.mu.RLock()
	defer m.quotas.mu.RUnlock()
	return m.quotas.audit.newest(n), nil
}

// auditRing keeps the newest max entries.
type auditRing struct {
	max     int
	entries []AuditEntry // oldest first until full, then a ring starting at next
	next    int
}

func (a *auditRing) add(e AuditEntry) {
	if len(a.entries) < a.max {
		a.entries = append(a.entries, e)
		return
	}
	a.entries[a.next] = e
	a.next = (a.next + 1) % a.max
}

// newest returns up to n entries, newest first.
func (a *auditRing) newest(n int) []AuditEntry {
	n = min(n, len(a.entries))
	out := make([]AuditEntry, 0, n)
	for i := 0; i < n; i++ {
		// The newest entry sits just before next (or at the end while not full).
		j := (a.next - 1 - i + 2*len(a.entries)) % len(a.entries)
		out = append(out, a.entries[j])
	}
	return out
}
