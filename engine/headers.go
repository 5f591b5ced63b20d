package engine

import (
	"strconv"
	"time"

	"github.com/docsgate/gateway/limits"
	"github.com/docsgate/gateway/policy"
)

// What a decision tells the client, the same on every front door: the rate-limit headers'
// values, and when a denying limit admits again.

// HeaderValues are the rate-limit headers of a decision, both generations clients parse
// today: the IETF draft's RateLimit (every limit: remaining and seconds to reset) and the
// older RateLimit-Limit, -Remaining and -Reset of the enforced limit with the least remaining
// (a shadow limit never denies, so a client must not back off for it); those three are empty
// when only shadow limits decided. RateLimit-Policy is the set's (policy.LimitSet.PolicyFor).
type HeaderValues struct {
	RateLimit               string
	Limit, Remaining, Reset string
}

// RateLimitHeaders renders the headers of decision d of the limits ls (in the decision's
// order), appending to buf, which it returns for reuse: all values are cut from one string, so
// the headers cost one allocation.
func RateLimitHeaders(buf []byte, d *limits.Decision, ls []policy.Limit) (HeaderValues, []byte) {
	least := -1
	for i := range d.Results {
		res := &d.Results[i]
		if i > 0 {
			buf = append(buf, ", "...)
		}
		buf = append(buf, '"')
		buf = append(buf, res.Rule.Name...)
		buf = append(buf, `";r=`...)
		buf = strconv.AppendInt(buf, res.Remaining, 10)
		buf = append(buf, ";t="...)
		buf = strconv.AppendInt(buf, resetSeconds(res), 10)
		if !ls[i].Shadow && (least < 0 || res.Remaining < d.Results[least].Remaining) {
			least = i
		}
	}
	ends := [4]int{len(buf)}
	if least < 0 { // only shadow limits: the draft header alone
		return HeaderValues{RateLimit: string(buf)}, buf
	}
	res := &d.Results[least]
	buf = strconv.AppendInt(buf, res.Limit, 10) // the allowance: the tenant's override and grants included
	ends[1] = len(buf)
	buf = strconv.AppendInt(buf, res.Remaining, 10)
	ends[2] = len(buf)
	// The legacy header keeps its meaning: when the limit is whole again (a GCRA bucket
	// full), not when it admits the next request (that is Retry-After).
	buf = strconv.AppendInt(buf, Seconds(res.Reset), 10)
	ends[3] = len(buf)
	all := string(buf)
	return HeaderValues{RateLimit: all[:ends[0]], Limit: all[ends[0]:ends[1]], Remaining: all[ends[1]:ends[2]], Reset: all[ends[2]:ends[3]]}, buf
}

// Denial is the index in d of the limit a denied request names: the first enforced limit that
// denied.
func Denial(d *limits.Decision, ls []policy.Limit) int {
	for i, l := range ls {
		if !d.Results[i].Allowed && !l.Shadow {
			return i
		}
	}
	return d.Denied()
}

// resetSeconds is a limit's t: when it admits again if it denied, else when it resets.
func resetSeconds(res *limits.Result) int64 {
	if !res.Allowed {
		return Seconds(UntilAdmitted(res))
	}
	return Seconds(res.Reset)
}

// UntilAdmitted is how long a denying limit takes to admit a request again, as the store
// said: the end of the window for a fixed window, the next emission for GCRA (which refills
// one unit at a time, long before the bucket is full again), and no later than the end of
// the tenant's override (an override of 0 admits nothing before it).
func UntilAdmitted(res *limits.Result) time.Duration {
	if res.Rule.Algorithm == limits.GCRA || res.RetryAfter > 0 {
		return res.RetryAfter
	}
	return res.Reset
}

// Seconds rounds up, so a client waiting that long is never early.
func Seconds(d time.Duration) int64 {
	return int64((d + time.Second - 1) / time.Second)
}
