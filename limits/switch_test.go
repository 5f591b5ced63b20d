package limits

import (
	"context"
	"errors"
	"testing"
)

// testAlgorithmSwitch: a limit that changes its algorithm (a reload, a plan) while a tenant
// has a counter in flight never fails a decision. Each algorithm counts under keys of its own:
// the tenant starts the new algorithm's counter fresh, and a switch back within the window
// resumes the count the old algorithm kept.
func testAlgorithmSwitch(t *testing.T, b backend) {
	s := b.stores(t, 1)[0]
	ctx := context.Background()
	fixed := rule(t, "switch", 5, "hour", Fixed)
	gcra := rule(t, "switch", 5, "hour", GCRA)
	take := func(r *Rule, id string, n int) (admitted int) {
		t.Helper()
		var d Decision
		for range n {
			if err := s.Take(ctx, []Hit{{Rule: r, ID: id}}, &d); err != nil {
				t.Fatalf("%s %s: %v", r.Algorithm, id, err)
			}
			if d.Allowed {
				admitted++
			}
		}
		return admitted
	}
	usage := func(r *Rule, id string) int64 {
		t.Helper()
		u, err := s.Usage(ctx, r, id)
		if err != nil {
			t.Fatalf("usage %s %s: %v", r.Algorithm, id, err)
		}
		return u.Used
	}
	// fixed -> gcra -> fixed, with 2 of 5 used.
	if n := take(fixed, "a", 2); n != 2 {
		t.Fatalf("fixed: %d admitted", n)
	}
	if u := usage(gcra, "a"); u != 0 {
		t.Fatalf("gcra usage after the switch: %d, want a fresh bucket", u)
	}
	if n := take(gcra, "a", 7); n != 5 {
		t.Fatalf("gcra after fixed: %d admitted, want 5 (a fresh bucket)", n)
	}
	if n := take(fixed, "a", 7); n != 3 {
		t.Fatalf("fixed again: %d admitted, want the 3 left of its window", n)
	}
	// gcra -> fixed -> gcra.
	if n := take(gcra, "b", 2); n != 2 {
		t.Fatalf("gcra: %d admitted", n)
	}
	if n := take(fixed, "b", 7); n != 5 {
		t.Fatalf("fixed after gcra: %d admitted, want 5", n)
	}
	if u := usage(gcra, "b"); u != 2 {
		t.Fatalf("gcra usage after switching back: %d, want the 2 of its bucket", u)
	}
	if n := take(gcra, "b", 7); n != 3 {
		t.Fatalf("gcra again: %d admitted, want 3", n)
	}
	// Both algorithms of one name in one decision: still no error.
	var d Decision
	if err := s.Take(ctx, []Hit{{Rule: fixed, ID: "c"}, {Rule: gcra, ID: "c"}}, &d); err != nil || !d.Allowed {
		t.Fatalf("fixed and gcra of one name in one decision: %v %+v", err, d)
	}
	// Scan finds each tenant under the algorithm it counts with.
	found := map[string]int64{}
	err := s.Scan(ctx, gcra, func(string) *Rule { return gcra }, func(id string, u Usage) { found[id] = u.Used })
	if err != nil || found["a"] != 5 || found["b"] != 5 || found["c"] != 1 || len(found) != 3 {
		t.Fatalf("gcra scan: %v %v", found, err)
	}
}

// testLargestLimit: the largest limit a store accepts is counted exactly, and one more is
// refused by every store alike.
func testLargestLimit(t *testing.T, b backend) {
	s := b.stores(t, 1)[0]
	ctx := context.Background()
	big := rule(t, "big", MaxLimit, "hour", Fixed)
	var d Decision
	for i := int64(1); i <= 3; i++ {
		if err := s.Take(ctx, []Hit{{Rule: big, ID: "x"}}, &d); err != nil || !d.Allowed {
			t.Fatalf("take %d: %v %+v", i, err, d)
		}
		if got := d.Results[0].Remaining; got != MaxLimit-i {
			t.Fatalf("take %d: remaining %d, want %d", i, got, int64(MaxLimit)-i)
		}
	}
	if u, err := s.Usage(ctx, big, "x"); err != nil || u.Used != 3 || u.Remaining != MaxLimit-3 {
		t.Fatalf("usage %+v %v", u, err)
	}
	g := rule(t, "bigg", MaxGCRALimit(mustWindow(t, "hour")), "hour", GCRA)
	if err := s.Take(ctx, []Hit{{Rule: g, ID: "x"}}, &d); err != nil || !d.Allowed || d.Results[0].Remaining != g.Limit-1 {
		t.Fatalf("largest gcra limit: %v %+v", err, d)
	}
	for _, r := range []*Rule{
		rule(t, "over", MaxLimit+1, "hour", Fixed),
		rule(t, "overg", MaxGCRALimit(mustWindow(t, "hour"))+1, "hour", GCRA),
	} {
		if err := s.Take(ctx, []Hit{{Rule: r, ID: "x"}}, &d); !errors.Is(err, ErrInvalidRule) {
			t.Fatalf("%s limit %d: %v, want ErrInvalidRule", r.Algorithm, r.Limit, err)
		}
		if _, err := s.Usage(ctx, r, "x"); !errors.Is(err, ErrInvalidRule) {
			t.Fatalf("usage of %s limit %d: %v, want ErrInvalidRule", r.Algorithm, r.Limit, err)
		}
	}
}

func TestCheckLimit(t *testing.T) {
	hour, sec := mustWindow(t, "hour"), mustWindow(t, "1s")
	for _, c := range []struct {
		limit int64
		w     Window
		a     Algorithm
		ok    bool
	}{
		{MaxLimit, hour, Fixed, true},
		{MaxLimit + 1, hour, Fixed, false},
		{1_000_000_000_000_000_000, hour, Fixed, false},
		{3_600_000_000, hour, GCRA, true},
		{3_600_000_001, hour, GCRA, false},
		{1_000_000, sec, GCRA, true},
		{1_000_001, sec, GCRA, false},
		{1_000_001, sec, Fixed, true},
	} {
		if err := CheckLimit(c.limit, c.w, c.a); (err == nil) != c.ok {
			t.Errorf("CheckLimit(%d, %s, %s) = %v, want ok %v", c.limit, c.w, c.a, err, c.ok)
		}
	}
}

// testShadowHits: shadow limits spent one after another all keep counting. A request is
// admitted while the enforced limit has room and charged to every shadow limit that still has
// room, in the one call; a request the enforced limit denies is charged to none.
func testShadowHits(t *testing.T, b backend) {
	s := b.stores(t, 1)[0]
	ctx := context.Background()
	ids := idsOnDistinctNodes(3)
	enforced := rule(t, "enf", 6, "hour", Fixed)
	sh1 := rule(t, "sh1", 2, "hour", Fixed)
	sh1.Shadow = true
	sh2 := rule(t, "sh2", 4, "hour", GCRA)
	sh2.Shadow = true
	hits := []Hit{{Rule: sh1, ID: ids[0]}, {Rule: enforced, ID: ids[1]}, {Rule: sh2, ID: ids[2]}}
	var d Decision
	for i := int64(1); i <= 8; i++ {
		if err := s.Take(ctx, hits, &d); err != nil {
			t.Fatal(err)
		}
		if want := i <= 6; d.Allowed != want {
			t.Fatalf("take %d: allowed %v, want %v", i, d.Allowed, want)
		}
		r1, re, r2 := d.Results[0], d.Results[1], d.Results[2]
		if r1.Allowed != (i <= 2) || r2.Allowed != (i <= 4) || re.Allowed != (i <= 6) {
			t.Fatalf("take %d: per-limit allowed %v %v %v", i, r1.Allowed, re.Allowed, r2.Allowed)
		}
		if r1.Remaining != max(2-i, 0) || r2.Remaining != max(4-i, 0) || re.Remaining != max(6-i, 0) {
			t.Fatalf("take %d: remaining %d %d %d", i, r1.Remaining, re.Remaining, r2.Remaining)
		}
	}
	for _, c := range []struct {
		r    *Rule
		id   string
		used int64
	}{{sh1, ids[0], 2}, {enforced, ids[1], 6}, {sh2, ids[2], 4}} {
		if u, err := s.Usage(ctx, c.r, c.id); err != nil || u.Used != c.used {
			t.Fatalf("%s used %+v %v, want %d", c.r.Name, u, err, c.used)
		}
	}
	// The shadow limits have room again under other ids; the enforced one denies: nothing moves.
	fresh := []Hit{{Rule: sh1, ID: "f1"}, {Rule: enforced, ID: ids[1]}, {Rule: sh2, ID: "f2"}}
	if err := s.Take(ctx, fresh, &d); err != nil || d.Allowed {
		t.Fatalf("denied by the enforced limit: %v %+v", err, d)
	}
	for _, id := range []string{"f1", "f2"} {
		r := sh1
		if id == "f2" {
			r = sh2
		}
		if u, _ := s.Usage(ctx, r, id); u.Used != 0 {
			t.Fatalf("%s was charged by a denied request: %+v", r.Name, u)
		}
	}
	// Only shadow limits: always admitted, each charged while it has room.
	only := []Hit{{Rule: sh1, ID: "o"}, {Rule: sh2, ID: "o"}}
	for i := range 3 {
		if err := s.Take(ctx, only, &d); err != nil || !d.Allowed {
			t.Fatalf("shadow only %d: %v %+v", i, err, d)
		}
	}
	if u, _ := s.Usage(ctx, sh2, "o"); u.Used != 3 {
		t.Fatalf("shadow only: sh2 used %d, want 3", u.Used)
	}
}
