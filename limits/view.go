package limits

import (
	"math"
	"time"
)

// View is one limit as its usage answers show it: the tenant's own GET /gateway/usage on the
// public listener and the operators' GET /usage/... on the admin listener are written from it,
// so both read the same counters the same way.
//
// The fields keep the order the admin answers had before window, reset_seconds and forecast
// were added (JSON objects have none, but scripts matching text may).
type View struct {
	Name string `json:"name"`
	Unit string `json:"unit"`
	// Limit is the allowance: the override in force, else the limit, plus the grants of the
	// window.
	Limit int64 `json:"limit"`
	Used  int64 `json:"used"`
	// Reserved is what the holds of answers in flight keep of a tokens limit with a reserve
	// (0 for other limits); Remaining is net of it.
	Reserved  int64 `json:"reserved"`
	Remaining int64 `json:"remaining"`
	// Reset is when the window ends (fixed windows), the bucket is full again (GCRA) or, for
	// streams, now; rounded up to the second, as ResetSeconds is.
	Reset        time.Time `json:"reset"`
	ResetSeconds int64     `json:"reset_seconds"`
	// Window is the counting window ("hour", "day", "month" or a duration such as "15m0s");
	// nil for a streams limit, which counts answers in flight.
	Window *string `json:"window"`
	// Forecast is the burn rate of the current window and when it runs out at that rate, for
	// enforced fixed-window limits (requests and tokens); nil (null) for the others.
	Forecast *Forecast `json:"forecast"`
	// Granted and Override are the tenant's run-time quota, where present; operators' answers
	// only.
	Granted  int64          `json:"granted,omitempty"`
	Override *OverrideTerms `json:"override,omitempty"`
}

// Forecast extrapolates a window's use so far.
type Forecast struct {
	// RatePerHour is the units used in the current window per hour of it so far.
	RatePerHour float64 `json:"rate_per_hour"`
	// RunsOutAt is when the remaining units are used at that rate; nil (null) when that is
	// not before the window's end, or nothing was used yet.
	RunsOutAt *time.Time `json:"runs_out_at"`
}

// minElapsed keeps a window's first second from extrapolating one unit into thousands an hour.
const minElapsed = time.Second

// NewView is the view of u, a counter of rule r, read at now.
//
// The forecast is for enforced fixed-window limits only. A GCRA bucket has no window to burn
// through: it refills continuously, so its remaining count already is what can be spent now,
// and a rate over a window it does not have would mislead; a streams limit counts answers in
// flight, not a rate; a shadow limit never refuses, so it never runs out.
func NewView(r *Rule, u Usage, now time.Time) View {
	v := View{
		Name: u.Name, Unit: u.Unit.String(), Limit: u.Limit, Used: u.Used, Reserved: u.Reserved,
		Remaining: u.Remaining, Granted: u.Granted, Override: u.Override,
	}
	reset := u.Reset
	if reset.Before(now) {
		reset = now
	}
	v.Reset = reset.UTC().Add(time.Second - 1).Truncate(time.Second)
	v.ResetSeconds = int64((reset.Sub(now) + time.Second - 1) / time.Second)
	if r.Unit != Streams {
		w := r.Window.String()
		v.Window = &w
	}
	if r.Unit == Streams || r.Algorithm != Fixed || r.Shadow || r.Window.IsZero() {
		return v
	}
	start, _ := r.Window.Bounds(u.Reset.Add(-time.Nanosecond))
	elapsed := max(now.Sub(start), minElapsed)
	f := &Forecast{RatePerHour: math.Round(float64(u.Used)/elapsed.Hours()*1000) / 1000}
	if u.Used > 0 {
		// remaining / rate, compared before it becomes a Duration (which a month's
		// allowance at a slow burn would overflow)
		left := float64(u.Remaining) / float64(u.Used) * float64(elapsed)
		if left < float64(u.Reset.Sub(now)) {
			at := now.Add(time.Duration(left)).UTC().Truncate(time.Second)
			f.RunsOutAt = &at
		}
	}
	v.Forecast = f
	return v
}
