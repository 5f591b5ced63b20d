package rls

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/engine"
	"github.com/docsgate/gateway/limits"
	"github.com/docsgate/gateway/policy"
)

// call is one ShouldRateLimit's working state, pooled.
type call struct {
	counts engine.Counts
	d      engine.Decision
	owner  []int        // the descriptor of each hit of counts
	shared [][2]int     // {descriptor, hit}: a later descriptor counting a hit already there
	debits []limits.Hit // tokens limits to debit, with debitN[i] tokens each
	debitN []int64
	keys   strings.Builder
	values []string
	buf    []byte
}

// reset empties c for a new call; a call that decides nothing must find no decision of the
// call before it.
func (c *call) reset() {
	c.counts = engine.Counts{Limits: c.counts.Limits[:0], Hits: c.counts.Hits[:0]}
	c.d.Hits, c.d.Results, c.d.Allowed, c.d.Hold = c.d.Hits[:0], c.d.Results[:0], false, ""
	c.owner, c.shared, c.debits, c.debitN = c.owner[:0], c.shared[:0], c.debits[:0], c.debitN[:0]
}

// invalid is an INVALID_ARGUMENT answer naming the request's field.
func invalid(field, format string, args ...any) error {
	return status.Error(codes.InvalidArgument, field+": "+fmt.Sprintf(format, args...))
}

// errStore marks a failure of the store or the registry (redis.on_error decides).
var errStore = errors.New("rls: store")

// ShouldRateLimit decides a call's descriptors: those the call's domain maps count against
// their limits, all in one engine decision; the others count nothing and are answered OK.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	start := time.Now()
	t := s.table.Load()
	dm, label := t.domains[req.GetDomain()], req.GetDomain()
	if dm == nil {
		label = unknownDomain
	}
	resp, code, err := s.decide(ctx, req, dm, start)
	s.o.Metrics.RLSRequest(label, code, time.Since(start).Seconds())
	return resp, err
}

// decide answers req, with the metrics' code of the answer.
func (s *Service) decide(ctx context.Context, req *rlsv3.RateLimitRequest, dm *domain, start time.Time) (*rlsv3.RateLimitResponse, string, error) {
	if err := check(req); err != nil {
		return nil, "invalid_argument", err
	}
	c := s.calls.Get().(*call)
	defer s.calls.Put(c)
	c.reset()
	c.counts.Start = start
	if dm != nil {
		if err := s.collect(ctx, req, dm, c); err != nil {
			if errors.Is(err, errStore) {
				return s.storeFailed(req, err)
			}
			return nil, "invalid_argument", err
		}
	}
	if err := s.count(ctx, c); err != nil {
		return s.storeFailed(req, err)
	}
	resp := answer(req, c)
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		return resp, "over_limit", nil
	}
	return resp, "ok", nil
}

// Bounds of a call: Envoy sends a descriptor per rate limit action of the route, a few
// entries each; a call past them is no Envoy's, and would hold one decision (one script call
// on Redis, which every tenant waits behind) for as long as its sender likes.
const (
	maxDescriptors = 64
	maxEntries     = 16
	maxValue       = 1024 // bytes of an entry's key or value
)

// check refuses a request Envoy would never send: no domain, no descriptor, an entry without
// a key, negative hits, past the bounds above.
func check(req *rlsv3.RateLimitRequest) error {
	if req.GetDomain() == "" {
		return invalid("domain", "must not be empty")
	}
	if n := len(req.GetDescriptors()); n == 0 || n > maxDescriptors {
		return invalid("descriptors", "must hold 1 to %d descriptors", maxDescriptors)
	}
	for i, d := range req.GetDescriptors() {
		field := fmt.Sprintf("descriptors[%d]", i)
		if n := len(d.GetEntries()); n == 0 || n > maxEntries {
			return invalid(field+".entries", "must hold 1 to %d entries", maxEntries)
		}
		for j, e := range d.GetEntries() {
			if e.GetKey() == "" || len(e.GetKey()) > maxValue {
				return invalid(fmt.Sprintf("%s.entries[%d].key", field, j), "must hold 1 to %d bytes", maxValue)
			}
			if len(e.GetValue()) > maxValue {
				return invalid(fmt.Sprintf("%s.entries[%d].value", field, j), "must hold at most %d bytes", maxValue)
			}
		}
		if d.GetIsNegativeHits() {
			return invalid(field+".is_negative_hits", "negative hits are not supported: the gateway gives units back itself")
		}
		if h := d.GetHitsAddend(); h != nil && h.GetValue() > limits.MaxLimit {
			return invalid(field+".hits_addend", "%d is above %d", h.GetValue(), int64(limits.MaxLimit))
		}
	}
	return nil
}

// collect maps req's descriptors to hits in c: requests limits take the descriptor's hits (0:
// checked), tokens limits are checked, and debited the hits first when there are any.
func (s *Service) collect(ctx context.Context, req *rlsv3.RateLimitRequest, dm *domain, c *call) error {
	pol := s.o.Engine.Policy()
	hits := uint64(max(req.GetHitsAddend(), 1))
	for i, d := range req.GetDescriptors() {
		m := c.mappingOf(dm, d)
		if m == nil {
			continue // unknown: counts nothing, answered OK
		}
		n := hits
		if h := d.GetHitsAddend(); h != nil {
			n = h.GetValue() // 0: check without counting
		}
		field := fmt.Sprintf("descriptors[%d].entries[%d].value", i, len(d.GetEntries())-1)
		value := c.values[len(c.values)-1]
		if value == "" {
			return invalid(field, "must not be empty: it is the tenant's id")
		}
		ten, ok, err := s.tenantOf(ctx, pol, m, value, field)
		if err != nil || !ok {
			return err // !ok: a key the registry does not know counts nothing
		}
		for _, name := range m.limits {
			l, ok := limitOf(pol, ten.planFor(pol, name), name)
			if !ok {
				continue // not enabled in the tenant's plan
			}
			id, err := ten.id(pol, l.By, field)
			if err != nil {
				return err
			}
			h := limits.Hit{Rule: l.Rule, ID: id}
			switch {
			case l.Rule.Unit == limits.Tokens && n > 0:
				c.debits = append(c.debits, limits.Hit{Rule: l.Rule, ID: id, Allow: l.Rule.Limit})
				c.debitN = append(c.debitN, int64(n))
			case n == 0:
				h.Check = true
			default:
				h.Units = int64(n)
			}
			if merged, err := c.merge(i, h, field); merged || err != nil {
				if err != nil {
					return err
				}
				continue
			}
			c.counts.Limits = append(c.counts.Limits, l)
			c.counts.Hits = append(c.counts.Hits, h)
			c.owner = append(c.owner, i)
			if c.counts.Org == "" {
				c.counts.Org, c.counts.Label = ten.org, ten.label
			}
		}
	}
	return nil
}

// merge adds h, descriptor i's hit, to the call's hit of the same counter (limit and id) when
// there is one: one decision takes each counter once, so two descriptors of one counter must
// take their units' sum, or each would be admitted against the count before the call and
// only one be counted. A sum past limits.MaxLimit is refused (it would overflow the counter).
func (c *call) merge(i int, h limits.Hit, field string) (bool, error) {
	for k := range c.counts.Hits {
		e := &c.counts.Hits[k]
		if e.Rule != h.Rule || e.ID != h.ID {
			continue
		}
		if !h.Check {
			units := max(e.Units, 0)
			if e.Check {
				units = 0
			}
			if units > limits.MaxLimit-h.Units {
				return false, invalid(field, "the descriptors counting this limit and tenant take more than %d units together", int64(limits.MaxLimit))
			}
			e.Units, e.Check = units+h.Units, false
		}
		c.shared = append(c.shared, [2]int{i, k})
		return true, nil
	}
	return false, nil
}

// mappingOf is the mapping of descriptor d in dm, or nil; c.values holds d's values after.
func (c *call) mappingOf(dm *domain, d *commonv3.RateLimitDescriptor) *mapping {
	c.keys.Reset()
	c.values = c.values[:0]
	for j, e := range d.GetEntries() {
		if j > 0 {
			c.keys.WriteByte(0)
		}
		c.keys.WriteString(e.GetKey())
		c.values = append(c.values, e.GetValue())
	}
	return dm.match(c.keys.String(), c.values)
}

// tenant is who a descriptor counts: its value, or the registered key a digest names.
type tenant struct {
	value      string
	key        *auth.Entry // registered key (id key_digest)
	org, label string
}

// tenantOf resolves a mapped descriptor's value; false for a digest the registry does not know.
func (s *Service) tenantOf(ctx context.Context, pol *policy.Policy, m *mapping, value, field string) (tenant, bool, error) {
	if !m.keyDigest {
		return tenant{value: value}, true, nil
	}
	digest, err := keyDigest(value, field)
	if err != nil {
		return tenant{}, false, err
	}
	if s.o.Registry == nil {
		return tenant{}, false, nil
	}
	e, ok, err := s.o.Registry.Lookup(ctx, digest)
	if err != nil {
		return tenant{}, false, fmt.Errorf("%w: key registry: %w", errStore, err)
	}
	if !ok || e.Revoked != nil {
		return tenant{}, false, nil
	}
	return tenant{value: digest, key: &e, org: e.Org, label: e.Label}, true, nil
}

// planFor is the plan the tenant's limit name counts in: a registered key's plan, else its
// org's; for a value, the org's plan when the limit counts by org, else the default plan.
func (t *tenant) planFor(pol *policy.Policy, name string) string {
	switch {
	case t.key != nil && t.key.Plan != "":
		return t.key.Plan
	case t.key != nil:
		return pol.PlanOf(t.key.Org)
	case pol.LimitBy(name) == policy.ByOrg:
		return pol.PlanOf(t.value)
	}
	return ""
}

// id is what a limit counting by b counts for the tenant, as the proxy counts it.
func (t *tenant) id(pol *policy.Policy, b policy.By, field string) (string, error) {
	if t.key != nil {
		if b == policy.ByOrg {
			return t.key.Org, nil
		}
		return t.key.Tenant(), nil // by key: the key's lineage (the config allows no other)
	}
	switch b {
	case policy.ByIP:
		a, err := netip.ParseAddr(t.value)
		if err != nil {
			return "", invalid(field, "%q is not an IP address (a limit by ip counts it)", t.value)
		}
		return pol.AddrID(a.Unmap()), nil
	case policy.ByKey:
		return keyDigest(t.value, field)
	case policy.ByOrg:
		if pol.Configured(t.value) {
			return t.value, nil
		}
	}
	return policy.SafeID(t.value), nil
}

// keyDigest checks a key's digest: 64 hexadecimal characters, returned in lower case.
func keyDigest(v, field string) (string, error) {
	if len(v) != 64 {
		return "", invalid(field, "not a key's SHA-256 digest (64 hexadecimal characters)")
	}
	if _, err := hex.DecodeString(v); err != nil {
		return "", invalid(field, "not a key's SHA-256 digest (64 hexadecimal characters)")
	}
	return strings.ToLower(v), nil
}

// limitOf is the limit name in plan, when enabled there.
func limitOf(pol *policy.Policy, plan, name string) (policy.Limit, bool) {
	for _, l := range pol.LimitsOfPlan(plan) {
		if l.Rule.Name == name {
			return l, true
		}
	}
	return policy.Limit{}, false
}

// count debits the spent tokens Envoy reports, then decides every hit at once.
func (s *Service) count(ctx context.Context, c *call) error {
	for len(c.debits) > 0 {
		// One store call per amount: a call's descriptors rarely report different ones.
		n, same, rest := c.debitN[0], c.debits[:0:0], c.debits[:0:0]
		var restN []int64
		for i, h := range c.debits {
			if c.debitN[i] == n {
				same = append(same, h)
			} else {
				rest, restN = append(rest, h), append(restN, c.debitN[i])
			}
		}
		if err := s.o.Engine.DebitTokens(ctx, same, n); err != nil {
			return fmt.Errorf("%w: debit: %w", errStore, err)
		}
		c.debits, c.debitN = rest, restN
	}
	if len(c.counts.Hits) == 0 {
		return nil
	}
	if err := s.o.Engine.Decide(ctx, &c.counts, &c.d); err != nil {
		return fmt.Errorf("%w: %w", errStore, err)
	}
	return nil
}

// storeFailed answers a call whose store (or registry) failed as redis.on_error says: OK
// counting nothing (allow), else UNAVAILABLE.
func (s *Service) storeFailed(req *rlsv3.RateLimitRequest, err error) (*rlsv3.RateLimitResponse, string, error) {
	s.o.Logger.Warn("rate limit service: store failed", zap.String("domain", req.GetDomain()), zap.Error(err))
	if s.o.AllowOnError {
		resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
		for range req.GetDescriptors() {
			resp.Statuses = append(resp.Statuses, &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK})
		}
		return resp, "allowed_on_error", nil
	}
	return nil, "unavailable", status.Error(codes.Unavailable, "rate limiting is temporarily unavailable (the quota store failed)")
}
