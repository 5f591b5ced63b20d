package engine

import (
	"context"
	"slices"
	"time"

	"github.com/docsgate/gateway/limits"
	"github.com/docsgate/gateway/policy"
)

// Request describes one request to decide: the limits its route applies to its tenant's plan,
// and the ids they count it by. A front door fills it from what it knows of the request; it is
// never an HTTP request.
type Request struct {
	Set *policy.LimitSet
	// Project is the request's project id as the client named it (the limits count it as
	// policy.SafeID makes it).
	Project string
	Digest  string // the key's digest, never the key
	Org     string // the tenant's org
	Label   string // the registered key's label, for notifications
	// ClientID is the per-IP limits' id of the client (policy.AddrID); needed only when Set
	// counts by ip.
	ClientID string
	Start    time.Time
}

// id is what a limit counting by b counts for the request.
func (r *Request) id(b policy.By) string {
	switch b {
	case policy.ByProject:
		return policy.SafeID(r.Project)
	case policy.ByKey:
		return r.Digest
	case policy.ByOrg:
		return r.Org
	case policy.ByIP:
		return r.ClientID
	}
	return ""
}

// Decision is one request's decision: the hits it decided (what each limit of the set counts
// for the request) and the store's answer, in the set's order. The caller owns it and may
// reuse it across requests.
type Decision struct {
	Hits []limits.Hit
	limits.Decision
}

// Admission is what an admitted request owes and holds until its answer ends: the tokens
// limits to debit with the answer's tokens, the units taken (given back when the upstream
// refuses the key), the token holds and stream slots to settle, and their keeper. A front door
// keeps one per request (its buffers are for the few limits a route has, so a request
// allocates none); the zero value owes nothing.
type Admission struct {
	// tokenHits are the request's tokens limits that hold nothing, debited with its answer's
	// tokens (backed by tokenHitsBuf).
	tokenHits    []limits.Hit
	tokenHitsBuf [4]limits.Hit
	// taken are the units the admitting decision took (backed by takenBuf).
	taken    []limits.Taken
	takenBuf [4]limits.Taken
	// held are the limits whose token holds or stream slots the decision took (backed by
	// heldBuf), under the decision's hold name.
	held    []limits.Hit
	heldBuf [4]limits.Hit // the example config's streamed routes hold three
	hold    string
	keeper  holdKeeper // refreshes held while the answer lives
}

// Held are the limits whose token holds and stream slots the request holds.
func (a *Admission) Held() []limits.Hit { return a.held }

// Admit decides every limit of req.Set at once (one store call, all or nothing) into d, and
// when the request is admitted records in a what it owes and holds. It also counts the
// limits' refusals and hands over what the decision crossed. An error is the store's: the
// request was neither admitted nor refused (redis.on_error says what becomes of it).
//
// A shadow limit never denies: the store admits the request when the enforced limits have
// room and charges it to every shadow limit that still has room too.
func (e *Engine) Admit(ctx context.Context, req *Request, d *Decision, a *Admission) error {
	d.Hits = d.Hits[:0]
	tokens := false
	for _, l := range req.Set.Limits {
		d.Hits = append(d.Hits, limits.Hit{Rule: l.Rule, ID: req.id(l.By)})
		tokens = tokens || l.Rule.Unit == limits.Tokens
	}
	err := e.take(ctx, d)
	if tokens {
		a.keepTokens(d, err == nil)
	}
	if err != nil {
		return err
	}
	e.countRefusals(req.Set.Limits, req.Start, d)
	if d.Allowed {
		a.taken = d.Taken(d.Hits, a.takenBuf[:0]) // every enforced limit, and the shadow limits that had room
		a.keepHeld(d)
	}
	if e.o.Crossings != nil {
		e.reportCrossings(req.Set.Limits, req.Org, req.Label, req.Start, d)
	}
	return nil
}

// take runs one store decision and records its duration and outcome.
func (e *Engine) take(ctx context.Context, d *Decision) error {
	start := time.Now()
	err := e.o.Limiter.Take(ctx, d.Hits, &d.Decision)
	kind := limits.Classify(err)
	e.o.Metrics.LimiterCall(time.Since(start).Seconds(), string(kind))
	if kind == limits.KindData {
		e.dataErrors.log(e.log, err)
	}
	return err
}

// keepTokens records the request's tokens limits, to be debited with its answer's tokens;
// decided says each carries the allowance the charge measures thresholds against.
func (a *Admission) keepTokens(d *Decision, decided bool) {
	if a.tokenHits == nil {
		a.tokenHits = a.tokenHitsBuf[:0]
	}
	for i, h := range d.Hits {
		if h.Rule.Unit != limits.Tokens {
			continue
		}
		if decided && i < len(d.Results) {
			d.Hits[i].Allow = d.Results[i].Limit
		}
		a.tokenHits = append(a.tokenHits, d.Hits[i])
	}
}

// keepHeld records the token holds and stream slots an admitting decision took, to be settled
// when the answer ends. A tokens limit whose hold was taken is settled with it, not debited;
// one without (no reserve, or a shadow limit that had no room for it) is debited.
func (a *Admission) keepHeld(d *Decision) {
	a.hold, a.held = d.Hold, d.Held(d.Hits, a.heldBuf[:0])
	if len(a.held) == 0 {
		return
	}
	debited := a.tokenHits[:0]
	for _, h := range a.tokenHits {
		if !slices.Contains(a.held, h) {
			debited = append(debited, h)
		}
	}
	a.tokenHits = debited
}

// countRefusals counts each limit's refusals of the decision for the usage page: a refusal of
// an enforced limit that denied the request, and one a shadow limit would have made. ls are
// the decision's limits, in its order.
func (e *Engine) countRefusals(ls []policy.Limit, start time.Time, d *Decision) {
	for i, l := range ls {
		switch res := &d.Results[i]; {
		case res.Allowed:
		case d.Allowed: // a shadow limit that would have denied
			e.refusals.add(l.Rule.Name, true, start)
		case !l.Shadow: // a denied request counts only under its deniers
			e.refusals.add(l.Rule.Name, false, start)
		}
	}
}
