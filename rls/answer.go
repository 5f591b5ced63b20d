package rls

import (
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/docsgate/gateway/engine"
	"github.com/docsgate/gateway/limits"
	"github.com/docsgate/gateway/policy"
)

// answer is the response to req of the decision in c: one status per descriptor, in order
// (OK with no limit for a descriptor nothing maps), OVER_LIMIT overall when any is, and the
// RateLimit headers the proxy sends for the same decision.
func answer(req *rlsv3.RateLimitRequest, c *call) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(req.GetDescriptors())),
	}
	res := c.d.Results
	for i := range resp.Statuses {
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		if k := shown(c, i); k >= 0 {
			r := &res[k]
			if !r.Allowed && !c.counts.Limits[k].Shadow {
				st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
				resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
			}
			st.CurrentLimit = rateLimit(r)
			st.LimitRemaining = clamp32(r.Remaining)
			until := r.Reset
			if !r.Allowed {
				until = engine.UntilAdmitted(r)
			}
			st.DurationUntilReset = durationpb.New(until)
		}
		resp.Statuses[i] = st
	}
	if len(res) > 0 {
		resp.ResponseHeadersToAdd = c.headers(resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT)
	}
	return resp
}

// shown is the hit whose limit descriptor i's status shows: the first enforced limit that
// denied, else the enforced limit with the least remaining, else (shadow limits alone) the
// first; -1 for a descriptor nothing counts.
func shown(c *call, i int) int {
	best := -1
	for k, o := range c.owner {
		if o != i && !slices.Contains(c.shared, [2]int{i, k}) {
			continue
		}
		r, shadow := &c.d.Results[k], c.counts.Limits[k].Shadow
		switch {
		case best < 0:
			best = k
		case !r.Allowed && !shadow:
			if b := &c.d.Results[best]; b.Allowed || c.counts.Limits[best].Shadow {
				best = k
			}
		case !shadow && (c.counts.Limits[best].Shadow || c.d.Results[best].Allowed && r.Remaining < c.d.Results[best].Remaining):
			best = k
		}
	}
	return best
}

// rateLimit is a limit as Envoy shows it: its name, its allowance (the tenant's override and
// grants included) and its window as a unit times a multiplier (a 10m window: MINUTE × 10).
func rateLimit(r *limits.Result) *rlsv3.RateLimitResponse_RateLimit {
	rl := &rlsv3.RateLimitResponse_RateLimit{Name: r.Rule.Name, RequestsPerUnit: clamp32(r.Limit)}
	w := r.Rule.Window
	switch d := w.Nominal(); {
	case w.String() == "month":
		rl.Unit = rlsv3.RateLimitResponse_RateLimit_MONTH
	case d == 0: // streams: no window
	case d%(24*time.Hour) == 0:
		rl.Unit, rl.UnitMultiplier = rlsv3.RateLimitResponse_RateLimit_DAY, multiplier(d/(24*time.Hour))
	case d%time.Hour == 0:
		rl.Unit, rl.UnitMultiplier = rlsv3.RateLimitResponse_RateLimit_HOUR, multiplier(d/time.Hour)
	case d%time.Minute == 0:
		rl.Unit, rl.UnitMultiplier = rlsv3.RateLimitResponse_RateLimit_MINUTE, multiplier(d/time.Minute)
	default:
		rl.Unit, rl.UnitMultiplier = rlsv3.RateLimitResponse_RateLimit_SECOND, multiplier(d/time.Second)
	}
	return rl
}

// multiplier is a unit multiplier, nil for 1 (Envoy's default).
func multiplier(n time.Duration) *wrapperspb.UInt32Value {
	if n == 1 {
		return nil
	}
	return wrapperspb.UInt32(clamp32(int64(n)))
}

func clamp32(n int64) uint32 { return uint32(min(max(n, 0), math.MaxUint32)) }

// headers are the RateLimit headers the proxy sends for the decision (RateLimit, its legacy
// trio, RateLimit-Policy), and Retry-After when refused.
func (c *call) headers(refused bool) []*corev3.HeaderValue {
	dec := &c.d.Decision
	var v engine.HeaderValues
	v, c.buf = engine.RateLimitHeaders(c.buf[:0], dec, c.counts.Limits)
	hs := []*corev3.HeaderValue{{Key: "RateLimit", Value: v.RateLimit}, {Key: "RateLimit-Policy", Value: policyValue(dec, c.counts.Limits)}}
	if v.Limit != "" {
		hs = append(hs, &corev3.HeaderValue{Key: "RateLimit-Limit", Value: v.Limit},
			&corev3.HeaderValue{Key: "RateLimit-Remaining", Value: v.Remaining},
			&corev3.HeaderValue{Key: "RateLimit-Reset", Value: v.Reset})
	}
	if refused {
		r := &dec.Results[engine.Denial(dec, c.counts.Limits)]
		hs = append(hs, &corev3.HeaderValue{Key: "Retry-After", Value: strconv.FormatInt(engine.Seconds(engine.UntilAdmitted(r)), 10)})
	}
	return hs
}

// policyValue is the RateLimit-Policy of the decision: each limit with the allowance applied.
func policyValue(dec *limits.Decision, ls []policy.Limit) string {
	parts := make([]string, len(ls))
	for i := range ls {
		parts[i] = policy.PolicyItem(ls[i].Rule, dec.Results[i].Limit)
	}
	return strings.Join(parts, ", ")
}
