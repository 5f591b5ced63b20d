package limits

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/docsgate/gateway/internal/redistest"
)

// With WithWaitReplicas a decision is admitted once the replica holds its count; when the
// replica is gone, decisions fail with ErrNotReplicated instead of admitting on a count a
// failover could lose.
func TestWaitReplicas(t *testing.T) {
	master := redistest.Start(t)
	replica := redistest.StartReplica(t, master)
	ctx := context.Background()
	// A replica whose link just came up may not have acknowledged anything yet; on a loaded
	// machine its first acknowledgement can take longer than the 200 ms asked of decisions.
	if n, err := master.Client(t).Do(ctx, "WAIT", 1, 10000).Int(); err != nil || n != 1 {
		t.Fatalf("replica never acknowledged: %d %v", n, err)
	}
	s := newRedisT(t, master.Client(t), uniquePrefix(), WithWaitReplicas(1, 200*time.Millisecond))
	r := rule(t, "w", 100, "hour", Fixed)
	hits := []Hit{{Rule: r, ID: "a"}}
	var d Decision
	for i := 0; i < 5; i++ {
		if err := s.Take(ctx, hits, &d); err != nil || !d.Allowed {
			t.Fatalf("take %d: %v %+v", i, err, d)
		}
	}
	// The replica holds every count the master admitted.
	key, _ := s.Key(r, "a")
	if n, err := replica.Client(t).HGet(ctx, key, "n").Int(); err != nil || n != 5 {
		t.Fatalf("replica count %d %v, want 5", n, err)
	}
	// Asking for more replicas than exist fails every decision.
	s2 := newRedisT(t, master.Client(t), uniquePrefix(), WithWaitReplicas(2, 50*time.Millisecond))
	if err := s2.Take(ctx, hits, &d); !errors.Is(err, ErrNotReplicated) {
		t.Fatalf("two replicas asked, one present: %v", err)
	}
	replica.Stop(t)
	start := time.Now()
	if err := s.Take(ctx, hits, &d); !errors.Is(err, ErrNotReplicated) {
		t.Fatalf("replica gone: %v", err)
	}
	t.Logf("a decision without its replica failed after %v", time.Since(start))
}

func TestWaitReplicasCluster(t *testing.T) {
	c := redistest.StartClusterWithReplicas(t, 3)
	ctx := context.Background()
	s := newRedisT(t, c.Client(t), uniquePrefix(), WithWaitReplicas(1, 500*time.Millisecond))
	ids := idsOnDistinctNodes(3)
	r := rule(t, "w", 3, "hour", Fixed)
	hits := []Hit{{Rule: r, ID: ids[0]}, {Rule: r, ID: ids[1]}, {Rule: r, ID: ids[2]}}
	var d Decision
	for i := 0; i < 3; i++ {
		if err := s.Take(ctx, hits, &d); err != nil || !d.Allowed {
			t.Fatalf("take %d: %v %+v", i, err, d)
		}
	}
	if err := s.Take(ctx, hits, &d); err != nil || d.Allowed {
		t.Fatalf("fourth take: %v %+v", err, d)
	}
	for _, id := range ids {
		if u, err := s.Usage(ctx, r, id); err != nil || u.Used != 3 {
			t.Fatalf("%s: %+v %v", id, u, err)
		}
	}
	// One id alone (one node, single-slot path).
	if err := s.Take(ctx, []Hit{{Rule: rule(t, "w1", 3, "hour", Fixed), ID: ids[0]}}, &d); err != nil || !d.Allowed {
		t.Fatalf("single slot: %v %+v", err, d)
	}
}

// With WithWaitReplicas a settle is replicated before it returns, like the take: a failover
// cannot bring back a hold that was ended (it would deny until reserve_ttl).
func TestWaitReplicasSettle(t *testing.T) {
	master := redistest.Start(t)
	replica := redistest.StartReplica(t, master)
	ctx := context.Background()
	s := newRedisT(t, master.Client(t), uniquePrefix(), WithWaitReplicas(1, 500*time.Millisecond))
	tok := reserveRule(t, "tok", 1000, 100, 0)
	hits := []Hit{{Rule: tok, ID: "a"}}
	var d Decision
	if err := s.Take(ctx, hits, &d); err != nil || !d.Allowed {
		t.Fatalf("take: %v %+v", err, d)
	}
	if _, err := s.Settle(ctx, d.Hold, hits, 40); err != nil {
		t.Fatal(err)
	}
	key, _ := s.Key(tok, "a")
	if v, err := replica.Client(t).HMGet(ctx, key, "n", "h:"+d.Hold, "hc").Result(); err != nil || v[0] != "40" || v[1] != nil || v[2] != nil {
		t.Fatalf("replica after the settle: %v %v, want n 40 and no hold", v, err)
	}
	// Asking for more replicas than exist: the settle ran, and says it was not replicated.
	s2 := newRedisT(t, master.Client(t), uniquePrefix(), WithWaitReplicas(2, 50*time.Millisecond))
	if err := s2.Take(ctx, hits, &d); !errors.Is(err, ErrNotReplicated) {
		t.Fatalf("take: %v", err)
	}
	s1 := newRedisT(t, master.Client(t), uniquePrefix())
	if err := s1.Take(ctx, hits, &d); err != nil || !d.Allowed {
		t.Fatal(err, d)
	}
	s3 := newRedisT(t, master.Client(t), s1.rules.prefix[:len(s1.rules.prefix)-1], WithWaitReplicas(2, 50*time.Millisecond))
	if _, err := s3.Settle(ctx, d.Hold, hits, 10); !errors.Is(err, ErrNotReplicated) {
		t.Fatalf("settle with two replicas asked, one present: %v", err)
	}
	if u, _ := s1.Usage(ctx, tok, "a"); u.Used != 10 || u.Reserved != 0 {
		t.Fatalf("the master must have settled all the same: %+v", u)
	}
}
