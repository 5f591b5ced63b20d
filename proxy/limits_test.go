package proxy

import (
	"context"
	"encoding/json"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/internal/redistest"
	"github.com/docsgate/gateway/limits"
)

// stores runs a test against the in-process store and against a real redis-server.
func stores(t *testing.T, test func(t *testing.T, withStore gatewayOpt, srv *redistest.Server)) {
	t.Run("memory", func(t *testing.T) { test(t, func(*cfgT) {}, nil) })
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Start(t)
		test(t, func(c *cfgT) { c.Redis.Addrs = []string{srv.Addr} }, srv)
	})
}

func setLimit(name string, limit int64, window string) gatewayOpt {
	return func(c *cfgT) {
		if c.Limits == nil {
			c.Limits = map[string]config.Limit{}
		}
		c.Limits[name] = config.Limit{Limit: &limit, Window: window}
	}
}

var policyRE = regexp.MustCompile(`^"assistant_per_key";q=\d+;w=2592000, "assistant_per_org";q=\d+;w=3600, "assistant_per_ip";q=\d+;w=86400$`)

func TestLimitHeadersAndDenial(t *testing.T) {
	stores(t, func(t *testing.T, withStore gatewayOpt, _ *redistest.Server) {
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("RateLimit", `"upstream";r=1;t=1`) // the gateway's headers win
			w.Header().Set("RateLimit-Remaining", "1")
			w.WriteHeader(201)
		})
		g := newGateway(t, up, withStore, setLimit("assistant_per_org", 3, "hour"))
		h := jsonHdr(assistantKey)
		h.Set("Origin", "https://docs.acme.com")
		for i := 1; i <= 3; i++ {
			res, data := g.do(t, "POST", "/discovery/v2/assistant/acme/message", h, assistantBody)
			if res.StatusCode != 201 {
				t.Fatalf("request %d: %d %s", i, res.StatusCode, data)
			}
			if p := res.Header.Get("RateLimit-Policy"); !policyRE.MatchString(p) {
				t.Fatalf("RateLimit-Policy = %q", p)
			}
			want := `"assistant_per_org";r=` + strconv.Itoa(3-i) + `;t=`
			if rl := res.Header.Get("RateLimit"); !strings.Contains(rl, want) || !strings.Contains(rl, `"assistant_per_key";r=9999`) && i == 1 {
				t.Fatalf("RateLimit = %q, want %q...", rl, want)
			}
			if len(res.Header.Values("RateLimit")) != 1 || len(res.Header.Values("RateLimit-Remaining")) != 1 {
				t.Fatalf("upstream rate-limit headers leaked: %v", res.Header)
			}
			if res.Header.Get("RateLimit-Limit") != "3" || res.Header.Get("RateLimit-Remaining") != strconv.Itoa(3-i) {
				t.Fatalf("legacy headers: %v", res.Header)
			}
		}
		res, data := g.do(t, "POST", "/discovery/v2/assistant/acme/message", h, assistantBody)
		if res.StatusCode != 429 {
			t.Fatalf("4th request: %d %s", res.StatusCode, data)
		}
		var body struct {
			Error, Code, Limit string
			RetryAfter         int64 `json:"retry_after"`
		}
		if err := json.Unmarshal(data, &body); err != nil {
			t.Fatal(err)
		}
		retry, _ := strconv.ParseInt(res.Header.Get("Retry-After"), 10, 64)
		if body.Code != "rate_limited" || body.Limit != "assistant_per_org" || body.RetryAfter != retry || retry < 1 || retry > 3600 {
			t.Fatalf("429 body %s, Retry-After %d", data, retry)
		}
		m := regexp.MustCompile(`"assistant_per_org";r=0;t=(\d+)`).FindStringSubmatch(res.Header.Get("RateLimit"))
		if m == nil {
			t.Fatalf("RateLimit on 429 = %q", res.Header.Get("RateLimit"))
		}
		if tt, _ := strconv.ParseInt(m[1], 10, 64); retry < tt {
			t.Fatalf("Retry-After %d earlier than t=%d", retry, tt)
		}
		if res.Header.Get("Access-Control-Allow-Origin") != "*" || !strings.Contains(res.Header.Get("Access-Control-Expose-Headers"), "Retry-After") {
			t.Fatal("429 of an assistant route lacks CORS headers")
		}
		if n := len(g.up.requests()); n != 3 {
			t.Fatalf("upstream saw %d requests, want 3", n)
		}
		if got := lastLogField(g, 4, "denied_by"); got != "assistant_per_org" {
			t.Fatalf("access log denied_by = %q", got)
		}
		g.assertNoSecrets(t, data)
	})
}

// Exact under concurrency, v1 and v2 sharing one quota, and two replicas sharing one store.
func TestLimitExactUnderConcurrency(t *testing.T) {
	stores(t, func(t *testing.T, withStore gatewayOpt, srv *redistest.Server) {
		up := newUpstream(t, nil)
		// A generous timeout: 80 concurrent requests under -race on two cores are slow, and
		// this test is about exactness, not latency.
		opts := []gatewayOpt{withStore, setLimit("assistant_per_org", 25, "hour"), func(c *cfgT) { c.Redis.Timeout = 5 * time.Second }}
		a := newGateway(t, up, opts...)
		targets := []string{a.URL + "/discovery/v1/assistant/acme/message", a.URL + "/discovery/v2/assistant/acme/message"}
		if srv != nil { // a second replica on the same Redis
			b := newGateway(t, up, opts...)
			targets = append(targets, b.URL+"/discovery/v1/assistant/acme/message")
		}
		var mu sync.Mutex
		codes := map[int]int{}
		var wg sync.WaitGroup
		for i := range 80 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req, _ := http.NewRequest("POST", targets[i%len(targets)], strings.NewReader(assistantBody))
				req.Header = jsonHdr(assistantKey)
				res, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				res.Body.Close()
				mu.Lock()
				codes[res.StatusCode]++
				mu.Unlock()
			}()
		}
		wg.Wait()
		if codes[201] != 25 || codes[429] != 55 {
			t.Fatalf("codes = %v, want exactly 25 admitted and 55 denied", codes)
		}
	})
}

// A request denied by one limit consumes none of the others; requests refused before limiting
// consume nothing.
func TestLimitAllOrNothing(t *testing.T) {
	stores(t, func(t *testing.T, withStore gatewayOpt, _ *redistest.Server) {
		g := newGateway(t, newUpstream(t, nil), withStore, setLimit("assistant_per_org", 1, "hour"))
		// Refused before limiting: bad key, wrong family, bad body, unknown route, preflight.
		g.do(t, "POST", "/discovery/v1/assistant/acme/message", jsonHdr("svc_dsc_"), assistantBody)
		g.do(t, "POST", "/discovery/v1/assistant/acme/message", jsonHdr(adminKey), assistantBody)
		g.do(t, "POST", "/discovery/v1/assistant/acme/message", jsonHdr(assistantKey), `{"fp":""}`)
		g.do(t, "POST", "/discovery/v1/assistant/acme/nope", jsonHdr(assistantKey), assistantBody)
		g.do(t, "OPTIONS", "/discovery/v1/assistant/acme/message", hdr("Origin", "https://a.b", "Access-Control-Request-Method", "POST"), "")
		res, _ := g.do(t, "POST", "/discovery/v1/assistant/acme/message", jsonHdr(assistantKey), assistantBody)
		if res.StatusCode != 201 || !strings.Contains(res.Header.Get("RateLimit"), `"assistant_per_key";r=9999;`) {
			t.Fatalf("first valid request: %d RateLimit=%q (earlier refusals consumed quota?)", res.StatusCode, res.Header.Get("RateLimit"))
		}
		for range 3 {
			res, _ = g.do(t, "POST", "/discovery/v1/assistant/acme/message", jsonHdr(assistantKey), assistantBody)
			if res.StatusCode != 429 {
				t.Fatalf("status %d, want 429", res.StatusCode)
			}
		}
		// The org limit denied three times; the key and ip limits must still show one use.
		rl := res.Header.Get("RateLimit")
		if !strings.Contains(rl, `"assistant_per_key";r=9999;`) || !strings.Contains(rl, `"assistant_per_ip";r=9999;`) {
			t.Fatalf("denied requests consumed other limits: RateLimit = %q", rl)
		}
		// Another org is unaffected; a domain mapped to no org is an org of its own.
		res, _ = g.do(t, "POST", "/discovery/v1/assistant/other/message", jsonHdr(assistantKey), assistantBody)
		if res.StatusCode != 201 {
			t.Fatalf("other org: %d", res.StatusCode)
		}
	})
}

func TestOrgsShareQuotaAcrossDomains(t *testing.T) {
	g := newGateway(t, newUpstream(t, nil), setLimit("assistant_per_org", 2, "hour"),
		func(c *cfgT) { c.Orgs = map[string]config.Org{"acme": {Domains: []string{"acme-docs", "acme-api"}}} })
	for i, d := range []string{"acme-docs", "acme-api", "acme-docs"} {
		res, _ := g.do(t, "POST", "/discovery/v1/assistant/"+d+"/message", jsonHdr(assistantKey), assistantBody)
		if want := []int{201, 201, 429}[i]; res.StatusCode != want {
			t.Fatalf("request %d (%s): %d, want %d", i, d, res.StatusCode, want)
		}
	}
}

func TestShortWindowResets(t *testing.T) {
	stores(t, func(t *testing.T, withStore gatewayOpt, _ *redistest.Server) {
		g := newGateway(t, newUpstream(t, nil), withStore, setLimit("agent_job_per_project", 2, "1s"))
		deadline := time.Now().Add(5 * time.Second)
		// Align to a fresh window so both admitted requests fall in one.
		for time.Now().UnixMilli()%1000 > 300 {
			time.Sleep(10 * time.Millisecond)
		}
		got := []int{}
		for range 3 {
			res, _ := g.do(t, "POST", "/v2/agent/p1/job", jsonHdr(adminKey), agentBody)
			got = append(got, res.StatusCode)
		}
		if got[0] != 201 || got[1] != 201 || got[2] != 429 {
			t.Fatalf("codes %v", got)
		}
		for {
			res, _ := g.do(t, "POST", "/v2/agent/p1/job", jsonHdr(adminKey), agentBody)
			if res.StatusCode == 201 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("a new window did not admit again")
			}
			time.Sleep(100 * time.Millisecond)
		}
		// Another project has its own counter.
		if res, _ := g.do(t, "POST", "/v2/agent/p2/job", jsonHdr(adminKey), agentBody); res.StatusCode != 201 {
			t.Fatalf("other project: %d", res.StatusCode)
		}
	})
}

func TestIPv6ClientsGroupedByPrefix(t *testing.T) {
	g := newGateway(t, newUpstream(t, nil), setLimit("assistant_per_ip", 2, "hour"),
		func(c *cfgT) { c.ClientIP.TrustedProxies = []string{"127.0.0.1"} })
	send := func(ip string) int {
		h := jsonHdr(assistantKey)
		h.Set("X-Forwarded-For", ip)
		res, _ := g.do(t, "POST", "/discovery/v1/assistant/acme/message", h, assistantBody)
		return res.StatusCode
	}
	if a, b, c := send("2001:db8:1:2::1"), send("2001:db8:1:2:ffff::9"), send("2001:db8:1:2::abcd"); a != 201 || b != 201 || c != 429 {
		t.Fatalf("same /64: %d %d %d", a, b, c)
	}
	if c := send("2001:db8:1:3::1"); c != 201 {
		t.Fatalf("another /64: %d", c)
	}
	if c := send("198.51.100.7"); c != 201 {
		t.Fatalf("an IPv4 client: %d", c)
	}
}

func TestLimiterFailure(t *testing.T) {
	for _, onError := range []string{"deny", "allow"} {
		t.Run(onError, func(t *testing.T) {
			srv := redistest.Start(t)
			g := newGateway(t, newUpstream(t, nil), func(c *cfgT) {
				c.Redis.Addrs = []string{srv.Addr}
				c.Redis.OnError = onError
				c.Redis.Timeout = 200 * time.Millisecond
			})
			if res, _ := g.do(t, "POST", "/v2/agent/p/job", jsonHdr(adminKey), agentBody); res.StatusCode != 201 {
				t.Fatalf("before the failure: %d", res.StatusCode)
			}
			srv.Stop(t)
			for range 8 { // past the breaker threshold
				start := time.Now()
				res, data := g.do(t, "POST", "/v2/agent/p/job", jsonHdr(adminKey), agentBody)
				if time.Since(start) > 2*time.Second {
					t.Fatalf("request took %v with Redis down", time.Since(start))
				}
				switch onError {
				case "deny":
					if res.StatusCode != 503 || res.Header.Get("Retry-After") != "1" || decodeError(t, res, data).Code != "limiter_unavailable" {
						t.Fatalf("deny: %d %v %s", res.StatusCode, res.Header, data)
					}
				case "allow":
					if res.StatusCode != 201 {
						t.Fatalf("allow: %d %s", res.StatusCode, data)
					}
				}
			}
			srv.Restart(t)
			deadline := time.Now().Add(10 * time.Second)
			for {
				res, _ := g.do(t, "POST", "/v2/agent/p/job", jsonHdr(adminKey), agentBody)
				if res.StatusCode == 201 && res.Header.Get("RateLimit") != "" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("limiter did not recover after Redis returned")
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
}

// One script call per limited request, none for requests refused before limiting.
func TestOneScriptCallPerRequest(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	g := newGateway(t, newUpstream(t, nil), func(c *cfgT) { c.Redis.Addrs = []string{srv.Addr} })
	g.do(t, "POST", "/discovery/v1/assistant/acme/message", jsonHdr(assistantKey), assistantBody) // loads the script
	before := redistest.ScriptCalls(t, client)
	for range 10 {
		g.do(t, "POST", "/discovery/v1/assistant/acme/message", jsonHdr(assistantKey), assistantBody)
		g.do(t, "POST", "/discovery/v1/assistant/acme/message", jsonHdr(adminKey), assistantBody)
		g.do(t, "POST", "/discovery/v1/assistant/acme/message", jsonHdr(assistantKey), `{}`)
	}
	if got := redistest.ScriptCalls(t, client) - before; got != 10 {
		t.Fatalf("%d script calls for 10 limited requests (and 20 refused ones)", got)
	}
	// No key name holds the raw key.
	keys, err := client.Keys(context.Background(), "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if strings.Contains(k, "SECRET") || strings.Contains(k, "svc_") {
			t.Fatalf("key name %q holds the API key", k)
		}
	}
	if len(keys) != 3 {
		t.Fatalf("keys = %q, want one per limit", keys)
	}
}

// "Near the limit" has one definition for requests and tokens: 10% of the limit or less
// remains. With a limit of 10, the 9th admission leaves 1 (exactly 10%): near.
func TestNearLimitIsTenPercentOrLess(t *testing.T) {
	up := newUpstream(t, nil)
	g := newGateway(t, up, setLimit("agent_job_per_project", 10, "hour"))
	near := func() float64 {
		return g.counter(t, "gateway_ratelimit_near_limit_total", "route", "agent_job", "limit", "agent_job_per_project")
	}
	for i := 1; i <= 10; i++ {
		res, data := g.do(t, "POST", "/v2/agent/near/job", jsonHdr(adminKey), agentBody)
		if res.StatusCode != 201 {
			t.Fatalf("request %d: %d %s", i, res.StatusCode, data)
		}
		// Remaining after request i is 10-i: near from the 9th on.
		want := float64(max(i-8, 0))
		if got := near(); got != want {
			t.Fatalf("after request %d (%d left of 10): near_limit = %v, want %v", i, 10-i, got, want)
		}
	}
	for _, c := range []struct {
		remaining, limit int64
		near             bool
	}{{10, 100, true}, {11, 100, false}, {0, 1, true}, {1, 9, false}, {1, 10, true}, {0, 0, true}} {
		res := limits.Result{Rule: &limits.Rule{Limit: c.limit}, Limit: c.limit, Remaining: c.remaining}
		if got := nearLimit(&res); got != c.near {
			t.Errorf("nearLimit(%d of %d) = %v, want %v", c.remaining, c.limit, got, c.near)
		}
	}
}
