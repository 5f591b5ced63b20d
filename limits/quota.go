package limits

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Run-time quotas: operators adjust one tenant's allowance of one limit without touching the
// config. Three actions change it, and each leaves an audit entry:
//
//   - a grant adds units to the tenant's allowance for the current window only (the limit's
//     window, aligned as a fixed window's, for GCRA limits too); grants add up and end with
//     the window;
//   - an override replaces the tenant's limit (its plan's) by a value of its own until it
//     expires; an override of 0 refuses every request of the tenant on that limit, grants
//     or not;
//   - a reset makes the tenant's use of the current window 0 (a GCRA bucket full).
//
// The allowance a decision applies is therefore the override in force, else the limit, plus
// the window's grants: with a limit of 100, 30 used, an override of 10 and a grant of 5, the
// tenant has 15 and is refused until the window ends or the override does (the next request
// is told the sooner of the two); with the override ended it has 105.
//
// Both stores keep them beside the counters and read them in the same decision: on Redis a
// hash per limit and tenant, "<prefix>:<limit>:quota:{<id>}", in the slot of the tenant's
// counters, read by the one script call of each decision (so every replica applies a change
// at its next decision, and a restart of the gateway loses nothing); in process, a map
// beside the counters. The audit trail is a capped list in Redis (newest first) or in
// process.

// QuotaState is a tenant's standing on one limit, as the audit trail records it before and
// after an action.
type QuotaState struct {
	Limit   int64 `json:"limit"`   // the allowance: the override in force, else the limit, plus the grants
	Used    int64 `json:"used"`    // used in the current window (a GCRA bucket: the units it holds)
	Granted int64 `json:"granted"` // grants of the current window
}

// Override replaces one tenant's limit until it expires.
type Override struct {
	Limit   string    `json:"limit"` // the limit's name
	ID      string    `json:"id"`
	Value   int64     `json:"value"` // the tenant's limit while it lasts; 0 refuses every request
	Expires time.Time `json:"expires"`
	Reason  string    `json:"reason"`
	Actor   string    `json:"actor"`
	Created time.Time `json:"created"`
}

// OverrideTerms is an override's value and end, as usage read-back and the audit show it.
type OverrideTerms struct {
	Value   int64     `json:"value"`
	Expires time.Time `json:"expires"`
}

// Audit actions.
const (
	ActionGrant       = "grant"
	ActionOverride    = "override"
	ActionOverrideEnd = "override_end"
	ActionReset       = "reset"
)

// AuditEntry is one action on a tenant's quota. Its JSON is how the Redis store keeps it.
type AuditEntry struct {
	Time   time.Time  `json:"time"`
	Actor  string     `json:"actor"`
	Action string     `json:"action"`
	Limit  string     `json:"limit"`
	ID     string     `json:"id"`
	Before QuotaState `json:"before"`
	After  QuotaState `json:"after"`
	Reason string     `json:"reason"`
	// Amount is a grant's amount; Override the terms an override action set, or those an
	// override_end ended.
	Amount   int64          `json:"amount,omitempty"`
	Override *OverrideTerms `json:"override,omitempty"`
}

// Grant is the outcome of a grant: the window's grants in all, and when they end.
type Grant struct {
	Granted   int64
	WindowEnd time.Time
}

// Who is who acts on a quota, and why.
type Who struct {
	Actor  string
	Reason string
}

// QuotaStore changes tenants' quotas at run time and keeps the audit trail. Every action
// names the rule that applies to the tenant (its plan's: its window and algorithm decide
// which counter a reset empties and which window a grant belongs to); overrides are kept
// per limit name, whatever rule applies. Each action returns its audit entry, already
// recorded.
type QuotaStore interface {
	Grant(ctx context.Context, r *Rule, id string, amount int64, who Who) (Grant, AuditEntry, error)
	// SetOverride replaces an override in force, if any.
	SetOverride(ctx context.Context, r *Rule, id string, value int64, expires time.Time, who Who) (Override, AuditEntry, error)
	// EndOverride ends the override in force; ErrNoOverride when there is none.
	EndOverride(ctx context.Context, r *Rule, id string, who Who) (AuditEntry, error)
	Reset(ctx context.Context, r *Rule, id string, who Who) (AuditEntry, error)
	// Overrides lists every override in force, soonest to end first.
	Overrides(ctx context.Context) ([]Override, error)
	// Audit returns the newest n entries of the trail, newest first.
	Audit(ctx context.Context, n int) ([]AuditEntry, error)
}

var (
	_ QuotaStore = (*Memory)(nil)
	_ QuotaStore = (*Redis)(nil)
)

// DefaultAuditMax is how many audit entries a store keeps unless told otherwise.
const DefaultAuditMax = 100_000

// ErrNoOverride says a tenant has no override in force on a limit.
var ErrNoOverride = errors.New("limits: no override in force")

// InvalidError is a quota action a store refuses because of one of its values.
type InvalidError struct {
	Field  string // "amount", "limit" (an override's value, or a grant's streams limit), "expires"
	Reason string
}

func (e *InvalidError) Error() string { return "limits: " + e.Field + ": " + e.Reason }

// checkGrant and checkOverride refuse what no store can count exactly. A streams limit takes
// no grant: it counts answers in flight, and has no window for a grant to last until (one
// would end within a second); an override raises its cap for as long as the operator says.
func checkGrant(r *Rule, amount int64) error {
	if r.Unit == Streams {
		return &InvalidError{Field: "limit", Reason: "counts streams (answers in flight) and has no window for a grant to last: give the tenant an override instead (PUT /quota/overrides/{limit}/{id}, gateway quota override)"}
	}
	if amount < 1 || amount > MaxLimit {
		return &InvalidError{Field: "amount", Reason: fmt.Sprintf("must be a whole number from 1 to %d", int64(MaxLimit))}
	}
	return nil
}

func checkOverride(cr *compiled, value int64, expires, now time.Time) error {
	if value < 0 {
		return &InvalidError{Field: "limit", Reason: "must be 0 or more"}
	}
	if err := CheckLimit(value, cr.snap.Window, cr.snap.Algorithm); err != nil {
		return &InvalidError{Field: "limit", Reason: err.Error()}
	}
	if !expires.After(now) {
		return &InvalidError{Field: "expires", Reason: "must be in the future"}
	}
	return nil
}

// errTooMuch is a grant or override that would take the allowance past MaxLimit.
func errTooMuch(field string) error {
	return &InvalidError{Field: field, Reason: fmt.Sprintf("the allowance (limit or override plus the window's grants) would exceed %d, the largest counted exactly", int64(MaxLimit))}
}

// quotaTerms are the numbers of one tenant's run-time quota of one limit (the Redis hash
// has the same fields: ov, ox, g, ge).
type quotaTerms struct {
	ov int64 // the override's value, while ox is ahead
	ox int64 // the override's end, Unix µs; 0: none
	g  int64 // grants of the window ending at ge
	ge int64 // Unix s
}

// terms is what q makes of limit at nowUS in the window ending at we: the base (the
// override in force, else limit), the grants of that window, and the override's end (0: none).
func (q *quotaTerms) terms(limit, nowUS, we int64) (base, granted, ends int64) {
	base = limit
	if q.ox > nowUS {
		base, ends = q.ov, q.ox
	}
	if q.ge == we {
		granted = q.g
	}
	return base, granted, ends
}

// allowance is what a tenant may use: base plus grants, or nothing while an override of 0
// stands.
func allowance(base, granted int64) int64 {
	if base == 0 {
		return 0
	}
	return base + granted
}

// capUsed is the use a read-back shows: requests never count past the allowance, except
// when an override lowered it under what was used (or a reload lowered the limit): up to
// the rule's own limit, the count is shown as it is. Tokens may run past any limit.
func capUsed(used, allow int64, r *Rule) int64 {
	used = max(used, 0)
	if r.Unit == Tokens {
		return used
	}
	return min(used, max(allow, r.Limit))
}

// untilEnd bounds how long a refused request is told to wait by the override's end: once it
// ends the plan's limit applies again. While an override of 0 stands (allow 0), nothing is
// admitted before its end, so that is the wait.
func untilEnd(retry time.Duration, allow, ends, nowUS int64) time.Duration {
	if ends == 0 {
		return retry
	}
	left := time.Duration(ends-nowUS) * time.Microsecond
	if allow == 0 || left < retry {
		return left
	}
	return retry
}
