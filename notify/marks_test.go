package notify

import (
	"testing"
	"time"

	"github.com/docsgate/gateway/internal/redistest"
)

// A mark is taken once until its time, across the replicas that share the store, and can be
// taken again after it.
func TestMarks(t *testing.T) {
	srv := redistest.Start(t)
	for name, pair := range map[string][2]Marks{
		"memory": func() [2]Marks { m := &MemoryMarks{}; return [2]Marks{m, m} }(),
		"redis":  {NewRedisMarks(srv.Client(t), "gw"), NewRedisMarks(srv.Client(t), "gw")},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := t.Context()
			until := time.Now().Add(1500 * time.Millisecond)
			first, err := pair[0].Mark(ctx, "k", until)
			if err != nil || !first {
				t.Fatalf("first mark: %v, %v", first, err)
			}
			for i, m := range pair {
				if again, err := m.Mark(ctx, "k", until); err != nil || again {
					t.Fatalf("replica %d marked k again before its time: %v, %v", i, again, err)
				}
			}
			if other, err := pair[1].Mark(ctx, "other", until); err != nil || !other {
				t.Fatalf("another key: %v, %v", other, err)
			}
			time.Sleep(time.Until(until) + 100*time.Millisecond)
			if after, err := pair[1].Mark(ctx, "k", time.Now().Add(time.Hour)); err != nil || !after {
				t.Fatalf("after its time the mark is free again: %v, %v", after, err)
			}
		})
	}
}
