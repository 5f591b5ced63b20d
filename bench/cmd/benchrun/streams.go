package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/docsgate/gateway/bench/internal/child"
)

// Stream protocols measured: v1 (AI SDK 4's data stream protocol) and v2 (UI message stream).
var streamProtocols = []string{"v1", "v2"}

func streamRequest(ctx context.Context, base, proto string) *http.Request {
	r := assistantMsg
	if proto == "v2" {
		r = assistantMsgV2
	}
	req, _ := http.NewRequestWithContext(ctx, r.method, base+r.path, bytes.NewReader([]byte(r.body)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", r.auth)
	return req
}

type delayResult struct {
	parts, errs int
	p50, p99    float64 // µs from the upstream's stamp to arrival at the client
}

// stampOf returns the send time a text part of either protocol carries ("<unix-nanos> ..."
// at the start of its text), or false for other parts: v1 `0:"<nanos> ...`, v2
// `data: {"type":"text-delta",...,"delta":"<nanos> ...`.
func stampOf(line []byte) (int64, bool) {
	var rest []byte
	switch {
	case len(line) > 3 && line[0] == '0' && line[1] == ':' && line[2] == '"':
		rest = line[3:]
	case bytes.HasPrefix(line, []byte(`data: {"type":"text-delta"`)):
		i := bytes.Index(line, []byte(`"delta":"`))
		if i < 0 {
			return 0, false
		}
		rest = line[i+len(`"delta":"`):]
	default:
		return 0, false
	}
	sp := bytes.IndexByte(rest, ' ')
	if sp <= 0 {
		return 0, false
	}
	stamp, err := strconv.ParseInt(string(rest[:sp]), 10, 64)
	return stamp, err == nil
}

// runDelay keeps conc streams of protocol proto going for d against an upstream started with
// -stamp: every text part carries its send time ("<unix-nanos> ..."), and the client records
// arrival - stamp.
func runDelay(base, proto string, conc int, d time.Duration) delayResult {
	tr := &http.Transport{MaxIdleConnsPerHost: conc, DisableCompression: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
	deadline := time.Now().Add(d)
	var mu sync.Mutex
	var all []time.Duration
	errs := 0
	var wg sync.WaitGroup
	for g := 0; g < conc; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			bad := 0
			for time.Now().Before(deadline) {
				resp, err := client.Do(streamRequest(context.Background(), base, proto))
				if err != nil {
					bad++
					time.Sleep(10 * time.Millisecond)
					continue
				}
				if resp.StatusCode != 200 {
					bad++
				}
				br := bufio.NewReader(resp.Body)
				for {
					line, err := br.ReadSlice('\n')
					now := time.Now().UnixNano()
					if stamp, ok := stampOf(line); ok {
						mine = append(mine, time.Duration(now-stamp))
					}
					if err != nil {
						if err != io.EOF {
							bad++
						}
						break
					}
				}
				resp.Body.Close()
			}
			mu.Lock()
			all = append(all, mine...)
			errs += bad
			mu.Unlock()
		}()
	}
	wg.Wait()
	slices.Sort(all)
	us := func(x time.Duration) float64 { return float64(x) / float64(time.Microsecond) }
	return delayResult{parts: len(all), errs: errs, p50: us(quantile(all, 0.5)), p99: us(quantile(all, 0.99))}
}

type idleResult struct {
	opened        int
	before, after int64 // KiB
	perStreamKiB  float64
	openTime      time.Duration
	firstErr      string
}

// runIdle opens n streams of protocol proto against an upstream that sends the headers and
// the first parts, then waits minutes before the next: all n stay open and idle. RSS of the
// server under test is read before and with all of them open; every stream is then cancelled.
func runIdle(p *child.Proc, base, proto string, n int, timeout time.Duration) idleResult {
	var res idleResult
	// Warm up the pools with a few streams that are opened and closed.
	warm := openStreams(base, proto, 20, 5*time.Second)
	warm.closeAll()
	time.Sleep(300 * time.Millisecond)
	res.before = p.RSSKiB()
	start := time.Now()
	s := openStreams(base, proto, n, timeout)
	res.openTime = time.Since(start)
	res.opened = s.opened
	res.firstErr = s.firstErr
	time.Sleep(500 * time.Millisecond) // let the server settle (goroutines parked, buffers touched)
	res.after = p.RSSKiB()
	if s.opened > 0 {
		res.perStreamKiB = float64(res.after-res.before) / float64(s.opened)
	}
	s.closeAll()
	return res
}

type openSet struct {
	cancel   context.CancelFunc
	tr       *http.Transport
	mu       sync.Mutex
	bodies   []io.Closer
	opened   int
	firstErr string
}

func (s *openSet) closeAll() {
	s.cancel()
	s.mu.Lock()
	for _, b := range s.bodies {
		b.Close()
	}
	s.bodies = nil
	s.mu.Unlock()
	s.tr.CloseIdleConnections()
}

func openStreams(base, proto string, n int, timeout time.Duration) *openSet {
	ctx, cancel := context.WithCancel(context.Background())
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConnsPerHost: -1,
		DisableKeepAlives:   true,
		DisableCompression:  true,
	}
	client := &http.Client{Transport: tr}
	s := &openSet{cancel: cancel, tr: tr}
	deadline := time.Now().Add(timeout)
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for i := 0; i < n && time.Now().Before(deadline); i++ {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			resp, err := client.Do(streamRequest(ctx, base, proto))
			fail := func(e string) {
				s.mu.Lock()
				if s.firstErr == "" {
					s.firstErr = e
				}
				s.mu.Unlock()
			}
			if err != nil {
				fail(err.Error())
				return
			}
			if resp.StatusCode != 200 {
				fail(fmt.Sprintf("status %d", resp.StatusCode))
				resp.Body.Close()
				return
			}
			// The first part (v1 f:{"messageId":...}, v2 the start event) proves the stream
			// is through.
			br := bufio.NewReaderSize(resp.Body, 256)
			if _, err := br.ReadSlice('\n'); err != nil {
				fail("first part: " + err.Error())
				resp.Body.Close()
				return
			}
			s.mu.Lock()
			s.bodies = append(s.bodies, resp.Body)
			s.opened++
			s.mu.Unlock()
		}()
	}
	wg.Wait()
	return s
}
