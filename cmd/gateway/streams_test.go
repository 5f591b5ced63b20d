package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// vmRSS reads VmRSS (bytes) of a process from /proc.
func vmRSS(t *testing.T, pid int) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// Item 5: 1,000 concurrent open streams through one gateway binary all complete; memory and
// goroutines per open stream are measured (VmRSS and go_goroutines while all are open, minus
// before, over 1,000). The binary is the suite's -race build unless STREAMS_NORACE=1, which
// builds a plain one for production-like numbers.
func TestThousandConcurrentStreams(t *testing.T) {
	const streams = 1000
	if os.Getenv("STREAMS_NORACE") == "1" {
		bin := filepath.Join(t.TempDir(), "gateway")
		if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
			t.Fatalf("build: %v\n%s", err, out)
		}
		old := gatewayBin
		gatewayBin = bin
		defer func() { gatewayBin = old }()
	}

	var opened atomic.Int32
	release := make(chan struct{})
	var releaseOnce sync.Once
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprint(w, "f:{\"messageId\":\"m\"}\n")
		http.NewResponseController(w).Flush()
		opened.Add(1)
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		fmt.Fprint(w, "0:\"hello\"\ne:{\"finishReason\":\"stop\"}\nd:{\"finishReason\":\"stop\"}\n")
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { releaseOnce.Do(func() { close(release) }); srv.Close() })

	p := startGateway(t, "http://"+ln.Addr().String(), "limits:\n  assistant_per_ip: {limit: 0}\n  assistant_per_org: {limit: 0}\n  assistant_per_key: {limit: 0}\n")
	const want = "f:{\"messageId\":\"m\"}\n0:\"hello\"\ne:{\"finishReason\":\"stop\"}\nd:{\"finishReason\":\"stop\"}\n"
	body := hardAsstBody
	raw := fmt.Sprintf("POST /discovery/v1/assistant/acme/message HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer svc_dsc_many\r\n"+
		"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)

	// stream opens one stream on its own connection, reports when the first part is in, waits
	// for the rest and returns what it read.
	stream := func(first chan<- error) (string, error) {
		c, err := net.DialTimeout("tcp", p.public, 5*time.Second)
		if err != nil {
			first <- err
			return "", err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(40 * time.Second))
		if _, err := io.WriteString(c, raw); err != nil {
			first <- err
			return "", err
		}
		br := bufio.NewReader(c)
		res, err := http.ReadResponse(br, nil)
		if err != nil {
			first <- err
			return "", err
		}
		defer res.Body.Close()
		rb := bufio.NewReader(res.Body)
		line, err := rb.ReadString('\n')
		first <- err
		if err != nil {
			return line, err
		}
		rest, err := io.ReadAll(rb)
		return line + string(rest), err
	}

	// Warm up (pools, buffers), then the baseline.
	warm := make(chan struct{})
	go func() {
		defer close(warm)
		var wg sync.WaitGroup
		for range 20 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				first := make(chan error, 1)
				_, _ = stream(first)
			}()
		}
		wg.Wait()
	}()
	for opened.Load() < 20 {
		time.Sleep(5 * time.Millisecond)
	}
	// The 20 warm-up streams stay open until release: they are part of the baseline.
	time.Sleep(300 * time.Millisecond)
	pid := p.cmd.Process.Pid
	rssBefore := vmRSS(t, pid)
	gorBefore := scrape(t, p)["go_goroutines"]

	start := time.Now()
	firsts := make(chan error, streams)
	results := make(chan string, streams)
	sem := make(chan struct{}, 64) // dial at most 64 at a time
	for range streams {
		go func() {
			sem <- struct{}{}
			f := make(chan error, 1)
			go func() { e := <-f; <-sem; firsts <- e }()
			got, err := stream(f)
			if err != nil {
				got = "error: " + err.Error() + " after " + got
			}
			results <- got
		}()
	}
	deadline := time.After(30 * time.Second)
	for i := range streams {
		select {
		case err := <-firsts:
			if err != nil {
				t.Fatalf("stream %d did not open: %v", i, err)
			}
		case <-deadline:
			t.Fatalf("only %d of %d streams opened in 30s", i, streams)
		}
	}
	openAfter := time.Since(start)
	time.Sleep(200 * time.Millisecond)
	rssOpen := vmRSS(t, pid)
	m := scrape(t, p)
	gorOpen := m["go_goroutines"]
	inflight := m[`gateway_inflight_requests{route="assistant_message"}`]

	releaseOnce.Do(func() { close(release) })
	<-warm
	bad := 0
	var example string
	for range streams {
		if got := <-results; got != want {
			bad++
			example = got
		}
	}
	if bad > 0 {
		t.Fatalf("%d of %d streams incomplete, e.g. %q", bad, streams, example)
	}
	kind := "-race build"
	if os.Getenv("STREAMS_NORACE") == "1" {
		kind = "plain build"
	}
	t.Logf("%d streams open after %v (%s); in flight %v", streams, openAfter.Round(time.Millisecond), kind, inflight)
	t.Logf("VmRSS %.1f MiB -> %.1f MiB: %.1f KiB per open stream", float64(rssBefore)/(1<<20), float64(rssOpen)/(1<<20), float64(rssOpen-rssBefore)/1024/streams)
	t.Logf("go_goroutines %v -> %v: %.2f per open stream", gorBefore, gorOpen, (gorOpen-gorBefore)/streams)
	if inflight < streams {
		t.Errorf("gateway_inflight_requests %v while %d streams were open", inflight, streams)
	}
	// Bounds that catch a leak or a buffer per stream gone wrong, far above the measured values.
	if per := (gorOpen - gorBefore) / streams; per > 8 {
		t.Errorf("%.2f goroutines per open stream", per)
	}
	if per := float64(rssOpen-rssBefore) / streams; per > 1<<20 {
		t.Errorf("%.0f bytes per open stream", per)
	}
}
