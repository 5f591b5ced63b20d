// Package redistest runs real redis-server processes (standalone, Cluster) for tests.
//
// Redistest runs real redis-server processes for tests: one standalone
// server (Start) or a small Redis Cluster of masters (StartCluster). Every
// process listens on 127.0.0.1 only, keeps its data under t.TempDir(), and is
// killed by PID when the test ends.
package redistest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const notFound = "redis-server not found: install it with `apt-get install redis-server` (or run `make test`, which does)"

// readyTimeout bounds how long we wait for a fresh server to answer PING.
const readyTimeout = 10 * time.Second

// Server is a redis-server process on a free 127.0.0.1 port.
type Server struct {
	Addr string

	port  int
	dir   string
	extra []string // extra command-line arguments (cluster mode)
	conf  string   // config file given before the flags (Sentinel)

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	logf *os.File
}

// Start starts a standalone redis-server and registers its shutdown with t.Cleanup.
func Start(t testing.TB) *Server {
	t.Helper()
	return start(t, nil)
}

func start(t testing.TB, extraFn func(port int) []string) *Server {
	t.Helper()
	bin := lookServer(t)
	dir := t.TempDir()
	var lastErr error
	// Another process can grab the port between our probe and the server's
	// bind, so retry with a new port a few times.
	for attempt := 0; attempt < 5; attempt++ {
		port, err := FreePort()
		if err != nil {
			t.Fatalf("redistest: free port: %v", err)
		}
		s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), port: port, dir: dir}
		if extraFn != nil {
			s.extra = extraFn(port)
		}
		if lastErr = s.launch(bin); lastErr == nil {
			t.Cleanup(func() { s.Stop(t) })
			return s
		}
	}
	t.Fatalf("redistest: start redis-server: %v", lastErr)
	return nil
}

func lookServer(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal(notFound)
	}
	return bin
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (s *Server) launch(bin string) error {
	args := []string{
		"--port", strconv.Itoa(s.port),
		"--bind", "127.0.0.1",
		"--dir", s.dir,
		"--save", "",
		"--appendonly", "no",
		"--daemonize", "no",
		"--protected-mode", "no",
		"--loglevel", "warning",
	}
	args = append(args, s.extra...)
	if s.conf != "" {
		// Sentinel needs a config file of its own, given first.
		args = append([]string{s.conf}, args...)
	}
	logf, err := os.OpenFile(filepath.Join(s.dir, "redis.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = s.dir
	cmd.Stdout = logf
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	s.mu.Lock()
	s.cmd, s.done, s.logf = cmd, done, logf
	s.mu.Unlock()
	if err := s.waitReady(done, cmd.Process.Pid); err != nil {
		s.kill()
		return fmt.Errorf("%w; log: %s", err, s.logTail())
	}
	return nil
}

// waitReady waits until the server answers, and checks that the one answering is ours (pid):
// two harnesses can probe the same free port, and the one whose server then fails to bind
// would otherwise take the other's server for its own (and lose it when its owner stops it).
func (s *Server) waitReady(done <-chan struct{}, pid int) error {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	deadline := time.Now().Add(readyTimeout)
	for {
		select {
		case <-done:
			return fmt.Errorf("redis-server on %s exited early", s.Addr)
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		info, err := c.Info(ctx, "server").Result()
		cancel()
		if err == nil {
			if owner, _ := infoField(info, "process_id"); owner != strconv.Itoa(pid) {
				return fmt.Errorf("redis-server on %s: the port answers for process %s, not ours (%d)", s.Addr, owner, pid)
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("redis-server on %s not ready after %v: %v", s.Addr, readyTimeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *Server) logTail() string {
	b, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(bytes.TrimSpace(b))
}

// kill sends SIGKILL to the process (by PID) and waits for it to exit.
func (s *Server) kill() {
	s.mu.Lock()
	cmd, done, logf := s.cmd, s.done, s.logf
	s.cmd, s.done, s.logf = nil, nil, nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = syscall.Kill(cmd.Process.Pid, syscall.SIGKILL)
	<-done
	logf.Close()
}

// Stop kills (SIGKILL) the process and waits for it. Stopping twice is fine.
func (s *Server) Stop(t testing.TB) {
	t.Helper()
	s.kill()
}

// Restart starts the server again on the same port (and data dir).
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.kill()
	bin := lookServer(t)
	var err error
	// The old socket may linger briefly; retry the bind.
	for attempt := 0; attempt < 20; attempt++ {
		if err = s.launch(bin); err == nil {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("redistest: restart redis-server on %s: %v", s.Addr, err)
}

// Client returns a client for the server, closed at t.Cleanup.
func (s *Server) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Cluster is a Redis Cluster: masters only (StartCluster) or masters with replicas
// (StartClusterWithReplicas).
type Cluster struct {
	Addrs   []string
	Servers []*Server
	masters int // 0: every server is a master
}

// StartCluster starts n masters (n >= 3) with cluster-enabled yes, creates the
// cluster with redis-cli --cluster create, and waits for cluster_state:ok on
// every node.
func StartCluster(t testing.TB, n int) *Cluster {
	t.Helper()
	if n < 3 {
		t.Fatalf("redistest: a cluster needs at least 3 masters, got %d", n)
	}
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Fatal("redis-cli not found: install it with `apt-get install redis-server` (or run `make test`, which does)")
	}
	c := &Cluster{}
	for i := 0; i < n; i++ {
		s := start(t, func(int) []string {
			// The cluster bus port is chosen separately, so we never depend on
			// port+10000 being free.
			bus, err := FreePort()
			if err != nil {
				t.Fatalf("redistest: free port: %v", err)
			}
			return []string{"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
				"--cluster-port", strconv.Itoa(bus), "--cluster-node-timeout", "5000"}
		})
		c.Servers = append(c.Servers, s)
		c.Addrs = append(c.Addrs, s.Addr)
	}
	// Each server must have its own dir (nodes.conf); start uses t.TempDir()
	// per call, so they do.
	args := append([]string{"--cluster", "create"}, c.Addrs...)
	args = append(args, "--cluster-yes")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, cli, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("redistest: redis-cli --cluster create: %v\n%s", err, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, addr := range c.Addrs {
		rc := redis.NewClient(&redis.Options{Addr: addr})
		for {
			info, err := rc.ClusterInfo(context.Background()).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				rc.Close()
				t.Fatalf("redistest: cluster node %s not ok: %v %s", addr, err, info)
			}
			time.Sleep(50 * time.Millisecond)
		}
		rc.Close()
	}
	return c
}

// Client returns a cluster client, closed at t.Cleanup. It waits until the
// client sees slots on all masters.
func (c *Cluster) Client(t testing.TB) *redis.ClusterClient {
	t.Helper()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs})
	t.Cleanup(func() { _ = cc.Close() })
	deadline := time.Now().Add(10 * time.Second)
	for {
		shards, err := cc.ClusterShards(context.Background()).Result()
		want := c.masters
		if want == 0 {
			want = len(c.Addrs)
		}
		if err == nil && len(shards) >= want {
			return cc
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: cluster shards: %v %v", shards, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// infoField is the value of name in an INFO reply.
func infoField(info, name string) (string, bool) {
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && k == name {
			return v, true
		}
	}
	return "", false
}
