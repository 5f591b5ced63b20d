package limits

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/docsgate/gateway/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func mustWindow(t testing.TB, s string) Window {
	t.Helper()
	w, err := ParseWindow(s)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func TestParseWindow(t *testing.T) {
	for _, tc := range []struct {
		in, str string
		nominal time.Duration
	}{
		{"hour", "hour", time.Hour},
		{"day", "day", 24 * time.Hour},
		{"month", "month", 30 * 24 * time.Hour},
		{"10s", "10s", 10 * time.Second},
		{"15m", "15m0s", 15 * time.Minute},
		{"1s", "1s", time.Second},
	} {
		w := mustWindow(t, tc.in)
		if w.String() != tc.str || w.Nominal() != tc.nominal {
			t.Errorf("%q: String %q Nominal %v, want %q %v", tc.in, w.String(), w.Nominal(), tc.str, tc.nominal)
		}
	}
	for _, bad := range []string{"", "week", "500ms", "1.5s", "-1s", "0s", "abc"} {
		if _, err := ParseWindow(bad); err == nil {
			t.Errorf("ParseWindow(%q) succeeded", bad)
		}
	}
}

func TestParseAlgorithm(t *testing.T) {
	for in, want := range map[string]Algorithm{"": Fixed, "fixed": Fixed, "gcra": GCRA} {
		if a, err := ParseAlgorithm(in); err != nil || a != want {
			t.Errorf("ParseAlgorithm(%q) = %v, %v", in, a, err)
		}
	}
	if _, err := ParseAlgorithm("sliding"); err == nil {
		t.Error("ParseAlgorithm(sliding) succeeded")
	}
}

func utc(y int, m time.Month, d, h, mi, s int) time.Time {
	return time.Date(y, m, d, h, mi, s, 0, time.UTC)
}

func TestBounds(t *testing.T) {
	for _, tc := range []struct {
		win        string
		now        time.Time
		start, end time.Time
	}{
		{"month", utc(2024, 1, 31, 23, 59, 59), utc(2024, 1, 1, 0, 0, 0), utc(2024, 2, 1, 0, 0, 0)},
		{"month", utc(2024, 2, 29, 12, 0, 0), utc(2024, 2, 1, 0, 0, 0), utc(2024, 3, 1, 0, 0, 0)},
		{"month", utc(2023, 2, 28, 23, 59, 59), utc(2023, 2, 1, 0, 0, 0), utc(2023, 3, 1, 0, 0, 0)},
		{"month", utc(2023, 12, 31, 23, 59, 59), utc(2023, 12, 1, 0, 0, 0), utc(2024, 1, 1, 0, 0, 0)},
		{"month", utc(2024, 1, 1, 0, 0, 0), utc(2024, 1, 1, 0, 0, 0), utc(2024, 2, 1, 0, 0, 0)},
		{"month", utc(2100, 2, 15, 0, 0, 0), utc(2100, 2, 1, 0, 0, 0), utc(2100, 3, 1, 0, 0, 0)},
		{"day", utc(2024, 3, 10, 13, 5, 0), utc(2024, 3, 10, 0, 0, 0), utc(2024, 3, 11, 0, 0, 0)},
		{"hour", utc(2024, 3, 10, 13, 5, 7), utc(2024, 3, 10, 13, 0, 0), utc(2024, 3, 10, 14, 0, 0)},
		{"15m", utc(2024, 3, 10, 13, 44, 59), utc(2024, 3, 10, 13, 30, 0), utc(2024, 3, 10, 13, 45, 0)},
		{"7s", time.Unix(20, 0), time.Unix(14, 0).UTC(), time.Unix(21, 0).UTC()},
	} {
		s, e := mustWindow(t, tc.win).Bounds(tc.now)
		if !s.Equal(tc.start) || !e.Equal(tc.end) {
			t.Errorf("%s at %v: got [%v, %v), want [%v, %v)", tc.win, tc.now, s, e, tc.start, tc.end)
		}
	}
	// A non-UTC time is bucketed in UTC.
	loc := time.FixedZone("x", -5*3600)
	s, _ := mustWindow(t, "month").Bounds(time.Date(2024, 1, 31, 22, 0, 0, 0, loc)) // Feb 1 03:00 UTC
	if !s.Equal(utc(2024, 2, 1, 0, 0, 0)) {
		t.Errorf("month start in UTC = %v", s)
	}
}

// boundsTestLua exposes the script's window arithmetic (the same windowLua
// text as takeLua) for arbitrary timestamps.
var boundsTestScript = redis.NewScript(windowLua + `
local s, e = bounds(ARGV[1], tonumber(ARGV[2]))
return {s, e}
`)

// TestLuaBoundsMatchGo checks the Lua calendar arithmetic against Go's
// time package on month/year/leap boundaries and random instants.
func TestLuaBoundsMatchGo(t *testing.T) {
	t.Parallel() // servers of its own, and no latency bound
	c := redistest.Start(t).Client(t)
	ctx := context.Background()
	var instants []int64
	for y := 1999; y <= 2101; y++ {
		for m := time.January; m <= time.December; m++ {
			b := utc(y, m, 1, 0, 0, 0).Unix()
			instants = append(instants, b-1, b, b+1)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 500 {
		instants = append(instants, rng.Int64N(4102444800)) // 1970..2100
	}
	for _, win := range []string{"month", "day", "hour", "15m", "7s"} {
		w := mustWindow(t, win)
		for _, sec := range instants {
			v, err := boundsTestScript.Run(ctx, c, nil, w.luaSpec(), sec).Int64Slice()
			if err != nil {
				t.Fatal(err)
			}
			s, e := w.boundsUnix(sec)
			if len(v) != 2 || v[0] != s || v[1] != e {
				t.Fatalf("%s at %d (%v): lua %v, go [%d %d]", win, sec, time.Unix(sec, 0).UTC(), v, s, e)
			}
		}
	}
}
