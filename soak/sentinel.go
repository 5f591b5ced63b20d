package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisGroup is the soak's Redis: a master with two replicas, every node with an fsync'ed AOF,
// watched by three Sentinels (quorum 2) that fail over within about two seconds of the
// master's death.
type redisGroup struct {
	name      string
	nodes     []*service
	addrs     []string // of nodes, same order
	sentinels []*service
	sentAddrs []string
}

const groupName = "soakmaster"

func startRedisGroup(dir, redisBin string, logf *os.File) (*redisGroup, error) {
	g := &redisGroup{name: groupName}
	for i := range 3 {
		addr := freePort()
		_, port, _ := net.SplitHostPort(addr)
		d := filepath.Join(dir, fmt.Sprintf("redis-%d", i))
		_ = os.MkdirAll(d, 0o755)
		args := []string{"--port", port, "--bind", "127.0.0.1", "--dir", d, "--save", "",
			"--appendonly", "yes", "--appendfsync", "always", "--daemonize", "no", "--protected-mode", "no", "--loglevel", "warning"}
		if i > 0 {
			_, mport, _ := net.SplitHostPort(g.addrs[0])
			args = append(args, "--replicaof", "127.0.0.1", mport)
		}
		s := &service{name: fmt.Sprintf("redis-%d", i), bin: redisBin, logf: logf, args: args}
		g.nodes, g.addrs = append(g.nodes, s), append(g.addrs, addr)
		if err := s.start(); err != nil {
			return g, err
		}
		if err := waitRedis(addr, 10*time.Second); err != nil {
			return g, err
		}
	}
	_, mport, _ := net.SplitHostPort(g.addrs[0])
	for i := range 3 {
		addr := freePort()
		_, port, _ := net.SplitHostPort(addr)
		conf := filepath.Join(dir, fmt.Sprintf("sentinel-%d.conf", i))
		body := fmt.Sprintf("port %s\nbind 127.0.0.1\nprotected-mode no\nsentinel monitor %[2]s 127.0.0.1 %[3]s 2\n"+
			"sentinel down-after-milliseconds %[2]s 1000\nsentinel failover-timeout %[2]s 10000\nsentinel parallel-syncs %[2]s 1\n",
			port, groupName, mport)
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			return g, err
		}
		s := &service{name: fmt.Sprintf("sentinel-%d", i), bin: redisBin, logf: logf, args: []string{conf, "--sentinel"}}
		g.sentinels, g.sentAddrs = append(g.sentinels, s), append(g.sentAddrs, addr)
		if err := s.start(); err != nil {
			return g, err
		}
	}
	// Ready once every Sentinel knows both replicas and the two other Sentinels.
	deadline := time.Now().Add(30 * time.Second)
	for _, a := range g.sentAddrs {
		c := redis.NewSentinelClient(&redis.Options{Addr: a})
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			reps, err1 := c.Replicas(ctx, groupName).Result()
			sens, err2 := c.Sentinels(ctx, groupName).Result()
			cancel()
			if err1 == nil && err2 == nil && len(reps) >= 2 && len(sens) >= 2 {
				break
			}
			if time.Now().After(deadline) {
				c.Close()
				return g, fmt.Errorf("sentinel %s not ready: %d replicas, %d sentinels, %v %v", a, len(reps), len(sens), err1, err2)
			}
			time.Sleep(200 * time.Millisecond)
		}
		c.Close()
	}
	return g, nil
}

// services lists every process of the group, for the final cleanup.
func (g *redisGroup) services() []*service {
	return append(append([]*service{}, g.nodes...), g.sentinels...)
}

// master is the node the Sentinels name as master now, or nil.
func (g *redisGroup) master() *service {
	for _, a := range g.sentAddrs {
		c := redis.NewSentinelClient(&redis.Options{Addr: a})
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		got, err := c.GetMasterAddrByName(ctx, groupName).Result()
		cancel()
		c.Close()
		if err != nil || len(got) != 2 {
			continue
		}
		addr := net.JoinHostPort(got[0], got[1])
		for i, n := range g.addrs {
			if n == addr {
				return g.nodes[i]
			}
		}
	}
	return nil
}

// failover kills the current master, keeps it down for down (the Sentinels promote a replica
// meanwhile), and starts it again (it rejoins as a replica of the new master). It reports
// whether the Sentinels named another master.
func (g *redisGroup) failover(down time.Duration) bool {
	old := g.master()
	if old == nil {
		return false
	}
	old.kill()
	time.Sleep(down)
	for attempt := 0; attempt < 40; attempt++ {
		if err := old.start(); err == nil {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if m := g.master(); m != nil && m != old {
			return true
		}
		time.Sleep(100 * time.Millisecond)
	}
	return false
}
