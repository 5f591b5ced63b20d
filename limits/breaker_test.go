package limits

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/docsgate/gateway/internal/redistest"
)

// A Cluster master killed, behind Guards with the default breaker (5 failures, 1 s) and the
// default 100 ms timeout, on the plain and the coalesced store at once: the dead master's
// breaker opens and only its own; a tenant on a healthy master is decided as usual
// throughout, its breaker never counts the dead master's failures (not even those of requests
// spanning both), a request spanning both is refused whole (ErrBreakerOpen naming the dead
// node) and takes nothing on the healthy one; once the replica is promoted, the dead master's
// tenants are decided again and its breaker is dropped.
func TestClusterMasterDownOpensOnlyItsBreaker(t *testing.T) {
	c := redistest.StartClusterWithReplicas(t, 3)
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs, MaxRetries: -1, ContextTimeoutEnabled: true,
		ReadTimeout: 100 * time.Millisecond, WriteTimeout: 100 * time.Millisecond, DialTimeout: time.Second})
	t.Cleanup(func() { client.Close() })
	ctx := context.Background()
	ids := idsOnDistinctNodes(3)
	victim, other0 := c.MasterOf(t, "{"+ids[0]+"}"), c.MasterOf(t, "{"+ids[1]+"}")
	replica := c.ReplicaOf(t, victim)
	dead, healthy := ids[0], ids[1:]
	r := rule(t, "per_node", 1_000_000, "hour", Fixed)
	other := rule(t, "other", 1_000_000, "hour", Fixed)

	type guarded struct {
		name string
		g    *Guard
		log  *stateLog
	}
	var gs []guarded
	for _, co := range []bool{false, true} {
		var opts []RedisOption
		name := "plain"
		if co {
			opts, name = append(opts, WithCoalescing()), "coalesced"
		}
		log := &stateLog{}
		// Timeout, FailureThreshold and Cooldown: the defaults.
		gs = append(gs, guarded{name, NewGuard(newRedisT(t, client, uniquePrefix(), opts...), GuardOptions{OnBreaker: log.add}), log})
	}
	take := func(g *Guard, hits ...Hit) error {
		var d Decision
		err := g.Take(ctx, hits, &d)
		if err == nil && !d.Allowed {
			t.Fatalf("denied: %+v", d)
		}
		return err
	}
	// Warm up: the first calls dial every master and load the script, which on a loaded
	// machine can outlast the default 100 ms timeout.
	for _, x := range gs {
		for _, id := range ids {
			for i := 0; ; i++ {
				err := take(x.g, Hit{Rule: r, ID: id})
				if err == nil {
					break
				}
				if i == 20 {
					t.Fatalf("%s: before the kill: %v", x.name, err)
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
	// The default timeout is kept: where this machine, with every master up, already takes
	// 100 ms for a call, no tenant can be shown to meet it while a master is down, and the test
	// is skipped saying so.
	var slowest time.Duration
	for range 50 {
		for _, x := range gs {
			for _, id := range healthy {
				start := time.Now()
				err := take(x.g, Hit{Rule: r, ID: id})
				slowest = max(slowest, time.Since(start))
				if err != nil && !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("%s: before the kill: %v", x.name, err)
				}
			}
		}
	}
	if slowest >= 100*time.Millisecond {
		t.Skipf("with every master up a call took up to %v on this machine: the default 100 ms timeout cannot hold here", slowest.Round(time.Millisecond))
	}
	t.Logf("with every master up the slowest call took %v", slowest.Round(time.Millisecond))

	victim.Stop(t)
	// Requests spanning the dead master and a healthy one first: they fail on the dead one
	// alone, so the healthy one's breaker stays closed (blamed, it would open after 5).
	for _, x := range gs {
		for i := range 10 {
			err := take(x.g, Hit{Rule: r, ID: dead}, Hit{Rule: other, ID: healthy[0]})
			if err == nil {
				t.Fatalf("%s: spanning request %d with its master dead: admitted", x.name, i)
			}
		}
		if open := x.g.OpenNodes(); !slices.Equal(open, []string{victim.Addr}) {
			t.Fatalf("%s: open breakers %v after the spanning requests, want [%s]", x.name, open, victim.Addr)
		}
		x.g.b.mu.Lock()
		blamed := x.g.b.m[other0.Addr].failures
		x.g.b.mu.Unlock()
		if blamed != 0 {
			t.Fatalf("%s: the healthy node %s was blamed for %d failures of the dead one", x.name, other0.Addr, blamed)
		}
		err := take(x.g, Hit{Rule: r, ID: dead}, Hit{Rule: other, ID: healthy[0]})
		var ne *NodeError
		if !errors.Is(err, ErrBreakerOpen) || !errors.As(err, &ne) || ne.Node != victim.Addr || Classify(err) != KindBreakerOpen {
			t.Fatalf("%s: spanning request with the breaker open: %v, want ErrBreakerOpen naming %s", x.name, err, victim.Addr)
		}
		// The dead node's dials use up the 100 ms of the first five (go-redis's default
		// DialerRetries): their units go back after the answer, in the background.
		for deadline := time.Now().Add(5 * time.Second); ; {
			u, err := x.g.Usage(ctx, other, healthy[0])
			if err == nil && u.Used == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the refused requests took %+v on the healthy master (%v), want nothing", x.name, u, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	// Until the replica takes over: the healthy masters' tenants see no error at all.
	rc := replica.Client(t)
	healthyErrs, deadErrs := 0, 0
	// The wait is for the promotion itself (cluster-node-timeout plus the election), bounded
	// only so that a Cluster that never fails over ends the test: 2 minutes, far beyond the
	// seconds it takes even on a loaded machine.
	deadline := time.Now().Add(2 * time.Minute)
	promoted := false
	for !promoted {
		if time.Now().After(deadline) {
			t.Fatal("the replica never took over within 2 minutes")
		}
		for _, x := range gs {
			for _, id := range healthy {
				if err := take(x.g, Hit{Rule: r, ID: id}); err != nil {
					healthyErrs++
					t.Errorf("%s: tenant %s on a healthy master: %v", x.name, id, err)
				}
			}
			if err := take(x.g, Hit{Rule: r, ID: dead}); err != nil {
				deadErrs++
			}
		}
		info, err := rc.Info(ctx, "replication").Result()
		promoted = err == nil && strings.Contains(info, "role:master")
		time.Sleep(5 * time.Millisecond)
	}
	if deadErrs == 0 {
		t.Fatal("the dead master's tenant saw no error: was it killed?")
	}
	t.Logf("until the promotion: %d errors for the dead master's tenant, %d for the healthy ones", deadErrs, healthyErrs)

	// The dead master's tenant is decided again (go-redis follows the new layout), and the
	// dead master's breaker is dropped: the new master is a node of its own. The client learns
	// the layout in steps (a call may succeed through a redirection while the slot table still
	// names no master for the slot, and that already drops the dead node's breaker), so the
	// wait is for the state the test checks: the promoted replica called as the slot's master.
	for _, x := range gs {
		deadline := time.Now().Add(time.Minute)
		for {
			err := take(x.g, Hit{Rule: r, ID: dead})
			ev := x.log.all()
			if err == nil && len(x.g.OpenNodes()) == 0 && slices.Contains(ev, victim.Addr+" gone") && slices.Contains(ev, replica.Addr+" seen") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: after the promotion: %v, open %v, events %v", x.name, err, x.g.OpenNodes(), x.log.all())
			}
			time.Sleep(50 * time.Millisecond)
		}
		events := x.log.all()
		for _, e := range events {
			if strings.HasSuffix(e, " opened") && e != victim.Addr+" opened" {
				t.Errorf("%s: a healthy node's breaker opened: events %v", x.name, events)
			}
		}
	}
}
