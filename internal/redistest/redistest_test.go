package redistest

import (
	"context"
	"strings"
	"testing"
	"time"
)

func TestStartStopRestart(t *testing.T) {
	s := Start(t)
	c := s.Client(t)
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	s.Stop(t)
	ctx2, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if err := c.Ping(ctx2).Err(); err == nil {
		t.Fatal("PING succeeded after Stop")
	}
	s.Restart(t)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING after Restart: %v", err)
	}
	// --save "" means nothing survives a restart.
	if n, _ := c.Exists(ctx, "k").Result(); n != 0 {
		t.Fatalf("key survived restart: %d", n)
	}
}

func TestCluster(t *testing.T) {
	cl := StartCluster(t, 3)
	if len(cl.Addrs) != 3 {
		t.Fatalf("addrs = %v", cl.Addrs)
	}
	cc := cl.Client(t)
	ctx := context.Background()
	for _, k := range []string{"a", "b", "c", "d", "e"} {
		if err := cc.Set(ctx, k, k, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	info, err := cc.ClusterInfo(ctx).Result()
	if err != nil || !strings.Contains(info, "cluster_known_nodes:3") {
		t.Fatalf("cluster info: %v %s", err, info)
	}
}

func TestSentinelGroupFailsOver(t *testing.T) {
	g := StartSentinelGroup(t, "failmaster")
	if got := g.MasterAddr(t); got != g.Master.Addr {
		t.Fatalf("master %s, want %s", got, g.Master.Addr)
	}
	g.Master.Stop(t)
	start := time.Now()
	g.WaitPromoted(t, 30*time.Second)
	t.Logf("promoted after %v", time.Since(start))
}

func TestClusterWithReplicasFailsOver(t *testing.T) {
	c := StartClusterWithReplicas(t, 3)
	m := c.MasterOf(t, "{x}")
	r := c.ReplicaOf(t, m)
	m.Stop(t)
	start := time.Now()
	rc := r.Client(t)
	for {
		info, err := rc.Info(t.Context(), "replication").Result()
		if err == nil && strings.Contains(info, "role:master") {
			break
		}
		if time.Since(start) > 30*time.Second {
			t.Fatal("no promotion")
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("replica took over after %v", time.Since(start))
}

// Two harnesses that probed the same free port: the second server cannot bind it, and its
// launch fails instead of taking the first server (which answers on the port) for its own.
func TestLaunchOnAnotherServersPort(t *testing.T) {
	first := Start(t)
	second := &Server{Addr: first.Addr, port: first.port, dir: t.TempDir()}
	err := second.launch(lookServer(t))
	if err == nil {
		second.Stop(t)
		t.Fatal("a server that could not bind its port was taken as ready (the port's other server answered)")
	}
	if !strings.Contains(err.Error(), "exited early") && !strings.Contains(err.Error(), "not ours") {
		t.Fatalf("launch on a taken port: %v", err)
	}
	t.Logf("launch on a taken port: %.200s", err)
	if err := first.Client(t).Ping(context.Background()).Err(); err != nil {
		t.Fatalf("the port's own server: %v", err)
	}
}
