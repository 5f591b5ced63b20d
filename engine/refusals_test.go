package engine

import (
	"testing"
	"time"

	"github.com/docsgate/gateway/limits"
	"github.com/docsgate/gateway/policy"
)

func TestRefusalCounts(t *testing.T) {
	hour, err := limits.ParseWindow("hour")
	if err != nil {
		t.Fatal(err)
	}
	since := time.Date(2026, 11, 1, 9, 0, 0, 0, time.UTC)
	rc := newRefusalCounts(since)
	c := rc.of("per_org", hour)
	at := func(hh, mm int) time.Time { return time.Date(2026, 11, 1, hh, mm, 0, 0, time.UTC) }
	c.add(false, at(10, 58))
	c.add(false, at(10, 59))
	c.add(true, at(10, 59))
	if got := rc.read("per_org", at(10, 59)); got.InWindow != 2 || got.Total != 2 || got.ShadowInWindow != 1 || got.ShadowTotal != 1 || !got.WindowStart.Equal(at(10, 0)) || !got.Since.Equal(since) {
		t.Fatalf("in the 10:00 window: %+v", got)
	}
	c.add(false, at(11, 0)) // a new window: its count starts again, the total goes on
	if got := rc.read("per_org", at(11, 30)); got.InWindow != 1 || got.Total != 3 || got.ShadowInWindow != 0 || got.ShadowTotal != 1 {
		t.Fatalf("in the 11:00 window: %+v", got)
	}
	if got := rc.read("per_org", at(12, 5)); got.InWindow != 0 || got.Total != 3 || !got.WindowStart.Equal(at(12, 0)) {
		t.Fatalf("in the 12:00 window, with no refusal yet: %+v", got)
	}
	// A reload keeps the count (same limit, same counter).
	if rc.of("per_org", hour) != c {
		t.Fatal("a reload replaced the limit's counter")
	}
	// A streams limit has no window: totals only.
	s := rc.of("streams", limits.Window{})
	s.add(false, at(10, 0))
	if got := rc.read("streams", at(12, 0)); got.InWindow != 0 || got.Total != 1 || !got.WindowStart.IsZero() {
		t.Fatalf("streams: %+v", got)
	}
	if got := rc.read("unknown", at(12, 0)); got.Total != 0 || !got.Since.Equal(since) {
		t.Fatalf("a limit never counted: %+v", got)
	}
	var none *refusalCount
	none.add(false, at(10, 0)) // no counter: nothing counted
	rc.add("never put in force", false, at(10, 0))
	if got := rc.read("never put in force", at(10, 0)); got.Total != 0 {
		t.Fatalf("a limit no policy put in force: %+v", got)
	}
}

func TestModeOf(t *testing.T) {
	enforced, shadow := policy.Limit{}, policy.Limit{Shadow: true}
	for _, c := range []struct {
		byPlan map[string]policy.Limit
		want   string
	}{
		{map[string]policy.Limit{"": enforced, "gold": enforced}, "enforce"},
		{map[string]policy.Limit{"": shadow, "gold": shadow}, "shadow"},
		{map[string]policy.Limit{"": shadow, "gold": enforced}, "mixed"},
	} {
		if got := modeOf(c.byPlan); got != c.want {
			t.Errorf("modeOf(%v) = %q, want %q", c.byPlan, got, c.want)
		}
	}
}
