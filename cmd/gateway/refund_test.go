package main

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docsgate/gateway/internal/redistest"
)

// Issue 20, finding 2, against the binary in prefix mode (the default) with the default limits
// and auth.failure_limit: 100 requests with invented keys, refused by the upstream, leave the
// project's quota whole; the owner then gets exactly its 100 jobs of the hour. On both
// upstream transports, with the in-process store and with Redis.

const ownerKey = "svc_ownerSECRET"

// keyUpstream is a raw-socket upstream that knows the owner's keys: 401 (403 on assistant
// paths) for any other, as the platform answers invented keys.
func keyUpstream(t *testing.T) *rawUpstream {
	return newRawUpstream(t, func(req *http.Request, _ []byte) rawAnswer {
		switch key := strings.TrimPrefix(req.Header.Get("Authorization"), "Bearer "); {
		case key == ownerKey || key == "svc_dsc_ownerSECRET":
			return rawAnswer{}
		case strings.HasPrefix(req.URL.Path, "/discovery/"):
			return rawAnswer{Status: 403, Body: `{"error":"Forbidden."}`}
		default:
			return rawAnswer{Status: 401, Body: `{"error":"Invalid API key."}`}
		}
	})
}

// sendFrom posts body to path with key as the client at xff (behind the trusted proxy)
// and returns the status.
func sendFrom(t *testing.T, client *http.Client, p *proc, path, key, xff, body string) int {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://"+p.public+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Forwarded-For", xff)
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode
}

func TestInventedKeysLeaveTheQuota(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	for _, store := range []string{"memory", "redis"} {
		for _, tr := range transports {
			t.Run(store+"/"+tr, func(t *testing.T) {
				awayFromHourEnd(t) // the owner's 100 jobs and its 429 in one hour window
				up := keyUpstream(t)
				cfg := "  transport: " + tr + "\nclient_ip: {trusted_proxies: [\"127.0.0.1/32\"]}\n"
				if store == "redis" {
					srv.Client(t).FlushAll(t.Context())
					// redis.timeout 2s: exact counts are checked, not the timeout (exactTimeout).
					cfg += fmt.Sprintf("redis: {addrs: [%q], timeout: 2s}\n", srv.Addr)
				}
				p := startGateway(t, up.URL, cfg)
				client := &http.Client{Timeout: 10 * time.Second}
				scriptsBefore := 0
				if store == "redis" {
					scriptsBefore = redistest.ScriptCalls(t, srv.Client(t))
				}

				// 100 invented keys from 4 addresses (25 each, under auth.failure_limit's 30),
				// 4 at a time: every one reaches the upstream and is refused there.
				var wg sync.WaitGroup
				codes := make(chan int, 100)
				sem := make(chan struct{}, 4)
				for i := range 100 {
					wg.Add(1)
					sem <- struct{}{}
					go func() {
						defer wg.Done()
						defer func() { <-sem }()
						codes <- sendFrom(t, client, p, "/v2/agent/victim/job", fmt.Sprintf("svc_invented%03dSECRET", i),
							fmt.Sprintf("198.51.100.%d", 1+i%4), `{"prompt":"spend it"}`)
					}()
				}
				wg.Wait()
				close(codes)
				for c := range codes {
					if c != 401 {
						t.Fatalf("an invented key got %d, want the upstream's 401", c)
					}
				}
				waitMetric(t, p, `gateway_ratelimit_refunds_total{limit="agent_job_per_project",reason="upstream_401"}`, 10*time.Second,
					func(v float64) bool { return v == 100 })
				if store == "redis" {
					// One decision per request before forwarding, one refund each after.
					if n := redistest.ScriptCalls(t, srv.Client(t)) - scriptsBefore; n != 200 {
						t.Fatalf("%d script calls for 100 refused requests, want 200", n)
					}
				}
				if used := projectUsed(t, p, "victim"); used != 0 {
					t.Fatalf("100 refused invented keys left %d of the project's quota spent", used)
				}
				if store == "redis" {
					scriptsBefore = redistest.ScriptCalls(t, srv.Client(t))
				}

				// The owner gets its whole hour: 100 jobs, then 429.
				for i := range 100 {
					if c := sendFrom(t, client, p, "/v2/agent/victim/job", ownerKey, "203.0.113.1", `{"prompt":"mine"}`); c != 201 {
						t.Fatalf("the owner's job %d: %d", i, c)
					}
				}
				if c := sendFrom(t, client, p, "/v2/agent/victim/job", ownerKey, "203.0.113.1", `{"prompt":"mine"}`); c != 429 {
					t.Fatalf("the owner's 101st job: %d, want 429", c)
				}
				if store == "redis" {
					if n := redistest.ScriptCalls(t, srv.Client(t)) - scriptsBefore; n != 101 {
						t.Fatalf("%d script calls for the owner's 101 requests, want 101 (admitted ones are never refunded)", n)
					}
				}

				// Invented assistant keys cannot drain assistant_per_org either (403 here).
				msg := `{"fp":"u","messages":[{"id":"1","role":"user","content":"hi"}]}`
				for i := range 20 {
					if c := sendFrom(t, client, p, "/discovery/v1/assistant/acme/message", fmt.Sprintf("svc_dsc_inv%dSECRET", i), "198.51.100.50", msg); c != 403 {
						t.Fatalf("invented assistant key: %d", c)
					}
				}
				waitMetric(t, p, `gateway_ratelimit_refunds_total{limit="assistant_per_org",reason="upstream_403"}`, 10*time.Second,
					func(v float64) bool { return v == 20 })
				res, err := http.Get("http://" + p.admin + "/usage/orgs/acme")
				if err != nil {
					t.Fatal(err)
				}
				data, _ := io.ReadAll(res.Body)
				res.Body.Close()
				if !strings.Contains(string(data), `"name":"assistant_per_org","unit":"requests","limit":10000,"used":0,`) {
					t.Fatalf("assistant_per_org after 20 refused invented keys: %s", data)
				}
				if strings.Contains(p.out.String(), "SECRET") {
					t.Fatal("a key reached the log")
				}
			})
		}
	}
}

// The refusals cost the client its auth.failure_limit (30 in a minute, the default): the 31st
// request of an address that collected 30 upstream 401s is refused at the gateway, 429
// too_many_auth_failures, and never forwarded.
func TestUpstreamRefusalsCountAgainstTheBudget(t *testing.T) {
	t.Parallel()
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			up := keyUpstream(t)
			p := startGateway(t, up.URL, "  transport: "+tr+"\nclient_ip: {trusted_proxies: [\"127.0.0.1/32\"]}\n")
			client := &http.Client{Timeout: 10 * time.Second}
			for i := range 40 {
				want := 401
				if i >= 30 {
					want = 429
				}
				if c := sendFrom(t, client, p, "/v2/agent/victim/job", fmt.Sprintf("svc_guess%dSECRET", i), "198.51.100.9", `{"prompt":"x"}`); c != want {
					t.Fatalf("request %d: %d, want %d", i, c, want)
				}
			}
			if n := len(up.requests()); n != 30 {
				t.Fatalf("the upstream saw %d requests, want 30", n)
			}
			// Another address is not affected.
			if c := sendFrom(t, client, p, "/v2/agent/victim/job", ownerKey, "203.0.113.2", `{"prompt":"x"}`); c != 201 {
				t.Fatalf("another client: %d", c)
			}
		})
	}
}
