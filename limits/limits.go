package limits

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Rule is one configured limit.
type Rule struct {
	Name      string // e.g. "assistant_per_org"; part of key names, must not contain '{' or '}'
	Limit     int64  // 0 (or negative) disables the rule: always allowed, nothing stored
	Window    Window
	Algorithm Algorithm
	// Unit is what the limit counts. A Tokens limit is only checked by Take (admitted while
	// the used tokens are below Limit; nothing is consumed) and debited by Debit once an
	// answer's token usage is known. Tokens limits count in fixed windows. A Streams limit
	// counts answers in flight (see hold.go): it has no Window.
	Unit Unit
	// Reserve (Tokens limits) makes Take hold that many tokens for the answer, admitting only
	// while at least Reserve remain net of the used tokens and the live holds; Settle turns
	// the hold into the answer's tokens (see hold.go). 0: no hold, the answer is debited.
	Reserve int64
	// ReserveTTL (Tokens limits with a Reserve, Streams limits) is how long a hold or a slot
	// lives unsettled: one whose gateway died comes back then. 0 is DefaultReserveTTL.
	ReserveTTL time.Duration
	// EstimateMax (Tokens limits) bounds the prompt tokens charged by estimate to an answer
	// that reported no final usage. The caller computes the charge; the stores never read it.
	EstimateMax int64
	// Shadow makes the limit count without ever denying: a decision admits when the other
	// limits have room, and then charges this one too if it still has room (see Decision).
	// It does not change the limit's counters: a shadow and an enforced Rule of one name,
	// window and algorithm count the same keys.
	Shadow bool
	// History is how many windows a fixed-window limit keeps after they end, for usage history
	// and billing exports (see history.go); 0 keeps none. GCRA limits have no windows to keep.
	History int
	// Thresholds (fixed-window requests and tokens limits) are reported in Result.Crossed by the decision
	// that takes a tenant's count to or past them, against the allowance in force, once per
	// tenant and window: the counter marks what it reported, so replicas deciding at the same
	// instant report each crossing once (thresholds.go).
	Thresholds Thresholds
	// Exhausted (fixed-window requests and tokens limits, enforced) reports a tenant's first
	// refusal in a window in Result.Crossed (CrossedExhausted), once per tenant and window
	// likewise.
	Exhausted bool
	// Forecast reports, once per tenant and window (CrossedForecast), the first decision or
	// charge after which the tenant runs out before the window ends at its rate so far.
	Forecast bool
}

// Unit is what a limit counts.
type Unit uint8

const (
	Requests Unit = iota // one per admitted request (the default)
	Tokens               // the tokens of the answers, debited after they finish
	Streams              // answers in flight: a slot from admission to the answer's end
)

// ParseUnit parses "requests" (or ""), "tokens" and "streams".
func ParseUnit(s string) (Unit, error) {
	switch s {
	case "", "requests":
		return Requests, nil
	case "tokens":
		return Tokens, nil
	case "streams":
		return Streams, nil
	}
	return 0, fmt.Errorf("limits: unit %q: want requests, tokens or streams", s)
}

func (u Unit) String() string {
	switch u {
	case Tokens:
		return "tokens"
	case Streams:
		return "streams"
	}
	return "requests"
}

// Hit asks for one unit of Rule for the identifier ID.
type Hit struct {
	Rule *Rule
	// ID is already safe for a key name: projectId, SHA-256 hex of a key, org
	// name, or an IP / IPv6 /64 prefix. Never a raw secret.
	ID string
	// Allow is the allowance the admitting decision applied (Result.Limit), which a charge of
	// tokens (Debit, Settle) measures thresholds and forecasts against; 0: none are reported.
	Allow int64
	// Units, for a fixed-window or GCRA requests limit, is how many units the hit takes at
	// once: the limit admits while that many more fit, and takes them all or none (a front
	// door that counts several hits of one call, as Envoy's hits_addend). 0 takes one, as a
	// request does. Other limits ignore it.
	Units int64
	// Check, for the same limits, takes nothing: the hit admits while one more unit fits and
	// reports the current remaining (Envoy's hits_addend of 0). A decision of Check hits alone
	// writes nothing.
	Check bool
}

// units is what h takes of a requests limit: 0 for a check, else Units (at least one); one
// for other limits.
func (h *Hit) units() int64 {
	switch {
	case h.Rule == nil || h.Rule.Unit != Requests:
		return 1
	case h.Check:
		return 0
	case h.Units <= 0:
		return 1
	}
	return h.Units
}

// withUnits is the script spec of h (spec: its rule's compiled one) saying how many units it
// takes when that is not one: "<algo>[s][q]u<n> ..." (takeLua's parse). The request path's
// hits take one and keep the spec as compiled, without an allocation.
func withUnits(spec any, h *Hit) any {
	u := h.units()
	if u == 1 {
		return spec
	}
	s := spec.(string)
	i := strings.IndexByte(s, ' ')
	return s[:i] + "u" + strconv.FormatInt(u, 10) + s[i:]
}

// Result is the outcome for one hit of a decision.
type Result struct {
	Rule    *Rule
	Allowed bool // this limit alone had room for the request
	// Remaining after this request if the decision charged it (admitted, and this limit had
	// room), else the current remaining (nothing was consumed).
	Remaining int64
	// Reset is the time until this limit's window resets (fixed) or until it is
	// fully replenished (gcra).
	Reset time.Duration
	// RetryAfter is, when !Allowed, the time until this limit admits again; 0 otherwise.
	RetryAfter time.Duration
	// WindowStart is, for a fixed window, the start (Unix seconds, the store's clock) of the
	// window the request was counted in; Refund gives a unit back in that window only.
	WindowStart int64
	// Limit is the allowance the decision applied: Rule.Limit unless the tenant has an
	// override in force or grants in the window (see quota.go), which the headers show.
	Limit int64
	// Crossed says what this decision was the first in its window to reach (Rule.Thresholds
	// and Rule.Exhausted): bit i for threshold i, CrossedExhausted for the first refusal.
	Crossed uint16
	// Used and Held are, when Crossed is not 0 (else 0), the tenant's counter after the
	// decision as usage read-back shows it (Usage.Used: a tokens limit's may run past the
	// allowance, a requests limit's is the count) and what the live holds of a tokens limit
	// with a Reserve keep (Usage.Reserved): Remaining, net of the holds and never below 0,
	// says neither.
	Used, Held int64
	// base is the limit or override the grants add to: a GCRA bucket refills one unit per
	// period/base, which is what a refund gives back.
	base int64
}

// Decision is the outcome of one Take.
//
// Allowed is true when every enforced limit (Rule.Shadow false) had room. Then one unit of
// each enforced limit and of each shadow limit that had room was consumed; else nothing was. For
// example, with an enforced limit of 100 (10 used) and shadow limits of 2 (2 used) and 5 (3
// used): the request is admitted, the enforced limit goes to 11 and the second shadow limit to
// 4, and the spent shadow limit stays at 2 (its Result says !Allowed). Were the enforced limit
// spent, the request would be denied and none of the three would move.
type Decision struct {
	Allowed bool
	Results []Result // same order as the hits
	// Hold names the token holds and stream slots an admitting decision took (see hold.go),
	// for Settle; "" when it took none.
	Hold string
}

// Denied returns the index of the first result that denied (a shadow one included), or -1.
func (d *Decision) Denied() int {
	for i := range d.Results {
		if !d.Results[i].Allowed {
			return i
		}
	}
	return -1
}

// reset sizes d.Results to n, reusing its capacity.
func (d *Decision) reset(n int) {
	if cap(d.Results) < n {
		d.Results = make([]Result, n)
	} else {
		d.Results = d.Results[:n]
		clear(d.Results)
	}
	d.Allowed = false
	d.Hold = ""
}

// Usage is a counter read back without consuming.
type Usage struct {
	Name      string
	Limit     int64 // the allowance: the tenant's override in force, else the limit, plus Granted
	Used      int64
	Remaining int64
	Reset     time.Time // end of the current window (fixed) / full replenishment (gcra)
	Unit      Unit
	Granted   int64          // grants of the current window
	Override  *OverrideTerms // the override in force; nil without one

	// Reserved is what the live holds keep of a tokens limit with a reserve (see hold.go);
	// Remaining is net of it. A streams limit's slots in use are its Used. Reserves says the
	// limit has a reserve (Reserved applies, 0 included).
	Reserved int64
	Reserves bool
}

// Store decides hits atomically: all-or-nothing (if any limit denies, none is consumed).
type Store interface {
	// Take decides all hits at once and fills d (reusing d.Results' capacity).
	Take(ctx context.Context, hits []Hit, d *Decision) error
	// Usage reads a counter without consuming anything.
	Usage(ctx context.Context, r *Rule, id string) (Usage, error)
	// Debit adds n units to the Tokens limits of hits, in their current windows, without any
	// check (the tokens are already spent). Hits of other limits are ignored.
	Debit(ctx context.Context, hits []Hit, n int64) error
	// Scan reads back every counter of rule r (its name, window and algorithm) in the current
	// window, without consuming anything, and calls visit for each one in use. resolve gives
	// the rule that applies to an id (its plan's); ids whose rule has another window, unit or
	// algorithm are skipped (counted in other windows or under other keys), as are ids resolve
	// returns nil for.
	// It reads in bounded batches (no KEYS), so its cost falls on the caller, not on Redis.
	Scan(ctx context.Context, r *Rule, resolve func(id string) *Rule, visit func(id string, u Usage)) error
	// Settle ends the holds and slots of decision hold for hits (Decision.Held): a tokens
	// hold is replaced by n tokens charged in the current window (n < 0: released, nothing
	// charged), a streams slot is given back. It returns the names of the tokens limits
	// whose hold had expired before it was settled (its n tokens are charged all the same).
	Settle(ctx context.Context, hold string, hits []Hit, n int64) ([]string, error)
}

// ErrInvalidRule is wrapped by errors about rules a store cannot use.
var ErrInvalidRule = errors.New("limits: invalid rule")

// MaxLimit is the largest limit the stores count exactly: Redis' scripts compute in Lua
// numbers, doubles, which hold every integer up to 2^53 − 1 and no longer all of them past it
// (9007199254740993 reads as 9007199254740992). The in-process store refuses the same rules,
// so the two stores agree on what they accept.
const MaxLimit = 1<<53 - 1

// MaxGCRALimit is the largest GCRA limit for window w: one unit per microsecond, the
// resolution of Redis' clock. A GCRA bucket moves its TAT (seconds since 2017, a double
// precise to about 0.06 µs) by window/limit per request; at a microsecond or more per unit
// the TAT's rounding stays under a tenth of a unit, while at a nanosecond the remaining count
// it reports would be off by dozens.
func MaxGCRALimit(w Window) int64 {
	return min(int64(w.Nominal()/time.Microsecond), MaxLimit)
}

// CheckLimit says why a store cannot count limit exactly with algorithm a over window w, or
// returns nil. Configuration validation and both stores use it.
func CheckLimit(limit int64, w Window, a Algorithm) error {
	switch {
	case limit > MaxLimit:
		return fmt.Errorf("%d is above %d (2^53 − 1), the largest limit counted exactly", limit, int64(MaxLimit))
	case a == GCRA && !w.IsZero() && limit > MaxGCRALimit(w):
		return fmt.Errorf("%d is above %d, the largest GCRA limit for window %s (one unit per microsecond, the resolution of Redis' clock)", limit, MaxGCRALimit(w), w)
	}
	return nil
}

// compiled holds what a store derives from a Rule once, so the hot path does
// not rebuild key prefixes and script arguments per request.
type compiled struct {
	snap   Rule   // the fields this was built from; a mismatch means the Rule was edited
	keyPre string // "<prefix>:<name>:{" (requests), "<prefix>:<name>:tokens:{", "<prefix>:<name>:<window>:gcra:{" (counterKeyPart)
	// quotaPre names the tenants' run-time quotas of the limit: "<prefix>:<name>:quota:{"
	// ("<prefix>:<name>:tokens:quota:{" for tokens, ...). A window is never "quota", so these
	// never meet a counter's name.
	quotaPre string
	spec     any    // script argument "f <limit> <window>" ("fs ..." when Shadow), boxed once to avoid an allocation per call
	specQ    any    // spec with the q flag: the tenant's quota key follows the counters (see takeLua)
	algo     string // the spec's first word
	period   float64
	enabled  bool
	// plainPre: keyPre holds no brace but its final '{', so a key's hash tag is its id up to
	// the first '}' (slotKey).
	plainPre bool
}

// maxCachedRules bounds ruleCache: rules come from configuration, so a larger
// number means the caller creates Rules per request; then we stop caching.
const maxCachedRules = 4096

type ruleCache struct {
	prefix string // store prefix with trailing ':' (or "" for Memory)
	m      sync.Map
	n      atomic.Int64
}

func (c *ruleCache) get(r *Rule) (*compiled, error) {
	if r == nil {
		return nil, fmt.Errorf("%w: nil rule", ErrInvalidRule)
	}
	if v, ok := c.m.Load(r); ok {
		cr := v.(*compiled)
		if cr.snap == *r {
			return cr, nil
		}
	}
	cr, err := c.compile(r)
	if err != nil {
		return nil, err
	}
	if c.n.Load() < maxCachedRules {
		if _, loaded := c.m.Swap(r, cr); !loaded {
			c.n.Add(1)
		}
	}
	return cr, nil
}

func (c *ruleCache) compile(r *Rule) (*compiled, error) {
	if strings.ContainsAny(r.Name, "{}") || r.Name == "" {
		return nil, fmt.Errorf("%w: name %q must be non-empty without '{' or '}'", ErrInvalidRule, r.Name)
	}
	cr := &compiled{snap: *r, enabled: r.Limit > 0}
	if r.Unit == Streams {
		return c.compileStreams(cr)
	}
	if r.Window.IsZero() {
		return nil, fmt.Errorf("%w: rule %q has no window", ErrInvalidRule, r.Name)
	}
	if r.Algorithm != Fixed && r.Algorithm != GCRA {
		return nil, fmt.Errorf("%w: rule %q has unknown algorithm %d", ErrInvalidRule, r.Name, r.Algorithm)
	}
	if r.Reserve < 0 || r.Reserve > 0 && r.Unit != Tokens || r.ReserveTTL < 0 {
		return nil, fmt.Errorf("%w: rule %q: a reserve (not negative) is for tokens limits", ErrInvalidRule, r.Name)
	}
	if r.Unit != Requests && r.Unit != Tokens {
		return nil, fmt.Errorf("%w: rule %q has unknown unit %d", ErrInvalidRule, r.Name, r.Unit)
	}
	if r.Unit == Tokens && r.Algorithm != Fixed {
		return nil, fmt.Errorf("%w: rule %q: a tokens limit counts in fixed windows", ErrInvalidRule, r.Name)
	}
	if err := CheckLimit(r.Limit, r.Window, r.Algorithm); err != nil {
		return nil, fmt.Errorf("%w: rule %q: limit %w", ErrInvalidRule, r.Name, err)
	}
	if r.History < 0 || r.History > MaxHistory {
		return nil, fmt.Errorf("%w: rule %q: history %d is not 0 to %d", ErrInvalidRule, r.Name, r.History, MaxHistory)
	}
	cr.keyPre = c.prefix + r.Name + ":" + counterKeyPart(r) + "{"
	cr.plainPre = !strings.ContainsAny(cr.keyPre[:len(cr.keyPre)-1], "{}")
	cr.quotaPre = c.prefix + r.Name + ":" + unitKeyPart(r.Unit) + "quota:{"
	algo := "f"
	switch {
	case r.Algorithm == GCRA:
		algo = "g"
	case r.Unit == Tokens:
		algo = "t" // a fixed window that Take only checks
	}
	if r.Shadow {
		algo += "s"
	}
	cr.algo = algo
	keep := keepSpec(r)
	marks := marksSpec(r)
	cr.spec = algo + " " + strconv.FormatInt(r.Limit, 10) + " " + r.Window.luaSpec() + holdSpec(r) + marks + keep
	cr.specQ = algo + "q " + strconv.FormatInt(r.Limit, 10) + " " + r.Window.luaSpec() + holdSpec(r) + marks + keep
	cr.period = r.Window.Nominal().Seconds()
	return cr, nil
}

// specFor is the spec with the limit replaced by base, the limit or override a decision's
// grants added to: what a GCRA bucket refilled at, and so what giving a unit back returns.
// base 0 (unknown, or an override of 0, which takes nothing) means the rule's own.
func (cr *compiled) specFor(base int64) any {
	if base <= 0 || base == cr.snap.Limit || cr.snap.Algorithm != GCRA {
		return cr.spec
	}
	return cr.algo + " " + strconv.FormatInt(base, 10) + " " + cr.snap.Window.luaSpec()
}

// counterKeyPart is what names a rule's counters between its name and the tenant's id. A
// counter is named by what it counts and how, never by the limit's window:
//
//   - the unit: "" for requests, "tokens:" for tokens (streams limits have keys of their own,
//     hold.go). A reload or a plan that changes a limit's unit starts a counter of the new
//     unit; the other unit's counts stay where they are (history and exports read them by
//     unit), and no count of one unit is ever read as the other.
//   - the algorithm: a fixed window is a hash and a GCRA bucket a string, so a GCRA bucket is
//     named by its window too ("<window>:gcra:"): were the two under one name, a change of
//     algorithm would make the script meet a key of the other type (WRONGTYPE). A bucket
//     holds no history; a change of its window starts a fresh one, which never refuses more.
//
// A fixed window's hash keeps the window it counts in (its field w), so a reload or a plan
// that changes the window keeps the tenant's counter, its kept windows and the holds of its
// answers in flight: the next unit re-keys the kept windows into the new window's (see
// keep_past in history_redis.go).
func counterKeyPart(r *Rule) string {
	if r.Algorithm == GCRA {
		return r.Window.String() + ":gcra:"
	}
	return unitKeyPart(r.Unit)
}

// unitKeyPart names a unit in key names: "" for requests, "<unit>:" for the others. A
// tenant's run-time quota (grants, overrides) is of its limit's unit, so it is named by it too.
func unitKeyPart(u Unit) string {
	if u == Requests {
		return ""
	}
	return u.String() + ":"
}

var (
	_ Store = (*Memory)(nil)
	_ Store = (*Redis)(nil)
	_ Store = (*Guard)(nil)
)
