package limits

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

type windowKind uint8

const (
	kindDuration windowKind = iota // fixed windows aligned to the Unix epoch
	kindHour
	kindDay
	kindMonth
)

// Window is a limit's counting period: a calendar hour, day or month in UTC,
// or a fixed duration aligned to multiples of it since the Unix epoch.
type Window struct {
	kind windowKind
	secs int64 // length in seconds for kindDuration
}

// ParseWindow parses "hour", "day", "month" or a Go duration of whole seconds
// (at least 1s), e.g. "10s", "15m".
func ParseWindow(s string) (Window, error) {
	switch s {
	case "hour":
		return Window{kind: kindHour}, nil
	case "day":
		return Window{kind: kindDay}, nil
	case "month":
		return Window{kind: kindMonth}, nil
	case "":
		return Window{}, errors.New("limits: empty window")
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return Window{}, fmt.Errorf("limits: window %q: want hour, day, month or a duration: %w", s, err)
	}
	if d < time.Second || d%time.Second != 0 {
		return Window{}, fmt.Errorf("limits: window %q: must be whole seconds and at least 1s", s)
	}
	return Window{kind: kindDuration, secs: int64(d / time.Second)}, nil
}

// IsZero reports whether w is the zero Window (not parsed).
func (w Window) IsZero() bool { return w == Window{} }

// String returns "hour", "day", "month" or the duration (e.g. "15m0s").
// It is part of key names, so it must stay stable.
func (w Window) String() string {
	switch w.kind {
	case kindHour:
		return "hour"
	case kindDay:
		return "day"
	case kindMonth:
		return "month"
	}
	return (time.Duration(w.secs) * time.Second).String()
}

// Nominal returns the nominal length: 1h, 24h, 30*24h for a month, or the
// duration. It is the GCRA period and the RateLimit-Policy w= value.
func (w Window) Nominal() time.Duration {
	switch w.kind {
	case kindHour:
		return time.Hour
	case kindDay:
		return 24 * time.Hour
	case kindMonth:
		return 30 * 24 * time.Hour
	}
	return time.Duration(w.secs) * time.Second
}

// Bounds returns the window containing now: start <= now < end, in UTC.
func (w Window) Bounds(now time.Time) (start, end time.Time) {
	s, e := w.boundsUnix(now.Unix())
	return time.Unix(s, 0).UTC(), time.Unix(e, 0).UTC()
}

// boundsUnix is Bounds in Unix seconds. The Lua script mirrors it (windowLua);
// the tests compare the two.
func (w Window) boundsUnix(sec int64) (start, end int64) {
	switch w.kind {
	case kindHour:
		start = floorTo(sec, 3600)
		return start, start + 3600
	case kindDay:
		start = floorTo(sec, 86400)
		return start, start + 86400
	case kindMonth:
		t := time.Unix(sec, 0).UTC()
		y, m, _ := t.Date()
		s := time.Date(y, m, 1, 0, 0, 0, 0, time.UTC)
		return s.Unix(), s.AddDate(0, 1, 0).Unix()
	}
	n := w.secs
	if n <= 0 { // zero Window: treat as 1s rather than divide by zero
		n = 1
	}
	start = floorTo(sec, n)
	return start, start + n
}

// floorTo rounds sec down to a multiple of n (also for negative sec).
func floorTo(sec, n int64) int64 {
	r := sec % n
	if r < 0 {
		r += n
	}
	return sec - r
}

// luaSpec is how the script receives the window: "h", "d", "m" or seconds.
func (w Window) luaSpec() string {
	switch w.kind {
	case kindHour:
		return "h"
	case kindDay:
		return "d"
	case kindMonth:
		return "m"
	}
	return strconv.FormatInt(max(w.secs, 1), 10)
}

// windowOfSpec is the inverse of luaSpec (a counter hash's w); false for anything else.
func windowOfSpec(s string) (Window, bool) {
	switch s {
	case "h":
		return Window{kind: kindHour}, true
	case "d":
		return Window{kind: kindDay}, true
	case "m":
		return Window{kind: kindMonth}, true
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 1 {
		return Window{}, false
	}
	return Window{kind: kindDuration, secs: n}, true
}

// Algorithm selects how a rule counts.
type Algorithm uint8

const (
	// Fixed counts requests per window; the count resets when the window ends.
	Fixed Algorithm = iota
	// GCRA is the generic cell rate algorithm of redis_rate/v10 with
	// Rate = Burst = Limit and Period = the window's nominal length.
	GCRA
)

// ParseAlgorithm parses "fixed" (or "") and "gcra".
func ParseAlgorithm(s string) (Algorithm, error) {
	switch s {
	case "", "fixed":
		return Fixed, nil
	case "gcra":
		return GCRA, nil
	}
	return 0, fmt.Errorf("limits: unknown algorithm %q (want fixed or gcra)", s)
}

// String returns "fixed" or "gcra".
func (a Algorithm) String() string {
	if a == GCRA {
		return "gcra"
	}
	return "fixed"
}
