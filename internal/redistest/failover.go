package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// StartReplica starts a redis-server replicating master and waits until its link is up.
func StartReplica(t testing.TB, master *Server) *Server {
	t.Helper()
	return StartReplicaOf(t, master.Addr)
}

// StartReplicaOf starts a redis-server replicating from addr (a master, or a proxy in front of
// one) and waits until its link is up.
func StartReplicaOf(t testing.TB, addr string) *Server {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	r := start(t, func(int) []string { return []string{"--replicaof", host, port} })
	waitReplicaLink(t, r.Addr)
	return r
}

func waitReplicaLink(t testing.TB, addr string) {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	deadline := time.Now().Add(readyTimeout)
	for {
		info, err := c.Info(context.Background(), "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: replica %s never linked to its master: %v %s", addr, err, info)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// SentinelGroup is a master with one replica watched by three Sentinels (quorum 2), tuned to
// fail over within a few seconds of the master's death.
type SentinelGroup struct {
	Name      string
	Master    *Server
	Replica   *Server
	Sentinels []*Server
}

// StartSentinelGroup starts the group and waits until every Sentinel knows the replica and
// the two other Sentinels, so that a failover can be agreed on.
func StartSentinelGroup(t testing.TB, name string) *SentinelGroup {
	t.Helper()
	return StartSentinelGroupVia(t, name, nil)
}

// StartSentinelGroupVia is StartSentinelGroup with the master known to everyone (replica,
// Sentinels, clients) at via's address, for example a proxy the test controls; nil is the
// master's own address.
func StartSentinelGroupVia(t testing.TB, name string, via func(masterAddr string) string) *SentinelGroup {
	t.Helper()
	g := &SentinelGroup{Name: name, Master: Start(t)}
	known := g.Master.Addr
	if via != nil {
		known = via(known)
	}
	g.Replica = StartReplicaOf(t, known)
	host, port, _ := net.SplitHostPort(known)
	for range 3 {
		body := fmt.Sprintf("sentinel monitor %[1]s %[2]s %[3]s 2\n"+
			"sentinel down-after-milliseconds %[1]s 1000\n"+
			"sentinel failover-timeout %[1]s 10000\n"+
			"sentinel parallel-syncs %[1]s 1\n", name, host, port)
		g.Sentinels = append(g.Sentinels, startSentinel(t, name, body))
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, s := range g.Sentinels {
		c := redis.NewSentinelClient(&redis.Options{Addr: s.Addr})
		for {
			reps, err1 := c.Replicas(context.Background(), name).Result()
			sens, err2 := c.Sentinels(context.Background(), name).Result()
			if err1 == nil && err2 == nil && len(reps) >= 1 && len(sens) >= 2 {
				break
			}
			if time.Now().After(deadline) {
				c.Close()
				t.Fatalf("redistest: sentinel %s sees %d replicas and %d sentinels: %v %v", s.Addr, len(reps), len(sens), err1, err2)
			}
			time.Sleep(100 * time.Millisecond)
		}
		c.Close()
	}
	return g
}

// Addrs are the Sentinels' addresses.
func (g *SentinelGroup) Addrs() []string {
	var out []string
	for _, s := range g.Sentinels {
		out = append(out, s.Addr)
	}
	return out
}

// MasterAddr is the master's address as the first Sentinel sees it now.
func (g *SentinelGroup) MasterAddr(t testing.TB) string {
	t.Helper()
	c := redis.NewSentinelClient(&redis.Options{Addr: g.Sentinels[0].Addr})
	defer c.Close()
	got, err := c.GetMasterAddrByName(context.Background(), g.Name).Result()
	if err != nil || len(got) != 2 {
		return ""
	}
	return net.JoinHostPort(got[0], got[1])
}

// WaitPromoted waits until the Sentinels name the replica as master and it accepts writes,
// and returns when that was seen.
func (g *SentinelGroup) WaitPromoted(t testing.TB, within time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(within)
	c := redis.NewClient(&redis.Options{Addr: g.Replica.Addr, MaxRetries: -1})
	defer c.Close()
	for {
		if g.MasterAddr(t) == g.Replica.Addr {
			if info, err := c.Info(context.Background(), "replication").Result(); err == nil && strings.Contains(info, "role:master") {
				return time.Now()
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: no promotion of %s within %v", g.Replica.Addr, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func startSentinel(t testing.TB, name, body string) *Server {
	t.Helper()
	bin := lookServer(t)
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		p, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(p)), port: p, dir: dir, conf: conf, extra: []string{"--sentinel"}}
		if lastErr = s.launch(bin); lastErr == nil {
			t.Cleanup(func() { s.Stop(t) })
			waitMaster(t, s.Addr, name)
			return s
		}
	}
	t.Fatalf("redistest: start sentinel: %v", lastErr)
	return nil
}

// StartClusterWithReplicas starts a Redis Cluster of masters masters with one replica each
// and a node timeout of one second, so that a replica takes over a dead master within a few
// seconds. Servers[i] for i < masters are the masters.
func StartClusterWithReplicas(t testing.TB, masters int) *Cluster {
	t.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatal("redis-cli not found: install it with `apt-get install redis-server` (or run `make test`, which does)")
	}
	c := &Cluster{masters: masters}
	for i := 0; i < 2*masters; i++ {
		s := start(t, func(int) []string {
			bus, err := FreePort()
			if err != nil {
				t.Fatalf("redistest: free port: %v", err)
			}
			return []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
				"--cluster-port", strconv.Itoa(bus), "--cluster-node-timeout", "1000",
				// The healthy masters keep serving their slots while one is down.
				"--cluster-require-full-coverage", "no"}
		})
		c.Servers = append(c.Servers, s)
		c.Addrs = append(c.Addrs, s.Addr)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-replicas", "1", "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput(); err != nil {
		t.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	waitClusterOK(t, c.Addrs, masters)
	// redis-cli assigns roles itself: list the masters first, in slot order.
	var ms, rs []*Server
	for _, s := range c.Servers {
		if role(t, s.Addr) == "master" {
			ms = append(ms, s)
		} else {
			rs = append(rs, s)
		}
	}
	c.Servers = append(ms, rs...)
	c.Addrs = c.Addrs[:0]
	for _, s := range c.Servers {
		c.Addrs = append(c.Addrs, s.Addr)
	}
	return c
}

// waitClusterOK waits for cluster_state:ok on every node and for every master's replica to
// be in sync.
func waitClusterOK(t testing.TB, addrs []string, masters int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for _, addr := range addrs {
		rc := redis.NewClient(&redis.Options{Addr: addr})
		for {
			info, err := rc.ClusterInfo(context.Background()).Result()
			repl, err2 := rc.Info(context.Background(), "replication").Result()
			ok := err == nil && err2 == nil && strings.Contains(info, "cluster_state:ok") &&
				(strings.Contains(repl, "role:master") && strings.Contains(repl, "connected_slaves:1") ||
					strings.Contains(repl, "master_link_status:up"))
			if ok {
				break
			}
			if time.Now().After(deadline) {
				rc.Close()
				t.Fatalf("redistest: cluster node %s not ready: %v %v\n%s\n%s", addr, err, err2, info, repl)
			}
			time.Sleep(50 * time.Millisecond)
		}
		rc.Close()
	}
}

func role(t testing.TB, addr string) string {
	t.Helper()
	rc := redis.NewClient(&redis.Options{Addr: addr})
	defer rc.Close()
	info, err := rc.Info(context.Background(), "replication").Result()
	if err != nil {
		t.Fatalf("redistest: role of %s: %v", addr, err)
	}
	if strings.Contains(info, "role:master") {
		return "master"
	}
	return "replica"
}

// MasterOf returns the master serving key's slot, as the node at addr sees the cluster.
func (c *Cluster) MasterOf(t testing.TB, key string) *Server {
	t.Helper()
	rc := redis.NewClient(&redis.Options{Addr: c.Addrs[0]})
	defer rc.Close()
	slot, err := rc.ClusterKeySlot(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	shards, err := rc.ClusterShards(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, sh := range shards {
		for _, r := range sh.Slots {
			if int64(r.Start) > slot || slot > int64(r.End) {
				continue
			}
			for _, n := range sh.Nodes {
				if n.Role != "master" {
					continue
				}
				for _, srv := range c.Servers {
					if srv.Addr == fmt.Sprintf("%s:%d", n.IP, n.Port) {
						return srv
					}
				}
			}
		}
	}
	t.Fatalf("redistest: no master for slot %d", slot)
	return nil
}

// ReplicaOf returns the replica of master m.
func (c *Cluster) ReplicaOf(t testing.TB, m *Server) *Server {
	t.Helper()
	rc := redis.NewClient(&redis.Options{Addr: m.Addr})
	defer rc.Close()
	info, err := rc.Info(context.Background(), "replication").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		// slave0:ip=127.0.0.1,port=1234,state=online,...
		if strings.HasPrefix(line, "slave0:") {
			var port string
			for _, f := range strings.Split(strings.TrimPrefix(line, "slave0:"), ",") {
				if v, ok := strings.CutPrefix(f, "port="); ok {
					port = v
				}
			}
			for _, s := range c.Servers {
				if s.Addr == "127.0.0.1:"+port {
					return s
				}
			}
		}
	}
	t.Fatalf("redistest: no replica of %s", m.Addr)
	return nil
}
