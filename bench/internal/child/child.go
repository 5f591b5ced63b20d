// Package child starts the processes a benchmark measures (servers, Redis, simulators) and
// stops every one of them by PID, on success, error or interrupt.
package child

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// clockTicks is USER_HZ, the unit of utime and stime in /proc/PID/stat (100 on Linux).
const clockTicks = 100

// Group holds the processes started and not yet stopped.
type Group struct {
	mu   sync.Mutex
	live map[*Proc]bool
}

// Proc is one child process.
type Proc struct {
	Name string
	Pid  int
	g    *Group
	done chan struct{}
}

// Start starts bin with args, pinned to cpu (taskset -c) when cpu is set, with extra
// environment, stdout and stderr to logPath.
func (g *Group) Start(name, cpu string, env []string, logPath, bin string, args ...string) (*Proc, error) {
	argv := append([]string{bin}, args...)
	if cpu != "" {
		argv = append([]string{"taskset", "-c", cpu}, argv...)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	out, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = out, out
	// Own process group, so a Ctrl-C on the terminal reaches only the benchmark, which then
	// stops its children one by one.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		out.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Proc{Name: name, Pid: cmd.Process.Pid, g: g, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); out.Close(); close(p.done) }()
	g.mu.Lock()
	if g.live == nil {
		g.live = map[*Proc]bool{}
	}
	g.live[p] = true
	g.mu.Unlock()
	return p, nil
}

// StopAll stops every process still running.
func (g *Group) StopAll() {
	g.mu.Lock()
	list := make([]*Proc, 0, len(g.live))
	for p := range g.live {
		list = append(list, p)
	}
	g.mu.Unlock()
	for _, p := range list {
		p.Stop()
	}
}

// Stop sends SIGTERM, waits up to 5 s, then SIGKILL; always by PID. A nil Proc is a no-op.
func (p *Proc) Stop() {
	if p == nil {
		return
	}
	p.g.mu.Lock()
	delete(p.g.live, p)
	p.g.mu.Unlock()
	_ = syscall.Kill(p.Pid, syscall.SIGTERM)
	select {
	case <-p.done:
		return
	case <-time.After(5 * time.Second):
	}
	_ = syscall.Kill(p.Pid, syscall.SIGKILL)
	<-p.done
}

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// CPUSeconds is utime+stime of the process from /proc/PID/stat.
func (p *Proc) CPUSeconds() float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.Pid))
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	f := strings.Fields(s[i+2:]) // f[0] is field 3 (state)
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return float64(ut+st) / clockTicks
}

// RSSKiB is VmRSS from /proc/PID/status.
func (p *Proc) RSSKiB() int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.Pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, "VmRSS:") {
			f := strings.Fields(line)
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n
		}
	}
	return 0
}

// WaitHTTP polls url until it answers 200, or fails when p exits or after timeout.
func WaitHTTP(p *Proc, url string, timeout time.Duration) error {
	c := &http.Client{Timeout: 500 * time.Millisecond}
	deadline := time.Now().Add(timeout)
	for {
		if p.Exited() {
			return fmt.Errorf("%s exited early", p.Name)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := c.Do(req)
		cancel()
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not answering on %s after %v: %v", p.Name, url, timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// FreePort returns a loopback TCP port free at the time of the call.
func FreePort() int { return FreePorts(1)[0] }

// FreePorts returns n distinct loopback TCP ports free at the time of the call. They are held
// open together while chosen: closed one by one, the kernel may hand the same port out twice.
func FreePorts(n int) []int {
	ports := make([]int, n)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			panic(err) // no loopback port at all: nothing can be measured
		}
		defer l.Close()
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports
}
