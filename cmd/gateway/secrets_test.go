package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/docsgate/gateway/internal/redistest"
)

// secretSuffix is random text no log, metric or key name can contain by chance.
func secretSuffix(t *testing.T) string {
	t.Helper()
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 24)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}

// Item 9: no API key, whole or in part, appears in any log line (debug level, console and
// JSON), in /metrics, in any answer (body or header) or in any Redis key name, whatever path
// the request takes: accepted, rejected (401, 403, 400, 413, 415, 404, 405), rate limited
// (429), limiter down (503), upstream failing (502, 504).
func TestNoKeyLeaks(t *testing.T) {
	t.Parallel()
	suffixes := map[string]string{}
	for _, name := range []string{"admin", "assistant", "family", "long", "malformed", "badchar", "usage"} {
		suffixes[name] = secretSuffix(t)
	}
	adminKey := "svc_" + suffixes["admin"]
	asstKey := "svc_dsc_" + suffixes["assistant"]

	srv := redistest.Start(t)
	rc := srv.Client(t)
	limitsCfg := "limits:\n  agent_job_per_project: {limit: 2}\n  assistant_per_key: {limit: 2}\n"
	a := startGateway(t, platform(t), fmt.Sprintf("admin_token: %q\nredis:\n  addrs: [%q]\n  timeout: 200ms\n%s", adminToken, srv.Addr, limitsCfg), "-dev")
	dead := deadAddr(t)
	b := startGatewayRaw(t, fmt.Sprintf("upstream:\n  url: %q\nlog:\n  level: debug\n%s", "http://"+dead, limitsCfg))
	slow := faultUpstream(t) // /v2/agent/slow/ answers after 3 s
	c := startGatewayRaw(t, fmt.Sprintf("upstream:\n  url: %q\n  timeout: 300ms\nlog:\n  level: debug\n%s", slow, limitsCfg), "-dev")

	var answers strings.Builder
	client := hardClient(10 * time.Second)
	do := func(p *proc, method, path, auth, ctype, body string, wantStatus int) {
		t.Helper()
		req, _ := http.NewRequest(method, "http://"+p.public+path, strings.NewReader(body))
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		if ctype != "" {
			req.Header.Set("Content-Type", ctype)
		}
		res, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, path, err)
		}
		data, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != wantStatus {
			t.Errorf("%s %s (%.20s...): %d, want %d: %s", method, path, auth, res.StatusCode, wantStatus, data)
		}
		fmt.Fprintf(&answers, "%d %v %s\n", res.StatusCode, res.Header, data)
	}
	const js = "application/json"
	agent, asst := `{"prompt":"x"}`, `{"fp":"a","messages":[]}`
	// Accepted, then rate limited.
	do(a, "POST", "/v2/agent/p1/job", "Bearer "+adminKey, js, agent, 201)
	do(a, "POST", "/v2/agent/p1/job", "Bearer "+adminKey, js, agent, 201)
	do(a, "POST", "/v2/agent/p1/job", "Bearer "+adminKey, js, agent, 429)
	do(a, "POST", "/discovery/v1/assistant/acme/message", "Bearer "+asstKey, js, asst, 200)
	do(a, "POST", "/discovery/v1/assistant/acme/message", "Bearer "+asstKey, js, asst, 200)
	do(a, "POST", "/discovery/v1/assistant/acme/message", "Bearer "+asstKey, js, asst, 429)
	// Rejected for the key.
	do(a, "POST", "/v2/agent/p2/job", "Bearer sk_live_"+suffixes["family"], js, agent, 401)
	do(a, "POST", "/v2/agent/p2/job", "Bearer svc_"+suffixes["long"]+strings.Repeat("Z", 300), js, agent, 401)
	do(a, "POST", "/v2/agent/p2/job", "Bearer svc_"+suffixes["malformed"]+" extra", js, agent, 401)
	do(a, "POST", "/v2/agent/p2/job", "Basic svc_"+suffixes["malformed"], js, agent, 401)
	do(a, "POST", "/v2/agent/p2/job", "Bearer svc_"+suffixes["badchar"]+"!\"", js, agent, 401)
	do(a, "POST", "/v2/agent/p2/job", "Bearer "+asstKey, js, agent, 403)
	do(a, "POST", "/discovery/v1/assistant/acme/message", "Bearer "+adminKey, js, asst, 403)
	// Rejected for the request.
	do(a, "POST", "/v2/agent/p2/job", "Bearer "+adminKey, js, `{"prompt":""}`, 400)
	do(a, "POST", "/v2/agent/p2/job", "Bearer "+adminKey, js, `{"prompt":"`+adminKey+`"`, 400)
	do(a, "POST", "/v2/agent/p2/job", "Bearer "+adminKey, "text/plain", agent, 415)
	do(a, "POST", "/v2/agent/p2/job", "Bearer "+adminKey, js, `{"prompt":"`+strings.Repeat("x", 1100000)+`"}`, 413)
	do(a, "POST", "/v2/agent/p2/nope", "Bearer "+adminKey, js, agent, 404)
	do(a, "DELETE", "/v2/agent/p2/job", "Bearer "+adminKey, js, agent, 405)
	// Upstream failing.
	do(b, "POST", "/v2/agent/p3/job", "Bearer "+adminKey, js, agent, 502)
	do(b, "POST", "/discovery/v1/assistant/acme/message", "Bearer "+asstKey, js, asst, 502)
	do(c, "POST", "/v2/agent/slow/job", "Bearer "+adminKey, js, agent, 504)
	// The usage API takes a key in its body (admin listener).
	req, _ := http.NewRequest("POST", "http://"+a.admin+"/usage/key", strings.NewReader(`{"key":"svc_dsc_`+suffixes["usage"]+`"}`))
	req.Header.Set("Authorization", "Bearer "+adminToken)
	req.Header.Set("Content-Type", "application/json")
	if res, err := client.Do(req); err == nil {
		if res.StatusCode != 200 {
			t.Errorf("POST /usage/key: %d", res.StatusCode)
		}
		data, _ := io.ReadAll(res.Body)
		res.Body.Close()
		fmt.Fprintf(&answers, "%d %v %s\n", res.StatusCode, res.Header, data)
	}

	// Redis key names, then Redis down: the limiter's error path (503) with the keys.
	names, err := rc.Keys(context.Background(), "*").Result()
	if err != nil || len(names) == 0 {
		t.Fatalf("redis keys: %v %v", names, err)
	}
	srv.Stop(t)
	do(a, "POST", "/v2/agent/p4/job", "Bearer "+adminKey, js, agent, 503)
	do(a, "POST", "/discovery/v1/assistant/acme/message", "Bearer "+asstKey, js, asst, 503)

	time.Sleep(200 * time.Millisecond) // access-log lines are written as handlers return
	haystacks := map[string]string{
		"answers":    answers.String(),
		"redis keys": strings.Join(names, "\n"),
		"logs a":     a.out.String(),
		"logs b":     b.out.String(),
		"logs c":     c.out.String(),
		"metrics a":  mustMetrics(t, a),
		"metrics b":  mustMetrics(t, b),
		"metrics c":  mustMetrics(t, c),
	}
	if !strings.Contains(c.out.String(), "DEBUG") || !strings.Contains(b.out.String(), `"level":"debug"`) {
		t.Error("the gateways did not log at debug level; the search would prove less")
	}
	for where, hay := range haystacks {
		for name, suf := range suffixes {
			needles := []string{suf}
			for i := 0; i+12 <= len(suf); i++ {
				needles = append(needles, suf[i:i+12])
			}
			for _, n := range needles {
				if i := strings.Index(hay, n); i >= 0 {
					lo, hi := max(0, i-120), min(len(hay), i+len(n)+40)
					t.Errorf("%s key (or 12 characters of it, %q) appears in %s: ...%s...", name, n, where, hay[lo:hi])
					break
				}
			}
		}
	}
}

func mustMetrics(t *testing.T, p *proc) string {
	t.Helper()
	_, body := adminGet(t, p, "/metrics", adminToken)
	if !strings.Contains(body, "gateway_requests_total") {
		t.Fatalf("no metrics from %s", p.admin)
	}
	return body
}
