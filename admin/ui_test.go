package admin

import (
	"testing"
	"time"

	"github.com/docsgate/gateway/limits"
)

func TestPercentText(t *testing.T) {
	for _, c := range []struct {
		pct  float64
		want string
	}{
		{0, "0.0%"},
		{0.04, "<0.1%"},
		{0.099, "<0.1%"},
		{0.1, "0.1%"},
		{22.5, "22.5%"},
		{100, "100.0%"},
		{250, "250.0%"},
	} {
		if got := percentText(c.pct); got != c.want {
			t.Errorf("percentText(%v) = %q, want %q", c.pct, got, c.want)
		}
	}
}

func TestRefusalLines(t *testing.T) {
	r := limits.Refusals{WindowStart: time.Unix(3600, 0), InWindow: 2, Total: 5, ShadowInWindow: 1, ShadowTotal: 4}
	for _, c := range []struct {
		mode   string
		shadow []bool
	}{
		{"enforce", []bool{false}},
		{"shadow", []bool{true}},
		{"mixed", []bool{false, true}},
	} {
		lines := refusals(c.mode, r)
		if len(lines) != len(c.shadow) {
			t.Fatalf("%s: %d lines", c.mode, len(lines))
		}
		for i, l := range lines {
			want := [2]int64{r.InWindow, r.Total}
			if l.Shadow {
				want = [2]int64{r.ShadowInWindow, r.ShadowTotal}
			}
			if l.Shadow != c.shadow[i] || [2]int64{l.InWindow, l.Total} != want {
				t.Errorf("%s line %d: %+v", c.mode, i, l)
			}
		}
	}
}
