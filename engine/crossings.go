package engine

import (
	"time"

	"github.com/docsgate/gateway/limits"
	"github.com/docsgate/gateway/policy"
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
	Label       string // the registered key's label, when known
	WindowStart time.Time
	// Unit is what the limit counts, requests or tokens: each unit has a counter of its own
	// (a change of unit starts one), which reports its crossings on its own.
	Unit string
	// Used is the tenant's counter after the decision or charge, as usage read-back shows
	// it (/usage's used); Reserved, for a tokens limit with a reserve (Reserves), what the
	// answers in flight hold besides (/usage's reserved).
	Used     int64
	Reserved int64
	Reserves bool
	Quota    int64 // the allowance in force: the limit or override, plus grants
	// Thresholds reached, as fractions of Quota; Exhausted: the tenant's first refusal;
	// Forecast: at the window's rate so far, the tenant runs out before the window ends.
	Thresholds []float64
	Exhausted  bool
	Forecast   bool
	Time       time.Time
}

// reportCrossings hands what the decision crossed to Options.Crossings; nothing, most of the
// time.
func (e *Engine) reportCrossings(ls []policy.Limit, org, label string, start time.Time, d *Decision) {
	for i, l := range ls {
		res := &d.Results[i]
		bits := res.Crossed
		if !d.Allowed {
			// Refused: nothing was counted (on a Cluster, another node's units were given
			// back), so only a first refusal is news.
			bits &= limits.CrossedExhausted
		}
		if bits == 0 {
			continue
		}
		c := CrossingOf(l.Rule, bits)
		c.Tenant, c.By, c.Org, c.Label, c.Time = d.Hits[i].ID, l.By.String(), org, label, start
		c.WindowStart, c.Used, c.Reserved, c.Quota = time.Unix(res.WindowStart, 0).UTC(), res.Used, res.Held, res.Limit
		e.o.Crossings(c)
	}
}

// CrossingOf is the crossing the bits of limits.Result.Crossed (or limits.Crossed) say a
// decision or a charge made on rule: the limit's name, its unit and what was reached. The
// caller fills in the tenant and the numbers.
func CrossingOf(rule *limits.Rule, bits uint16) Crossing {
	c := Crossing{Limit: rule.Name, Unit: rule.Unit.String(), Reserves: rule.Unit == limits.Tokens && rule.Reserve > 0,
		Exhausted: bits&limits.CrossedExhausted != 0, Forecast: bits&limits.CrossedForecast != 0}
	for j := range rule.Thresholds.Len() {
		if bits&(1<<j) != 0 {
			c.Thresholds = append(c.Thresholds, rule.Thresholds.At(j))
		}
	}
	return c
}
