package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	vegeta "github.com/tsenart/vegeta/v12/lib"
)

type wrkResult struct {
	rps            float64
	reqs           int64
	non2xx, sockEr int64
}

var (
	reRPS    = regexp.MustCompile(`Requests/sec:\s+([\d.]+)`)
	reReqs   = regexp.MustCompile(`(\d+) requests in`)
	reNon2xx = regexp.MustCompile(`Non-2xx or 3xx responses: (\d+)`)
	reSock   = regexp.MustCompile(`Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)`)
)

// runWrk is the closed loop: one wrk thread, conns connections, for d.
func runWrk(base string, w workload, script string, conns int, d time.Duration) (wrkResult, error) {
	secs := int(d.Round(time.Second) / time.Second)
	if secs < 1 {
		secs = 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), d+30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "wrk", "-t1", "-c"+strconv.Itoa(conns), "-d"+strconv.Itoa(secs)+"s", "--timeout", "10s",
		"-s", script, base+w.reqs[0].path)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return wrkResult{}, fmt.Errorf("wrk: %v\n%s", err, out)
	}
	s := string(out)
	var r wrkResult
	if m := reRPS.FindStringSubmatch(s); m != nil {
		r.rps, _ = strconv.ParseFloat(m[1], 64)
	} else {
		return r, fmt.Errorf("wrk: no Requests/sec in\n%s", s)
	}
	if m := reReqs.FindStringSubmatch(s); m != nil {
		r.reqs, _ = strconv.ParseInt(m[1], 10, 64)
	}
	if m := reNon2xx.FindStringSubmatch(s); m != nil {
		r.non2xx, _ = strconv.ParseInt(m[1], 10, 64)
	}
	if m := reSock.FindStringSubmatch(s); m != nil {
		for _, g := range m[1:] {
			n, _ := strconv.ParseInt(g, 10, 64)
			r.sockEr += n
		}
	}
	return r, nil
}

type openResult struct {
	n, errs        int
	p50, p99, p999 float64 // ms
	unexpected     map[string]int
	lat            []time.Duration // every request's latency, sorted
}

// runOpen is the open loop: vegeta at a constant rate for d, every request scheduled on
// time whatever the answers do (no coordinated omission); latencies exact from all results.
func runOpen(base, kind string, w workload, rate int, d time.Duration) openResult {
	want := map[string]int{}
	targets := make([]vegeta.Target, len(w.reqs))
	for i, r := range w.reqs {
		h := http.Header{}
		h.Set("Content-Type", "application/json")
		h.Set("Authorization", r.auth)
		targets[i] = vegeta.Target{Method: r.method, URL: base + r.path, Body: []byte(r.body), Header: h}
		want[base+r.path] = r.want[kind]
	}
	var next atomic.Uint64
	targeter := func(t *vegeta.Target) error {
		*t = targets[(next.Add(1)-1)%uint64(len(targets))]
		return nil
	}
	// Our own transport, so that its connections are closed when the run ends: the latency
	// sets keep their servers up for dozens of runs, and connections left idle by one run
	// would pile up in the server and in this process (each with its goroutines) run after run.
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 10000,
		IdleConnTimeout:     30 * time.Second,
	}
	defer tr.CloseIdleConnections()
	atk := vegeta.NewAttacker(vegeta.Client(&http.Client{Transport: tr}), vegeta.Timeout(10*time.Second), vegeta.KeepAlive(true),
		vegeta.Workers(32), vegeta.MaxWorkers(4000), vegeta.MaxBody(-1))
	res := openResult{unexpected: map[string]int{}}
	lat := make([]time.Duration, 0, int(float64(rate)*d.Seconds())+16)
	for r := range atk.Attack(targeter, vegeta.ConstantPacer{Freq: rate, Per: time.Second}, d, "bench") {
		res.n++
		lat = append(lat, r.Latency)
		if int(r.Code) != want[r.URL] {
			res.errs++
			key := strconv.Itoa(int(r.Code))
			if r.Error != "" && r.Code == 0 {
				key = r.Error
			}
			res.unexpected[key]++
		}
	}
	atk.Stop()
	slices.Sort(lat)
	res.lat = lat
	res.p50, res.p99, res.p999 = ms(quantile(lat, 0.5)), ms(quantile(lat, 0.99)), ms(quantile(lat, 0.999))
	return res
}

func quantile(v []time.Duration, q float64) time.Duration {
	if len(v) == 0 {
		return 0
	}
	i := int(q*float64(len(v))+0.5) - 1
	if i < 0 {
		i = 0
	}
	if i >= len(v) {
		i = len(v) - 1
	}
	return v[i]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// probe sends n requests of r (8 at a time) and returns the status counts; the caller reads
// the Redis counters around it, so the count per request is exact.
func probe(base string, r reqSpec, n int) (map[int]int, error) {
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 8}}
	defer client.CloseIdleConnections()
	var mu sync.Mutex
	codes := map[int]int{}
	var firstErr error
	var wg sync.WaitGroup
	var next atomic.Int64
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				req, _ := http.NewRequest(r.method, base+r.path, bytes.NewReader([]byte(r.body)))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", r.auth)
				resp, err := client.Do(req)
				mu.Lock()
				if err != nil {
					if firstErr == nil {
						firstErr = err
					}
					mu.Unlock()
					continue
				}
				codes[resp.StatusCode]++
				mu.Unlock()
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	wg.Wait()
	return codes, firstErr
}

func codesString(m map[int]int) string {
	var parts []string
	for k, v := range m {
		parts = append(parts, fmt.Sprintf("%d×%d", v, k))
	}
	slices.Sort(parts)
	return strings.Join(parts, " ")
}
