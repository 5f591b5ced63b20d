package main

import (
	"fmt"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/docsgate/gateway/internal/redistest"
)

// Readiness reports whether this process can serve, never Redis' health: with the default
// redis settings (timeout, on_error: deny, breaker), Redis killed after the start or down
// from the start, /readyz stays 200 while the limited routes answer 503 limiter_unavailable
// with Retry-After and the routes that need no Redis answer as usual (a refused key, a bad
// body, a CORS preflight, a route without limits); the trouble shows on /metrics (the node's
// gateway_ratelimit_breaker_open), on the usage page (the open node) and in the log. Draining is what
// turns /readyz to 503.
func TestReadyWhileRedisIsDown(t *testing.T) {
	for _, when := range []string{"killed after the start", "down from the start"} {
		t.Run(when, func(t *testing.T) {
			srv := redistest.Start(t)
			if when == "down from the start" {
				srv.Stop(t)
			}
			// Redis with every default; shutdown_delay keeps the draining replica serving (and
			// its /readyz answering 503) long enough to be seen.
			p := startGateway(t, platform(t), fmt.Sprintf("redis: {addrs: [%q]}\nserver: {shutdown_delay: 2s}\n", srv.Addr))
			if when == "killed after the start" {
				if res := send(t, p, "POST", "/v2/agent/p/job", "svc_ready", `{"prompt":"x"}`); res.StatusCode != 201 {
					t.Fatalf("before the kill: %d", res.StatusCode)
				}
				srv.Stop(t)
			}
			if code, body := adminGet(t, p, "/readyz", ""); code != 200 || !strings.Contains(body, `"ready"`) {
				t.Fatalf("readyz with Redis down: %d %s", code, body)
			}
			client := hardClient(5 * time.Second)
			for i := range 10 { // past the breaker's 5 failures
				r := hardDo(client, "POST", "http://"+p.public+"/v2/agent/p/job", "svc_ready", `{"prompt":"x"}`, nil)
				if r.status != 503 || !strings.Contains(r.body, `"code":"limiter_unavailable"`) {
					t.Fatalf("limited request %d with Redis down: %d %s", i, r.status, r.body)
				}
			}
			waitMetric(t, p, `gateway_ratelimit_breaker_open{node="`+srv.Addr+`"}`, time.Second, func(v float64) bool { return v == 1 })
			if res := send(t, p, "POST", "/v2/agent/p/job", "svc_ready", `{"prompt":"x"}`); res.StatusCode != 503 || res.Header.Get("Retry-After") != "1" {
				t.Fatalf("with the breaker open: %d, Retry-After %q", res.StatusCode, res.Header.Get("Retry-After"))
			}
			if code, body := adminGet(t, p, "/readyz", ""); code != 200 || !strings.Contains(body, `"ready"`) {
				t.Fatalf("readyz with the breaker open: %d %s", code, body)
			}

			// The routes that need no Redis are answered by the gateway as usual.
			for _, c := range []struct {
				name, method, path, key, body string
				want                          int
			}{
				{"refused key", "POST", "/v2/agent/p/job", "svc_dsc_wrong_family", `{"prompt":"x"}`, 403},
				{"no key", "POST", "/v2/agent/p/job", "", `{"prompt":"x"}`, 401},
				{"bad body", "POST", "/v2/agent/p/job", "svc_ready", `{"prompt":""}`, 400},
				{"unknown route", "GET", "/nowhere", "", "", 404},
			} {
				if r := hardDo(client, c.method, "http://"+p.public+c.path, c.key, c.body, nil); r.status != c.want {
					t.Errorf("%s with Redis down: %d %s, want %d", c.name, r.status, r.body, c.want)
				}
			}
			pre, _ := http.NewRequest("OPTIONS", "http://"+p.public+"/discovery/v1/assistant/acme/message", nil)
			pre.Header.Set("Origin", "https://docs.example.com")
			pre.Header.Set("Access-Control-Request-Method", "POST")
			if res, err := client.Do(pre); err != nil || res.StatusCode != 204 {
				t.Errorf("CORS preflight with Redis down: %v %v", err, res)
			} else {
				res.Body.Close()
			}

			// Where the trouble shows instead: the usage page and the log.
			if code, page := adminGet(t, p, "/ui/?partial=1", ""); code != 200 || !strings.Contains(page, `data-node="`+srv.Addr+`"`) {
				t.Errorf("the usage page does not show %s open: %d %s", srv.Addr, code, page)
			}
			if lines := logLines(p, "limiter breaker open"); len(lines) == 0 || lines[0]["node"] != srv.Addr {
				t.Errorf("log lines of the open breaker: %v, want one naming %s", lines, srv.Addr)
			}

			// Draining is what takes the replica out of rotation.
			if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(5 * time.Second)
			for {
				res, err := http.Get("http://" + p.admin + "/readyz")
				if err == nil {
					res.Body.Close()
					if res.StatusCode == 503 {
						break
					}
				}
				if err != nil || time.Now().After(deadline) {
					t.Fatalf("readyz after SIGTERM: %v %v, want 503 while draining", err, res)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}
