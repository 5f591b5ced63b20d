package limits

import (
	"testing"
	"time"
)

func TestViewForecast(t *testing.T) {
	hour := mustWindow(t, "hour")
	start := time.Date(2026, 11, 27, 13, 0, 0, 0, time.UTC)
	end := start.Add(time.Hour)
	req := &Rule{Name: "r", Limit: 50, Window: hour}
	cases := []struct {
		name      string
		r         *Rule
		u         Usage
		now       time.Time
		rate      float64 // -1: no forecast
		runsOutAt string  // "": null
	}{
		// 30 in the first 20 minutes: 90 an hour; the 20 left last 13m20s more.
		{"burning", req, Usage{Used: 30, Remaining: 20, Reset: end}, start.Add(20 * time.Minute), 90, "2026-11-27T13:33:20Z"},
		// 10 in 40 minutes: 15 an hour; the 40 left would last 160 minutes, past the reset.
		{"slow", req, Usage{Used: 10, Remaining: 40, Reset: end}, start.Add(40 * time.Minute), 15, ""},
		{"unused", req, Usage{Used: 0, Remaining: 50, Reset: end}, start.Add(5 * time.Minute), 0, ""},
		// Spent: it ran out now.
		{"spent", req, Usage{Used: 50, Remaining: 0, Reset: end}, start.Add(30 * time.Minute), 100, "2026-11-27T13:30:00Z"},
		// The first second of a window does not extrapolate from a few milliseconds.
		{"first instant", req, Usage{Used: 1, Remaining: 49, Reset: end}, start.Add(time.Millisecond), 3600, "2026-11-27T13:00:49Z"},
		// Tokens: what is left net of the holds, at the rate of what was used.
		{"tokens", &Rule{Name: "t", Limit: 1000, Window: hour, Unit: Tokens, Reserve: 100},
			Usage{Used: 600, Reserved: 200, Remaining: 200, Reset: end, Unit: Tokens}, start.Add(30 * time.Minute), 1200, "2026-11-27T13:40:00Z"},
		{"gcra", &Rule{Name: "g", Limit: 50, Window: hour, Algorithm: GCRA}, Usage{Used: 30, Remaining: 20, Reset: start.Add(36 * time.Minute)}, start.Add(time.Minute), -1, ""},
		{"streams", &Rule{Name: "s", Limit: 5, Unit: Streams}, Usage{Used: 2, Remaining: 3, Reset: start, Unit: Streams}, start, -1, ""},
		{"shadow", &Rule{Name: "r", Limit: 50, Window: hour, Shadow: true}, Usage{Used: 30, Remaining: 20, Reset: end}, start.Add(20 * time.Minute), -1, ""},
	}
	for _, c := range cases {
		v := NewView(c.r, c.u, c.now)
		if c.rate < 0 {
			if v.Forecast != nil {
				t.Errorf("%s: forecast %+v, want none", c.name, v.Forecast)
			}
			continue
		}
		if v.Forecast == nil || v.Forecast.RatePerHour != c.rate {
			t.Errorf("%s: forecast %+v, want rate %v", c.name, v.Forecast, c.rate)
			continue
		}
		got := ""
		if v.Forecast.RunsOutAt != nil {
			got = v.Forecast.RunsOutAt.Format(time.RFC3339)
		}
		if got != c.runsOutAt {
			t.Errorf("%s: runs out at %q, want %q", c.name, got, c.runsOutAt)
		}
	}
	v := NewView(req, Usage{Used: 1, Remaining: 49, Reset: end}, start.Add(20*time.Minute+500*time.Millisecond))
	if v.ResetSeconds != 2400 || !v.Reset.Equal(end) || *v.Window != "hour" {
		t.Errorf("reset: %+v", v)
	}
	if v := NewView(&Rule{Name: "s", Limit: 5, Unit: Streams}, Usage{Reset: start}, start); v.Window != nil || v.ResetSeconds != 0 {
		t.Errorf("streams: %+v", v)
	}
	// A month's allowance at a slow burn does not overflow the duration.
	month := &Rule{Name: "m", Limit: MaxLimit, Window: mustWindow(t, "month")}
	mEnd := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	if v := NewView(month, Usage{Used: 1, Remaining: MaxLimit - 1, Reset: mEnd}, mEnd.Add(-time.Hour)); v.Forecast == nil || v.Forecast.RunsOutAt != nil {
		t.Errorf("month: %+v", v.Forecast)
	}
}
