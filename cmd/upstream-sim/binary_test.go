package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// buildBinary compiles the command into a temporary directory.
func buildBinary(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the binary; skipped with -short")
	}
	bin := filepath.Join(t.TempDir(), "upstream-sim")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func TestBinaryServesAndStopsOnSIGTERM(t *testing.T) {
	bin := buildBinary(t)
	addr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	var stderr syncBuffer // the child's stderr
	cmd := exec.Command(bin, "-listen", addr, "-job-complete-after", "20ms", "-fast")
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			_ = syscall.Kill(pid, syscall.SIGKILL) // only our own child, by PID
			<-exited
		}
	})

	base := "http://" + addr
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(base + "/healthz")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 && string(b) == "ok" {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("server did not come up: %v\nstderr: %s", err, stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}

	j := createJob(t, base, "proj")
	if j["status"] != "active" {
		t.Errorf("status %v", j["status"])
	}
	if done, _ := waitCompleted(t, base, "proj", j["id"].(string)); done["prLink"] == nil {
		t.Errorf("completed without prLink")
	}

	resp := postStream(t, context.Background(), base+"/discovery/v1/assistant/d/message", assistantKey, assistantBodyJSON)
	lines := readLines(t, resp.Body)
	resp.Body.Close()
	checkStream(t, lines, fastAnswerParts) // -fast: short answer

	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		stopped = true
		if err != nil { // non-zero exit status or killed by a signal
			t.Fatalf("exit after SIGTERM: %v\nstderr: %s", err, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("still running 10s after SIGTERM\nstderr: %s", stderr.String())
	}
	if !strings.Contains(stderr.String(), "listening on "+addr) {
		t.Errorf("stderr = %q", stderr.String())
	}
	if strings.Contains(stderr.String(), "POST /v2/agent") {
		t.Errorf("logged requests without -log: %q", stderr.String())
	}
}

func TestBinaryHelpAndBadFlags(t *testing.T) {
	bin := buildBinary(t)
	out, err := exec.Command(bin, "-h").CombinedOutput()
	if err != nil {
		t.Fatalf("-h: %v", err)
	}
	for _, f := range []string{"-listen", "-job-complete-after", "-part-delay", "-answer-parts", "-fast", "-stamp", "-log"} {
		if !bytes.Contains(out, []byte(f)) {
			t.Errorf("-h does not document %s", f)
		}
	}
	for _, args := range [][]string{{"-part-delay", "-1s"}, {"-answer-parts", "-2"}, {"-nope"}, {"extra"}} {
		err := exec.Command(bin, args...).Run()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Errorf("%v: err %v, want exit status 2", args, err)
		}
	}
}
