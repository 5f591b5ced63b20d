package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/docsgate/gateway/internal/redistest"
)

// quotaStore is a limit store as the config names it: in process, a standalone Redis, a
// Redis Cluster of 3 masters. start starts its servers, stopped when the (sub)test ends, and
// returns the config's redis: section ("" in process).
type quotaStore struct {
	name  string
	start func(t *testing.T) string
}

// quotaStores returns the in-process store (memory), a standalone Redis, and a Cluster
// (cluster). Their redis: sections set exactTimeout: the tests that run on them check exact
// counts and answers, not redis.timeout.
func quotaStores(memory, cluster bool) []quotaStore {
	var out []quotaStore
	if memory {
		out = append(out, quotaStore{"memory", func(*testing.T) string { return "" }})
	}
	out = append(out, quotaStore{"redis", func(t *testing.T) string {
		return fmt.Sprintf("redis: {addrs: [%q], timeout: %s}\n", redistest.Start(t).Addr, exactTimeout)
	}})
	if cluster {
		out = append(out, quotaStore{"cluster", func(t *testing.T) string {
			return fmt.Sprintf("redis: {addrs: [%s], timeout: %s}\n", quoteAll(redistest.StartCluster(t, 3).Addrs), exactTimeout)
		}})
	}
	return out
}

// exactTimeout is the redis.timeout of tests about exact counts and answers: under -race on a
// loaded two-core machine a healthy call can outlast the default 100 ms, and turn a request the
// test counts into a 503 it did not cause. Tests about the timeout itself keep 100 ms and inject
// their fault (a busy script, a paused or stalled Redis), or measure the machine first.
const exactTimeout = "2s"

// storeAddrs returns the addresses of a redis: section that quotaStores or everyStore wrote.
func storeAddrs(t *testing.T, redisCfg string) []string {
	t.Helper()
	m := regexp.MustCompile(`addrs: \[([^\]]*)\]`).FindStringSubmatch(redisCfg)
	if m == nil {
		t.Fatalf("no addrs in %q", redisCfg)
	}
	var out []string
	for _, a := range strings.Split(m[1], ",") {
		out = append(out, strings.Trim(strings.TrimSpace(a), `"`))
	}
	return out
}

// everyStore is every kind of limit store: in process, standalone Redis, Redis behind
// Sentinel and a Redis Cluster.
func everyStore() []quotaStore {
	sentinel := quotaStore{"sentinel", func(t *testing.T) string {
		s := redistest.StartSentinel(t, "gwmaster", redistest.Start(t))
		return fmt.Sprintf("redis: {addrs: [%q], master_name: gwmaster, timeout: %s}\n", s.Addr, exactTimeout)
	}}
	s := quotaStores(true, true) // memory, redis, cluster
	return []quotaStore{s[0], s[1], sentinel, s[2]}
}

// reloadMarker starts the part of a test's config file that reloadConfig replaces.
const reloadMarker = "# reloaded below\n"

// reloadConfig replaces what follows reloadMarker in p's config file with body and reloads it
// through POST /reload, which must accept it (the config sets admin_token: adminToken).
func reloadConfig(t *testing.T, p *proc, body string) {
	t.Helper()
	path := p.cmd.Args[2]
	old, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	i := strings.Index(string(old), reloadMarker)
	if i < 0 {
		t.Fatal("config without reloadMarker")
	}
	if err := os.WriteFile(path, []byte(string(old[:i])+reloadMarker+body), 0o600); err != nil {
		t.Fatal(err)
	}
	req := mustRequest(t, "POST", "http://"+p.admin+"/reload")
	req.Header.Set("Authorization", "Bearer "+adminToken) // writes need the admin token
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("POST /reload: %d", res.StatusCode)
	}
}

// codeCounter counts answers by status code, from several goroutines.
type codeCounter struct {
	mu sync.Mutex
	m  map[int]int
}

func (c *codeCounter) add(code int) {
	c.mu.Lock()
	if c.m == nil {
		c.m = map[int]int{}
	}
	c.m[code]++
	c.mu.Unlock()
}

func (c *codeCounter) get() map[int]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[int]int{}
	for k, v := range c.m {
		out[k] = v
	}
	return out
}

// hammer sends path for each of ids from one goroutine per id until stop is closed, and
// counts the answers (0: no answer).
func hammer(p *proc, stop <-chan struct{}, key, body string, paths ...string) (*codeCounter, *sync.WaitGroup) {
	codes := &codeCounter{}
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 10 * time.Second}
	for _, path := range paths {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 5000; i++ {
				select {
				case <-stop:
					return
				default:
				}
				req, _ := http.NewRequest("POST", "http://"+p.public+path, strings.NewReader(body))
				req.Header.Set("Authorization", "Bearer "+key)
				req.Header.Set("Content-Type", "application/json")
				code := 0
				if res, err := client.Do(req); err == nil {
					res.Body.Close()
					code = res.StatusCode
				}
				codes.add(code)
				time.Sleep(2 * time.Millisecond)
			}
		}()
	}
	return codes, &wg
}

// admitted sends n requests and counts the admitted ones (201, 200 for an answer streamed);
// any answer but these and 429 fails the test.
func admitted(t *testing.T, p *proc, n int, path, key, body string) int {
	t.Helper()
	ok := 0
	for i := range n {
		res := send(t, p, "POST", path, key, body)
		switch res.StatusCode {
		case 200, 201:
			ok++
		case 429:
		default:
			t.Fatalf("%s request %d: %d, want 200, 201 or 429", path, i, res.StatusCode)
		}
	}
	return ok
}

// limiterHealthyButSlow fails the test unless the limiter's only failures were timeouts and its
// breaker is closed, and returns how many timeouts there were.
func limiterHealthyButSlow(t *testing.T, p *proc) float64 {
	t.Helper()
	m := scrape(t, p)
	for k, v := range limiterErrors(m) {
		if k != `{kind="timeout"}` && v != 0 {
			t.Errorf("gateway_ratelimit_decision_errors_total%s = %v, want 0", k, v)
		}
	}
	if open, _ := openBreakers(m); len(open) != 0 {
		t.Errorf("breakers open: %v", open)
	}
	return limiterErrors(m)[`{kind="timeout"}`]
}

// limiterHealthy fails the test unless the limiter never failed and its breaker is closed.
func limiterHealthy(t *testing.T, p *proc) {
	t.Helper()
	m := scrape(t, p)
	for k, v := range m {
		if strings.HasPrefix(k, "gateway_ratelimit_decision_errors_total") && v != 0 {
			t.Errorf("%s = %v, want 0", k, v)
		}
	}
	if open, _ := openBreakers(m); len(open) != 0 {
		t.Errorf("breakers open: %v", open)
	}
}

// A limit changing algorithm (fixed <-> gcra) by a reload, with counters in flight under load,
// and an org moved to a plan whose override changes the algorithm: no request fails. Each
// algorithm counts under keys of its own, so a tenant starts the new algorithm's counter fresh,
// or resumes the count that algorithm kept earlier in the window.
func TestAlgorithmChangeNeverFails(t *testing.T) {
	t.Parallel()
	up := platform(t)
	for _, s := range quotaStores(true, true) {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel() // each store its own servers and gateway
			const fixed, gcra = "fixed", "gcra"
			limitsCfg := func(agentAlgo string, acmePlan string) string {
				return fmt.Sprintf(`limits:
  agent_job_per_project: {limit: 5, window: hour, algorithm: %s}
  assistant_per_org: {limit: 5, window: hour}
plans:
  smooth: {assistant_per_org: {algorithm: gcra}}
orgs:
  acme: {domains: [acme-docs], plan: %q}
  beta: [beta-docs]
`, agentAlgo, acmePlan)
			}
			p := startGateway(t, up, s.start(t)+fmt.Sprintf("admin_token: %q\n", adminToken)+reloadMarker+limitsCfg(fixed, ""))
			stop := make(chan struct{})
			load, wg := hammer(p, stop, "svc_load", `{"prompt":"x"}`, "/v2/agent/load0/job", "/v2/agent/load1/job", "/v2/agent/load2/job")
			agent := func(n int, project string) int {
				return admitted(t, p, n, "/v2/agent/"+project+"/job", "svc_q", `{"prompt":"x"}`)
			}
			// fixed -> gcra -> fixed -> gcra, two tenants with 2 of 5 used at a switch.
			if n := agent(2, "sw"); n != 2 {
				t.Fatalf("fixed: %d admitted", n)
			}
			reloadConfig(t, p, limitsCfg(gcra, ""))
			if n := agent(7, "sw"); n != 5 {
				t.Fatalf("fixed -> gcra with 2 of 5 used: %d admitted, want 5 (a fresh bucket)", n)
			}
			if n := agent(2, "g2"); n != 2 {
				t.Fatalf("gcra: %d admitted", n)
			}
			reloadConfig(t, p, limitsCfg(fixed, ""))
			if n := agent(7, "g2"); n != 5 {
				t.Fatalf("gcra -> fixed with 2 of 5 used: %d admitted, want 5 (a fresh window count)", n)
			}
			if n := agent(7, "sw"); n != 3 {
				t.Fatalf("back to fixed: %d admitted, want the 3 left of the window's count", n)
			}
			reloadConfig(t, p, limitsCfg(gcra, ""))
			if n := agent(7, "g2"); n != 3 {
				t.Fatalf("back to gcra: %d admitted, want the 3 left in the bucket", n)
			}
			// More switches while the load's counters are in flight.
			for i := range 6 {
				reloadConfig(t, p, limitsCfg([]string{fixed, gcra}[i%2], ""))
				time.Sleep(50 * time.Millisecond)
			}

			// A plan upgrade that changes the algorithm: acme moves to "smooth" (gcra) with 2
			// of 5 used; beta stays on the defaults and keeps its count.
			asst := func(n int, domain string) int {
				return admitted(t, p, n, "/discovery/v1/assistant/"+domain+"/message", "svc_dsc_q", `{"fp":"a","messages":[]}`)
			}
			if a, b := asst(2, "acme-docs"), asst(2, "beta-docs"); a != 2 || b != 2 {
				t.Fatalf("before the upgrade: %d and %d admitted", a, b)
			}
			reloadConfig(t, p, limitsCfg(fixed, "smooth"))
			if n := asst(7, "acme-docs"); n != 5 {
				t.Fatalf("acme on the gcra plan: %d admitted, want 5", n)
			}
			if n := asst(7, "beta-docs"); n != 3 {
				t.Fatalf("beta, untouched: %d admitted, want 3", n)
			}
			close(stop)
			wg.Wait()
			codes := load.get()
			// The background load may still meet redis.timeout (exactTimeout) on a machine
			// loaded past it: such a 503 is a timeout, counted as kind="timeout". Any other limiter error (data: a
			// key of the other type; node; an open breaker) fails the test, and so does a
			// 503 that no timeout explains.
			timeouts := limiterHealthyButSlow(t, p)
			if len(codes) == 0 || codes[0] != 0 || float64(codes[503]) > timeouts || codes[201] == 0 || codes[201]+codes[429]+codes[503] != sumCodes(codes) {
				t.Fatalf("answers under load: %v (0 = no answer), %v limiter timeouts", codes, timeouts)
			}
		})
	}
}

func sumCodes(m map[int]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// logLines returns the JSON log lines whose message starts with msg.
func logLines(p *proc, msg string) []map[string]any {
	var out []map[string]any
	for _, line := range strings.Split(p.out.String(), "\n") {
		var e map[string]any
		if json.Unmarshal([]byte(line), &e) == nil && e["msg"] != nil && strings.HasPrefix(e["msg"].(string), msg) {
			out = append(out, e)
		}
	}
	return out
}

// A key of the wrong type planted under one tenant's counter, beside healthy tenants, with the
// default breaker settings: in bursts of ten, the tenant's requests are answered by
// redis.on_error (503 with deny, admitted with allow), every other tenant is served
// throughout (a call outliving redis.timeout, exactTimeout here, on a machine loaded past it
// aside, counted as kind="timeout"), the breaker never opens (nor does /readyz turn 503), the errors
// are counted as kind="data", and the key is logged once (at most once a minute).
func TestPlantedKeyBesideHealthyTenants(t *testing.T) {
	t.Parallel()
	up := platform(t)
	for _, s := range quotaStores(false, true) {
		t.Run(s.name, func(t *testing.T) {
			redisCfg := s.start(t)
			client := redis.NewUniversalClient(&redis.UniversalOptions{Addrs: storeAddrs(t, redisCfg)})
			defer client.Close()
			const key = "gw:agent_job_per_project:{bad}"
			if err := client.RPush(context.Background(), key, "not a counter").Err(); err != nil {
				t.Fatal(err)
			}
			cfg := redisCfg + "limits:\n  agent_job_per_project: {limit: 1000000}\n"
			p := startGateway(t, up, cfg)
			allow := startGateway(t, up, strings.Replace(cfg, "redis: {", "redis: {on_error: allow, ", 1))

			stop := make(chan struct{})
			healthy, wg := hammer(p, stop, "svc_good", `{"prompt":"x"}`, "/v2/agent/good0/job", "/v2/agent/good1/job")
			var watch sync.WaitGroup
			var breakerSeen, notReady int
			watch.Add(1)
			go func() { // the breaker and readiness, all along
				defer watch.Done()
				for {
					select {
					case <-stop:
						return
					default:
					}
					if open, _ := openBreakers(scrape(t, p)); len(open) != 0 {
						breakerSeen++
					}
					if code, _ := adminGet(t, p, "/readyz", ""); code != 200 {
						notReady++
					}
					time.Sleep(100 * time.Millisecond)
				}
			}()
			bad := 0
			for burst := range 5 {
				// Ten at once, as many as would open the breaker were they node failures.
				var burstWG sync.WaitGroup
				answers := make([]string, 10)
				for i := range answers {
					burstWG.Add(1)
					go func() {
						defer burstWG.Done()
						res, body := sendBody(t, p, "/v2/agent/bad/job", "svc_bad", `{"prompt":"x"}`)
						answers[i] = fmt.Sprint(res.StatusCode, " ", body)
					}()
				}
				burstWG.Wait()
				for i, a := range answers {
					if !strings.HasPrefix(a, "503 ") || !strings.Contains(a, `"code":"limiter_unavailable"`) {
						t.Fatalf("burst %d, request %d of the planted tenant: %s", burst, i, a)
					}
					bad++
				}
				// Right after the burst, another tenant is served.
				if res := send(t, p, "POST", "/v2/agent/after/job", "svc_good", `{"prompt":"x"}`); res.StatusCode != 201 {
					t.Fatalf("after burst %d another tenant got %d", burst, res.StatusCode)
				}
				if res := send(t, allow, "POST", "/v2/agent/bad/job", "svc_bad", `{"prompt":"x"}`); res.StatusCode != 201 {
					t.Fatalf("on_error allow: the planted tenant got %d, want it let through", res.StatusCode)
				}
				time.Sleep(100 * time.Millisecond)
			}
			close(stop)
			wg.Wait()
			watch.Wait()
			if breakerSeen != 0 || notReady != 0 {
				t.Fatalf("breaker open in %d scrapes, /readyz not 200 %d times", breakerSeen, notReady)
			}
			// Every healthy request is served, but for a call that outlived redis.timeout
			// (exactTimeout) on a machine loaded past it: those are kind="timeout", and every
			// refusal is accounted for by the planted key's data errors or by such timeouts.
			codes := healthy.get()
			errs := limiterErrors(scrape(t, p))
			data, timeouts := errs[`{kind="data"}`], errs[`{kind="timeout"}`]
			if codes[201] == 0 || codes[201]+codes[503] != sumCodes(codes) || data+timeouts != float64(bad+codes[503]) || data < float64(bad)/2 {
				t.Fatalf("healthy tenants beside the planted key: %v; planted tenant: %d refused; limiter errors %v", codes, bad, errs)
			}
			if errs[`{kind="node"}`] != 0 || errs[`{kind="breaker_open"}`] != 0 {
				t.Fatalf("limiter errors %v: the node failed or the breaker refused", errs)
			}
			if timeouts > 0 {
				t.Logf("%v calls outlived redis.timeout on this machine (%d healthy requests refused for it)", timeouts, codes[503])
			}
			lines := logLines(p, "limiter data error")
			if len(lines) != 1 || lines[0]["redis_key"] != key || !strings.Contains(fmt.Sprint(lines[0]["error"]), "WRONGTYPE") {
				t.Fatalf("data error log lines: %v, want one naming %s", lines, key)
			}
			// Deleting the key is the fix.
			if err := client.Del(context.Background(), key).Err(); err != nil {
				t.Fatal(err)
			}
			if res := send(t, p, "POST", "/v2/agent/bad/job", "svc_bad", `{"prompt":"x"}`); res.StatusCode != 201 {
				t.Fatalf("after deleting the key: %d", res.StatusCode)
			}
		})
	}
}

// sendBody is send returning the body too.
func sendBody(t *testing.T, p *proc, path, key, body string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://"+p.public+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	return res, string(data)
}

// limiterErrors picks gateway_ratelimit_decision_errors_total's series out of a scrape.
func limiterErrors(m map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range m {
		if strings.HasPrefix(k, "gateway_ratelimit_decision_errors_total") {
			out[strings.TrimPrefix(k, "gateway_ratelimit_decision_errors_total")] = v
		}
	}
	return out
}
