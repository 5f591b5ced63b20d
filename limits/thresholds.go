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

// marks says whether decisions under r mark crossings: a fixed-window requests limit with
// thresholds, or an enforced one reporting exhaustion.
func marks(r *Rule) bool {
	return r.Algorithm == Fixed && r.Unit == Requests && (r.Thresholds.n > 0 || r.Exhausted && !r.Shadow)
}

// marksSpec is the spec's word of the marks: " x<e>:<ppm>,<ppm>..." (e: 1 to report the
// first refusal), or "" for a rule that marks nothing.
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
