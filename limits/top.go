package limits

import (
	"errors"
	"time"
)

// ErrUnknownLimit is wrapped by errors about a limit name that no enabled limit has.
var ErrUnknownLimit = errors.New("limits: unknown limit")

// TopList is the busiest tenants of one limit in its current window, highest fraction first.
type TopList struct {
	Limit   string // the limit's name, e.g. "assistant_per_org"
	Window  string // "hour", "day", "month" or a duration
	Unit    string // "requests", "tokens" or "streams"
	By      string // what it counts by: "project", "key", "org" or "ip"
	Tenants []TopTenant

	// History is how many ended windows the limit keeps (as its default limits count it; 0
	// for a GCRA limit).
	History int

	// Mode is "enforce", "shadow" (in every plan that enables it: counted and reported, never
	// refusing) or "mixed" (shadow in some plans only; see each tenant's Shadow).
	Mode string
	// Refused is what the process that answers counted of the limit's refusals.
	Refused Refusals
}

// Refusals counts the requests one gateway process refused under a limit, and those a shadow
// limit would have refused, in the limit's current window and since the process started. It
// is counted in the process on the request path (no store write): each replica counts its
// own, and gateway_ratelimit_decisions_total adds them up across replicas.
type Refusals struct {
	// WindowStart is the start of the window InWindow and ShadowInWindow count (the limit's
	// window as its default limits count it); zero for a limit without a window (streams).
	WindowStart     time.Time
	InWindow, Total int64 // refused: denied by this limit
	ShadowInWindow  int64 // would have been refused, by a shadow limit
	ShadowTotal     int64
	Since           time.Time // when this process started counting
}

// TopTenant is one tenant's use of a limit in its current window.
type TopTenant struct {
	// ID is what the limit counts by: an org, a project id, an IP (or /64), or a key's
	// digest (never a key).
	ID string
	// Label and Org describe a registered key (limits that count by key); empty otherwise.
	Label, Org string
	Plan       string // the tenant's plan; "" for the default limits
	Used       int64  // units used in the window (a GCRA limit: the burst in use)
	Limit      int64  // the tenant's allowance: its plan's limit, or its override, plus Granted
	Remaining  int64  // max(Limit-Used, 0)
	Fraction   float64
	Reset      time.Time      // end of the window (fixed) / full replenishment (gcra)
	Granted    int64          // grants of the current window
	Override   *OverrideTerms // the override in force; nil without one

	// Reserved is what the answers in flight hold of a tokens limit with a reserve (see
	// hold.go); Remaining is net of it. Reserves says the limit has a reserve.
	Reserved int64
	Reserves bool

	// Shadow says the limit is in shadow mode for this tenant's plan.
	Shadow bool
}
