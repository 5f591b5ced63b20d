package days

import (
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"90d": 90 * Day, "0d": 0, "36h": 36 * time.Hour, "0": 0, "1h30m": 90 * time.Minute,
	} {
		got, err := Parse(in)
		if err != nil || got != want {
			t.Errorf("Parse(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "d", "-1d", "1.5d", "99999d", "90", "ninety days", "1w"} {
		if got, err := Parse(in); err == nil {
			t.Errorf("Parse(%q) = %v, want an error", in, got)
		}
	}
}

func TestFormat(t *testing.T) {
	for d, want := range map[time.Duration]string{90 * Day: "90d", 36 * time.Hour: "36h0m0s", 0: "0s"} {
		if got := Format(d); got != want {
			t.Errorf("Format(%v) = %q, want %q", d, got, want)
		}
	}
}
