package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/docsgate/gateway/bench/internal/child"
)

// redisNode is one redis-server process and a client for its INFO.
type redisNode struct {
	addr   string
	proc   *child.Proc
	client *redis.Client
}

func startRedis(procs *child.Group, dir, cpu string, cluster bool) (*redisNode, error) {
	port := child.FreePort()
	nd := filepath.Join(dir, fmt.Sprintf("redis-%d", port))
	if err := os.MkdirAll(nd, 0o755); err != nil {
		return nil, err
	}
	args := []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", nd,
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--protected-mode", "no", "--loglevel", "warning"}
	if cluster {
		args = append(args, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-port", strconv.Itoa(child.FreePort()), "--cluster-node-timeout", "5000")
	}
	p, err := procs.Start("redis-server", cpu, nil, filepath.Join(nd, "redis.log"), "redis-server", args...)
	if err != nil {
		return nil, err
	}
	n := &redisNode{addr: fmt.Sprintf("127.0.0.1:%d", port), proc: p}
	n.client = redis.NewClient(&redis.Options{Addr: n.addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		err := n.client.Ping(ctx).Err()
		cancel()
		if err == nil {
			return n, nil
		}
		if p.Exited() || time.Now().After(deadline) {
			p.Stop()
			return nil, fmt.Errorf("redis-server on %s not ready: %v", n.addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (n *redisNode) stop() {
	if n == nil {
		return
	}
	n.client.Close()
	n.proc.Stop()
}

// startCluster starts three masters and joins them with redis-cli --cluster create.
func startCluster(procs *child.Group, dir, cpu string) ([]*redisNode, error) {
	var nodes []*redisNode
	fail := func(err error) ([]*redisNode, error) {
		for _, n := range nodes {
			n.stop()
		}
		return nil, err
	}
	for i := 0; i < 3; i++ {
		n, err := startRedis(procs, dir, cpu, true)
		if err != nil {
			return fail(err)
		}
		nodes = append(nodes, n)
	}
	args := []string{"--cluster", "create"}
	for _, n := range nodes {
		args = append(args, n.addr)
	}
	args = append(args, "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "redis-cli", args...).CombinedOutput(); err != nil {
		return fail(fmt.Errorf("redis-cli --cluster create: %v\n%s", err, out))
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, n := range nodes {
		for {
			info, err := n.client.ClusterInfo(context.Background()).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				return fail(fmt.Errorf("cluster node %s not ok: %v", n.addr, err))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nodes, nil
}

// cmdStats is INFO commandstats of one node: command -> calls.
func (n *redisNode) cmdStats() map[string]int64 {
	info, err := n.client.Info(context.Background(), "commandstats").Result()
	out := map[string]int64{}
	if err != nil {
		return out
	}
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "cmdstat_") {
			continue
		}
		name, rest, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":calls=")
		if !ok {
			continue
		}
		num, _, _ := strings.Cut(rest, ",")
		v, _ := strconv.ParseInt(num, 10, 64)
		out[name] = v
	}
	return out
}

// redisCounts is the script calls and all other commands (INFO itself excluded) per node.
type redisCounts struct{ scripts, other []int64 }

func snapshot(nodes []*redisNode) redisCounts {
	var c redisCounts
	for _, n := range nodes {
		st := n.cmdStats()
		var s, o int64
		for k, v := range st {
			switch k {
			case "evalsha", "eval", "evalsha_ro", "eval_ro", "fcall":
				s += v
			case "info", "ping", "cluster|info", "cluster|slots", "cluster|shards", "cluster|nodes", "command", "command|docs", "client|setinfo", "hello":
			default:
				o += v
			}
		}
		c.scripts = append(c.scripts, s)
		c.other = append(c.other, o)
	}
	return c
}

func (c redisCounts) sub(before redisCounts) redisCounts {
	var d redisCounts
	for i := range c.scripts {
		d.scripts = append(d.scripts, c.scripts[i]-before.scripts[i])
		d.other = append(d.other, c.other[i]-before.other[i])
	}
	return d
}

func sum(v []int64) int64 {
	var s int64
	for _, x := range v {
		s += x
	}
	return s
}

// startReplicated starts a master and one replica of it, and waits until the replica is in
// sync.
func startReplicated(procs *child.Group, dir, cpu string) (*redisNode, *redisNode, error) {
	m, err := startRedis(procs, dir, cpu, false)
	if err != nil {
		return nil, nil, err
	}
	r, err := startRedis(procs, dir, cpu, false)
	if err != nil {
		m.stop()
		return nil, nil, err
	}
	host, port, _ := strings.Cut(m.addr, ":")
	ctx := context.Background()
	if err := r.client.ReplicaOf(ctx, host, port).Err(); err != nil {
		m.stop()
		r.stop()
		return nil, nil, fmt.Errorf("replicaof: %w", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := r.client.Info(ctx, "replication").Result()
		if err == nil && strings.Contains(info, "master_link_status:up") {
			return m, r, nil
		}
		if time.Now().After(deadline) {
			m.stop()
			r.stop()
			return nil, nil, fmt.Errorf("replica of %s never in sync: %v", m.addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// usage is what Redis nodes spent: CPU seconds (user+sys) and network bytes.
type usage struct{ cpu, in, out float64 }

func (u usage) sub(b usage) usage { return usage{u.cpu - b.cpu, u.in - b.in, u.out - b.out} }

// redisUsage sums INFO cpu and INFO stats over nodes.
func redisUsage(nodes []*redisNode) usage {
	var u usage
	for _, n := range nodes {
		info, err := n.client.Info(context.Background(), "cpu", "stats").Result()
		if err != nil {
			continue
		}
		for _, line := range strings.Split(info, "\n") {
			k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
			if !ok {
				continue
			}
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				continue
			}
			switch k {
			case "used_cpu_sys", "used_cpu_user":
				u.cpu += f
			case "total_net_input_bytes":
				u.in += f
			case "total_net_output_bytes":
				u.out += f
			}
		}
	}
	return u
}
