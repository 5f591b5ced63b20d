package proxy

import (
	"time"

	"github.com/docsgate/gateway/limits"
)

// Crossing is what one decision was the first in its window to reach on one limit, for a
// tenant: thresholds of the allowance in force, its first refusal (limits.Result.Crossed).
// The stores mark what they report in the tenant's counter, so each is reported once per
// tenant and window whatever the replicas.
type Crossing struct {
	Limit       string
	Tenant      string // the id the limit counts by (a key's digest, never a key)
	By          string // project, key, org or ip
	Org         string // the request's org, when known
	WindowStart time.Time
	Used        int64 // the tenant's use after the decision
	Quota       int64 // the allowance in force: the limit or override, plus grants
	// Thresholds reached, as fractions of Quota; Exhausted: the tenant's first refusal.
	Thresholds []float64
	Exhausted  bool
	Time       time.Time
}

// reportCrossings hands what dec crossed to Options.Crossings; nothing, most of the time.
func (g *Gateway) reportCrossings(s *scope, set *limitSet, hits []limits.Hit, dec *limits.Decision) {
	for i, l := range set.limits {
		res := &dec.Results[i]
		if res.Crossed == 0 {
			continue
		}
		c := Crossing{Limit: l.rule.Name, Tenant: hits[i].ID, By: l.by.String(), Org: s.org,
			WindowStart: time.Unix(res.WindowStart, 0).UTC(), Used: max(res.Limit-res.Remaining, 0), Quota: res.Limit,
			Exhausted: res.Crossed&limits.CrossedExhausted != 0, Time: s.start}
		for j := range l.rule.Thresholds.Len() {
			if res.Crossed&(1<<j) != 0 {
				c.Thresholds = append(c.Thresholds, l.rule.Thresholds.At(j))
			}
		}
		g.crossings(c)
	}
}
