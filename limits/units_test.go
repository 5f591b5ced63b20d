package limits

import (
	"context"
	"testing"
)

// testUnits: hits taking several units at once (Hit.Units) and checks taking none
// (Hit.Check), on fixed windows and GCRA, alone and beside other limits: a hit is admitted
// while its units fit, takes them all or none, and a check reports without writing. On a
// Cluster the limits live on distinct masters, so a refusal on one gives back the units the
// others took.
func testUnits(t *testing.T, b backend) {
	s := b.stores(t, 1)[0]
	ctx := context.Background()
	ids := idsOnDistinctNodes(2)
	for _, algo := range []Algorithm{Fixed, GCRA} {
		t.Run(algo.String(), func(t *testing.T) {
			r := rule(t, "units_"+algo.String(), 10, "hour", algo)
			other := rule(t, "units_other_"+algo.String(), 100, "hour", algo)
			take := func(hits ...Hit) *Decision {
				t.Helper()
				var d Decision
				if err := s.Take(ctx, hits, &d); err != nil {
					t.Fatal(err)
				}
				return &d
			}
			used := func(r *Rule, id string) int64 {
				t.Helper()
				u, err := s.Usage(ctx, r, id)
				if err != nil {
					t.Fatal(err)
				}
				return u.Used
			}
			// 7 units fit in 10: taken, 3 remain.
			d := take(Hit{Rule: r, ID: ids[0], Units: 7})
			if !d.Allowed || d.Results[0].Remaining != 3 || used(r, ids[0]) != 7 {
				t.Fatalf("7 of 10: %+v, used %d", d, used(r, ids[0]))
			}
			// 4 more do not fit: refused, nothing taken, on this limit or the other one.
			d = take(Hit{Rule: other, ID: ids[1], Units: 5}, Hit{Rule: r, ID: ids[0], Units: 4})
			if d.Allowed || !d.Results[0].Allowed || d.Results[1].Allowed || d.Results[1].Remaining != 3 || d.Results[1].RetryAfter <= 0 {
				t.Fatalf("4 more: %+v", d)
			}
			if u := used(other, ids[1]); u != 0 {
				t.Fatalf("the other limit kept %d units of a refused decision", u)
			}
			if u := used(r, ids[0]); u != 7 {
				t.Fatalf("refused: used %d, want 7", u)
			}
			// A check takes nothing and admits while one unit fits.
			d = take(Hit{Rule: r, ID: ids[0], Check: true}, Hit{Rule: other, ID: ids[1], Check: true})
			if !d.Allowed || d.Results[0].Remaining != 3 || d.Results[1].Remaining != 100 || used(r, ids[0]) != 7 || used(other, ids[1]) != 0 {
				t.Fatalf("check: %+v", d)
			}
			// Exactly the 3 left fit; then a check is refused.
			d = take(Hit{Rule: r, ID: ids[0], Units: 3}, Hit{Rule: other, ID: ids[1], Units: 2})
			if !d.Allowed || d.Results[0].Remaining != 0 || d.Results[1].Remaining != 98 {
				t.Fatalf("the last 3: %+v", d)
			}
			d = take(Hit{Rule: r, ID: ids[0], Check: true})
			if d.Allowed || d.Results[0].Remaining != 0 || used(r, ids[0]) != 10 {
				t.Fatalf("check of a spent limit: %+v", d)
			}
			// Units are never refunded as one (Taken leaves them out).
			if taken := (&Decision{Allowed: true, Results: []Result{{Allowed: true}}}).Taken([]Hit{{Rule: r, ID: ids[0], Units: 3}}, nil); len(taken) != 0 {
				t.Fatalf("taken: %+v", taken)
			}
		})
	}
}
