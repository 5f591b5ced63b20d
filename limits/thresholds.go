package limits

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// MaxThresholds bounds the thresholds of one limit.
const MaxThresholds = 8

// Thresholds are the fractions of a limit's allowance whose crossing a decision reports, kept
// in millionths, increasing. A value, so that a Rule stays comparable.
type Thresholds struct {
	n   uint8
	ppm [MaxThresholds]uint32
}

// NewThresholds checks and converts fractions in (0, 1], increasing, at most MaxThresholds.
func NewThresholds(fs ...float64) (Thresholds, error) {
	var t Thresholds
	if len(fs) > MaxThresholds {
		return t, fmt.Errorf("limits: %d thresholds: at most %d", len(fs), MaxThresholds)
	}
	for i, f := range fs {
		p := uint32(math.Round(f * 1e6))
		if !(f > 0 && f <= 1) || p == 0 || i > 0 && p <= t.ppm[i-1] {
			return Thresholds{}, fmt.Errorf("limits: thresholds %v: want fractions in (0, 1], increasing", fs)
		}
		t.ppm[i] = p
	}
	t.n = uint8(len(fs))
	return t, nil
}

// Len is the number of thresholds.
func (t Thresholds) Len() int { return int(t.n) }

// At is the i-th threshold as a fraction.
func (t Thresholds) At(i int) float64 { return float64(t.ppm[i]) / 1e6 }

// reached is how many thresholds used units of allow reach: those with used×10⁶ ≥
// ppm×allow, computed in doubles exactly as the take script does, so both stores agree.
func (t Thresholds) reached(used, allow int64) int {
	if allow <= 0 {
		return 0
	}
	k := 0
	for i := range int(t.n) {
		if float64(used)*1e6 >= float64(t.ppm[i])*float64(allow) {
			k = i + 1
		}
	}
	return k
}

// CrossedExhausted is the bit of Result.Crossed for a tenant's first refusal in a window.
const CrossedExhausted = 1 << MaxThresholds

// CrossedForecast is the bit of Result.Crossed for the first decision of a window after
// which, at the window's burn rate so far, the tenant runs out before the window ends
// (Rule.Forecast; see forecasts).
const CrossedForecast = 1 << (MaxThresholds + 1)

// crossedMax is the largest Result.Crossed.
const crossedMax = 1<<(MaxThresholds+2) - 1

// marks says whether decisions under r mark crossings: a fixed-window requests or tokens
// limit with thresholds or a forecast, or an enforced one reporting exhaustion.
func marks(r *Rule) bool {
	return r.Algorithm == Fixed && (r.Unit == Requests || r.Unit == Tokens) &&
		(r.Thresholds.n > 0 || r.Exhausted && !r.Shadow || r.Forecast)
}

// forecasts says whether a tenant that has used used units of allow by now (µs) in the window
// [ws, we) (seconds) runs out before we at the rate it has spent so far: computed in doubles
// exactly as the scripts' forecast does, so both stores agree. A forecast needs a trend: at
// least a twentieth of the window gone and a twentieth of the allowance used, so that the
// first requests of a window never forecast anything.
func forecasts(used, allow, ws, we, now int64) bool {
	if allow <= 0 || used >= allow {
		return false
	}
	elapsed, span := float64(now)-float64(ws)*1e6, (float64(we)-float64(ws))*1e6
	return elapsed*20 >= span && float64(used)*20 >= float64(allow) && elapsed*float64(allow) < float64(used)*span
}

// marksSpec is the spec's word of the marks: " x<e><f>:<ppm>,<ppm>..." (e: 1 to report the
// first refusal; f: 1 to forecast), or "" for a rule that marks nothing.
func marksSpec(r *Rule) string {
	if !marks(r) {
		return ""
	}
	var b strings.Builder
	b.WriteString(" x")
	if r.Exhausted && !r.Shadow {
		b.WriteByte('1')
	} else {
		b.WriteByte('0')
	}
	if r.Forecast {
		b.WriteByte('1')
	} else {
		b.WriteByte('0')
	}
	b.WriteByte(':')
	t := r.Thresholds
	for i := range int(t.n) {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatUint(uint64(t.ppm[i]), 10))
	}
	return b.String()
}

// cross marks in e what its count of allow is the first in the window [ws, we) to reach at
// now (µs): thresholds and the forecast (takeLua's and chargeLua's cross), and returns their
// bits of Result.Crossed.
func (e *memEntry) cross(r *Rule, allow, ws, we, now int64) uint16 {
	var bits uint16
	if k := r.Thresholds.reached(e.n, allow); k > int(e.reached) {
		for j := int(e.reached); j < k; j++ {
			bits |= 1 << j
		}
		e.reached = uint8(k)
	}
	if r.Forecast && !e.forecast && forecasts(e.n, allow, ws, we, now) {
		e.forecast = true
		bits |= CrossedForecast
	}
	return bits
}

// Crossed is what a charge of tokens (Debit, Settle) was the first in its window to reach on
// one tokens limit: thresholds of the allowance the admitting decision applied (Hit.Allow),
// the forecast. A charge has no Decision to carry it, so the stores report it to the function
// given by WithCrossings (Redis) or WithMemoryCrossings (in process).
type Crossed struct {
	Rule        *Rule
	ID          string
	Bits        uint16 // as Result.Crossed
	WindowStart int64  // Unix seconds
	// Used is the count after the charge and Held what the live holds keep (as Result.Used
	// and Result.Held); Allow the allowance the crossing is measured against.
	Used, Held, Allow int64
}

// WithCrossings makes the store report the crossings of its charges of tokens to f, which
// must only hand them over (it runs after the store's call, on the charging goroutine).
func WithCrossings(f func(Crossed)) RedisOption {
	return func(r *Redis) { r.onCrossed = f }
}

// WithMemoryCrossings is WithCrossings for the in-process store.
func WithMemoryCrossings(f func(Crossed)) MemoryOption {
	return func(m *Memory) { m.onCrossed = f }
}

// report hands each charge's crossing to f, if any.
func report(f func(Crossed), cs []Crossed) {
	if f == nil {
		return
	}
	for _, c := range cs {
		f(c)
	}
}
