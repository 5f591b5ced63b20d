// Package floodkit is what the flood benchmarks (cmd/flood, cmd/notifyflood) share: an
// assistant upstream, the assistant message sent as a client address behind a trusted proxy,
// and the report's formatting.
package floodkit

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"
)

// Send posts one assistant message (v1) to domain with key as client ip (X-Forwarded-For)
// and returns the status and the time to the whole answer (0 and the time when there was
// none).
func Send(c *http.Client, base, domain, ip, key string) (int, time.Duration) {
	req, _ := http.NewRequest("POST", base+"/discovery/v1/assistant/"+domain+"/message", strings.NewReader(`{"fp":"a","messages":[]}`))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Forwarded-For", ip)
	begin := time.Now()
	res, err := c.Do(req)
	if err != nil {
		return 0, time.Since(begin)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode, time.Since(begin)
}

// Upstream serves a short streamed assistant answer on a loopback port, until the process
// ends, and returns its URL.
func Upstream() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprint(w, "0:\"hi\"\nd:{\"finishReason\":\"stop\"}\n")
	})}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String(), nil
}

// MS formats d in milliseconds, to a tenth.
func MS(d time.Duration) string {
	return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
}

// Codes formats counts of HTTP statuses: "7000× 429, 3000× 401" by status.
func Codes(m map[int]int) string {
	keys := make([]int, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%d× %d", m[k], k)
	}
	return strings.Join(parts, ", ")
}

// LoadAvg is the machine's 1-minute load average, "?" when unknown.
func LoadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}
