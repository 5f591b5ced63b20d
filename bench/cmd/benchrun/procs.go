package main

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

// proc is a child process started by the bench; every one is stopped by PID.
type proc struct {
	name string
	cmd  *exec.Cmd
	pid  int
	done chan struct{}
}

var (
	procsMu sync.Mutex
	procs   = map[*proc]bool{}
)

// startProc starts bin with args, pinned to cpu (taskset -c) when cpu is set, with extra
// environment, stdout and stderr to logPath.
func startProc(name, cpu string, env []string, logPath, bin string, args ...string) (*proc, error) {
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
	// Own process group, so a Ctrl-C on the terminal reaches only the bench, which then
	// stops its children one by one.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		out.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, pid: cmd.Process.Pid, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); out.Close(); close(p.done) }()
	procsMu.Lock()
	procs[p] = true
	procsMu.Unlock()
	return p, nil
}

// stop sends SIGTERM, waits up to 5s, then SIGKILL; always by PID.
func (p *proc) stop() {
	if p == nil {
		return
	}
	procsMu.Lock()
	delete(procs, p)
	procsMu.Unlock()
	_ = syscall.Kill(p.pid, syscall.SIGTERM)
	select {
	case <-p.done:
		return
	case <-time.After(5 * time.Second):
	}
	_ = syscall.Kill(p.pid, syscall.SIGKILL)
	<-p.done
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stopAll stops every child still running (on exit or interrupt).
func stopAll() {
	procsMu.Lock()
	list := make([]*proc, 0, len(procs))
	for p := range procs {
		list = append(list, p)
	}
	procsMu.Unlock()
	for _, p := range list {
		p.stop()
	}
}

// cpuSeconds is utime+stime of the process from /proc/PID/stat.
func (p *proc) cpuSeconds() float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.pid))
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

// rssKiB is VmRSS from /proc/PID/status.
func (p *proc) rssKiB() int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.pid))
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

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// waitHTTP polls url until any HTTP answer comes back, or fails after timeout.
func waitHTTP(p *proc, url string, timeout time.Duration) error {
	c := &http.Client{Timeout: 500 * time.Millisecond}
	deadline := time.Now().Add(timeout)
	for {
		if p.exited() {
			return fmt.Errorf("%s exited early", p.name)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
			cancel()
			return nil
		}
		cancel()
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not answering on %s after %v: %v", p.name, url, timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
