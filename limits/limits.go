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
	// answer's token usage is known. Tokens limits count in fixed windows.
	Unit Unit
}

// Unit is what a limit counts.
type Unit uint8

const (
	Requests Unit = iota // one per admitted request (the default)
	Tokens               // the tokens of the answers, debited after they finish
)

// ParseUnit parses "requests" (or "") and "tokens".
func ParseUnit(s string) (Unit, error) {
	switch s {
	case "", "requests":
		return Requests, nil
	case "tokens":
		return Tokens, nil
	}
	return 0, fmt.Errorf("limits: unit %q: want requests or tokens", s)
}

func (u Unit) String() string {
	if u == Tokens {
		return "tokens"
	}
	return "requests"
}

// Hit asks for one unit of Rule for the identifier ID.
type Hit struct {
	Rule *Rule
	// ID is already safe for a key name: projectId, SHA-256 hex of a key, org
	// name, or an IP / IPv6 /64 prefix. Never a raw secret.
	ID string
}

// Result is the outcome for one hit of a decision.
type Result struct {
	Rule    *Rule
	Allowed bool // this limit alone had room for the request
	// Remaining after this request if the whole decision admitted it, else the
	// current remaining (nothing was consumed).
	Remaining int64
	// Reset is the time until this limit's window resets (fixed) or until it is
	// fully replenished (gcra).
	Reset time.Duration
	// RetryAfter is, when !Allowed, the time until this limit admits again; 0 otherwise.
	RetryAfter time.Duration
	// WindowStart is, for a fixed window, the start (Unix seconds, the store's clock) of the
	// window the request was counted in; Refund gives a unit back in that window only.
	WindowStart int64
}

// Decision is the outcome of one Take.
type Decision struct {
	Allowed bool     // all limits had room; one unit of each was consumed
	Results []Result // same order as the hits
}

// Denied returns the index of the first result that denied, or -1.
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
}

// Usage is a counter read back without consuming.
type Usage struct {
	Name      string
	Limit     int64
	Used      int64
	Remaining int64
	Reset     time.Time // end of the current window (fixed) / full replenishment (gcra)
	Unit      Unit
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
	// the rule that applies to an id (its plan's); ids whose rule has another window or
	// algorithm are counted under other keys and skipped, as are ids resolve returns nil for.
	// It reads in bounded batches (no KEYS), so its cost falls on the caller, not on Redis.
	Scan(ctx context.Context, r *Rule, resolve func(id string) *Rule, visit func(id string, u Usage)) error
}

// ErrInvalidRule is wrapped by errors about rules a store cannot use.
var ErrInvalidRule = errors.New("limits: invalid rule")

// compiled holds what a store derives from a Rule once, so the hot path does
// not rebuild key prefixes and script arguments per request.
type compiled struct {
	snap    Rule   // the fields this was built from; a mismatch means the Rule was edited
	keyPre  string // "<prefix>:<name>:<window>:{"
	spec    any    // script argument "f <limit> <window>", boxed once to avoid an allocation per call
	period  float64
	enabled bool
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
	if r.Window.IsZero() {
		return nil, fmt.Errorf("%w: rule %q has no window", ErrInvalidRule, r.Name)
	}
	if r.Algorithm != Fixed && r.Algorithm != GCRA {
		return nil, fmt.Errorf("%w: rule %q has unknown algorithm %d", ErrInvalidRule, r.Name, r.Algorithm)
	}
	if r.Unit != Requests && r.Unit != Tokens {
		return nil, fmt.Errorf("%w: rule %q has unknown unit %d", ErrInvalidRule, r.Name, r.Unit)
	}
	if r.Unit == Tokens && r.Algorithm != Fixed {
		return nil, fmt.Errorf("%w: rule %q: a tokens limit counts in fixed windows", ErrInvalidRule, r.Name)
	}
	cr.keyPre = c.prefix + r.Name + ":" + r.Window.String() + ":{"
	algo := "f"
	switch {
	case r.Algorithm == GCRA:
		algo = "g"
	case r.Unit == Tokens:
		algo = "t" // a fixed window that Take only checks
	}
	cr.spec = algo + " " + strconv.FormatInt(r.Limit, 10) + " " + r.Window.luaSpec()
	cr.period = r.Window.Nominal().Seconds()
	return cr, nil
}

var (
	_ Store = (*Memory)(nil)
	_ Store = (*Redis)(nil)
	_ Store = (*Guard)(nil)
)
