package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Refusals keep the client's connection when the request body is small and arrives at once:
// 401, 403 and 429 with small bodies are all answered on one connection. A large body closes
// it (a slow one too: TestRefusalsWithUnreadBody).
func TestKeepAliveOnRefusals(t *testing.T) {
	up := newBodyUpstream(t)
	p := startGateway(t, up.URL, "limits:\n  agent_job_per_project: {limit: 1, window: hour}\n")
	var dials atomic.Int32
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
		MaxIdleConnsPerHost: 1,
	}}
	do := func(path, key, body string) int {
		t.Helper()
		req, _ := http.NewRequest("POST", "http://"+p.public+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode
	}
	small := `{"prompt":"` + strings.Repeat("x", 2000) + `"}`
	for _, c := range []struct {
		name, path, key string
		want            int
	}{
		{"401 no key", "/v2/agent/ka/job", "", 401},
		{"401 unknown family", "/v2/agent/ka/job", "nope_123", 401},
		{"403 wrong key type", "/v2/agent/ka/job", "svc_dsc_browserkey", 403},
		{"201", "/v2/agent/ka/job", "svc_keepalive", 201},
		{"429", "/v2/agent/ka/job", "svc_keepalive", 429},
		{"404", "/v2/nowhere", "svc_keepalive", 404},
		{"401 again", "/v2/agent/ka/job", "", 401},
	} {
		if got := do(c.path, c.key, small); got != c.want {
			t.Fatalf("%s: %d", c.name, got)
		}
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("%d connections for 7 requests with small bodies, want 1 (kept alive after refusals)", n)
	}
	// A body over 64 KiB on a refusal closes the connection: the next request dials again.
	// (The client may see the 401, or, still writing its body when the connection closes, a
	// reset: the gateway does not read 100 KiB to refuse a request.)
	large := `{"prompt":"` + strings.Repeat("y", 100<<10) + `"}`
	req, _ := http.NewRequest("POST", "http://"+p.public+"/v2/agent/ka/job", strings.NewReader(large))
	req.Header.Set("Content-Type", "application/json")
	if res, err := client.Do(req); err == nil {
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != 401 {
			t.Fatalf("large body: %d", res.StatusCode)
		}
	}
	if got := do("/v2/agent/ka/job", "", small); got != 401 {
		t.Fatalf("after the large body: %d", got)
	}
	if n := dials.Load(); n != 2 {
		t.Fatalf("%d connections after a large refused body, want 2 (it closes its connection)", n)
	}
}
