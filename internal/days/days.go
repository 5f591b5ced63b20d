// Package days reads and writes durations in days (90d) besides Go's (36h).
//
// Operators write key lifetimes and rotation overlaps in days; time.ParseDuration knows no
// unit longer than an hour.
package days

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Day is 24 hours: lifetimes are counted in elapsed time, never in calendar days.
const Day = 24 * time.Hour

// Parse reads a whole number of days (90d, at most 65535) or what time.ParseDuration reads.
func Parse(s string) (time.Duration, error) {
	if n, ok := strings.CutSuffix(s, "d"); ok {
		d, err := strconv.ParseUint(n, 10, 16)
		if err != nil {
			return 0, fmt.Errorf("%q is not a whole number of days such as 90d", s)
		}
		return time.Duration(d) * Day, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration such as 90d or 36h", s)
	}
	return d, nil
}

// Format writes d in days when it is a whole number of them (90d), else as time.Duration does.
func Format(d time.Duration) string {
	if d != 0 && d%Day == 0 {
		return strconv.FormatInt(int64(d/Day), 10) + "d"
	}
	return d.String()
}
