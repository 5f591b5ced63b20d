package main

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"regexp"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/docsgate/gateway/internal/redistest"
)

// The largest limits the config accepts are counted exactly by both stores, which report the
// same; one more is refused at load (-check-config included) naming its key, plans too.
func TestLargestLimitOnBothStores(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ cfg, want string }{
		{"limits: {agent_job_per_project: {limit: 1000000000000000000}}", "limits.agent_job_per_project.limit: 1000000000000000000 is above 9007199254740991"},
		{"limits: {agent_job_per_project: {limit: 9007199254740992}}", "limits.agent_job_per_project.limit: 9007199254740992 is above 9007199254740991"},
		{"plans: {gold: {assistant_per_org: {limit: 9007199254740993}}}", "plans.gold.assistant_per_org.limit: 9007199254740993 is above 9007199254740991"},
		{"limits: {agent_job_per_project: {limit: 10000001, window: 10s, algorithm: gcra}}", "limits.agent_job_per_project.limit: 10000001 is above 10000000, the largest GCRA limit for window 10s"},
		// A plan making an accepted limit GCRA over a short window: the plan's entry is named.
		{"limits: {assistant_per_org: {limit: 2000000}}\nplans: {gold: {assistant_per_org: {algorithm: gcra, window: 1s}}}",
			"plans.gold.assistant_per_org: 2000000 is above 1000000, the largest GCRA limit for window 1s"},
	} {
		cfg := writeConfig(t, "upstream: {url: 'http://127.0.0.1:1'}\n"+c.cfg+"\n")
		out, err := exec.Command(gatewayBin, "-check-config", "-config", cfg).CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), c.want) {
			t.Errorf("-check-config %s: %v %s, want exit 2 naming %q", c.cfg, err, out, c.want)
		}
	}

	const cfg = `limits:
  agent_job_per_project: {limit: 9007199254740991, window: hour}
  big_gcra: {limit: 10000000, window: 10s, by: project, algorithm: gcra}
routes:
  - name: agent_job
    limits: [agent_job_per_project, big_gcra]
`
	up := platform(t)
	srv := redistest.Start(t)
	var seen []string
	// redis.timeout 2s: exact counts are checked, not the timeout (exactTimeout).
	for _, redisCfg := range []string{"", fmt.Sprintf("redis: {addrs: [%q], timeout: 2s}\n", srv.Addr)} {
		p := startGateway(t, up, redisCfg+cfg)
		var last string
		for i := int64(1); i <= 3; i++ {
			res := send(t, p, "POST", "/v2/agent/big/job", "svc_big", `{"prompt":"x"}`)
			if res.StatusCode != 201 {
				t.Fatalf("request %d: %d", i, res.StatusCode)
			}
			want := fmt.Sprintf(`"agent_job_per_project";r=%d;`, int64(9007199254740991)-i)
			if rl := res.Header.Get("RateLimit"); !strings.Contains(rl, want) || !strings.Contains(rl, `"big_gcra";r=9999999;`) {
				t.Fatalf("request %d: RateLimit %q, want %s and big_gcra r=9999999", i, rl, want)
			}
			last = res.Header.Get("RateLimit-Policy") + " | " + res.Header.Get("RateLimit-Limit") + " " + res.Header.Get("RateLimit-Remaining") +
				" | " + regexp.MustCompile(`;t=\d+`).ReplaceAllString(res.Header.Get("RateLimit"), "")
		}
		code, body := adminGet(t, p, "/usage/projects/big", "")
		var u struct {
			Limits []struct {
				Name            string
				Used, Remaining int64
			}
		}
		if code != 200 || json.Unmarshal([]byte(body), &u) != nil {
			t.Fatalf("usage: %d %s", code, body)
		}
		for _, l := range u.Limits {
			if l.Name == "agent_job_per_project" && (l.Used != 3 || l.Remaining != 9007199254740988) {
				t.Fatalf("usage %s", body)
			}
		}
		limiterHealthy(t, p)
		seen = append(seen, last)
	}
	if seen[0] != seen[1] {
		t.Fatalf("the stores disagree:\nmemory %s\nredis  %s", seen[0], seen[1])
	}
}

// An enforced limit and two shadow limits, spent one after another: every request is
// admitted and charged, in its one script call, to every limit that still has room, so the
// second shadow limit keeps counting once the first is spent: in the RateLimit header, the
// usage API and /usage/top, in process, on Redis and on a Cluster.
func TestShadowLimitsSpentOneAfterAnother(t *testing.T) {
	t.Parallel()
	up := platform(t)
	const cfg = `limits:
  agent_job_per_project: {limit: 100, window: hour}
  sh1: {limit: 2, window: hour, by: project, mode: shadow}
  sh2: {limit: 4, window: hour, by: project, mode: shadow, algorithm: gcra}
routes:
  - name: agent_job
    limits: [agent_job_per_project, sh1, sh2]
`
	for _, s := range quotaStores(true, true) {
		t.Run(s.name, func(t *testing.T) {
			redisCfg := s.start(t)
			p := startGateway(t, up, redisCfg+cfg)
			var script *redisCounter
			if s.name == "redis" {
				script = newRedisCounter(t, redisCfg)
			}
			for i := int64(1); i <= 6; i++ {
				before := script.calls(t)
				res := send(t, p, "POST", "/v2/agent/sh/job", "svc_sh", `{"prompt":"x"}`)
				if res.StatusCode != 201 {
					t.Fatalf("request %d: %d", i, res.StatusCode)
				}
				rl := res.Header.Get("RateLimit")
				for _, want := range []string{
					fmt.Sprintf(`"agent_job_per_project";r=%d;`, 100-i),
					fmt.Sprintf(`"sh1";r=%d;`, max(2-i, 0)),
					fmt.Sprintf(`"sh2";r=%d;`, max(4-i, 0)),
				} {
					if !strings.Contains(rl, want) {
						t.Fatalf("request %d: RateLimit %q lacks %s", i, rl, want)
					}
				}
				if res.Header.Get("RateLimit-Remaining") != fmt.Sprint(100-i) {
					t.Fatalf("request %d: RateLimit-Remaining %q follows a shadow limit", i, res.Header.Get("RateLimit-Remaining"))
				}
				if n := script.calls(t) - before; script != nil && n != 1 {
					t.Fatalf("request %d: %d script calls, want 1", i, n)
				}
			}
			code, body := adminGet(t, p, "/usage/projects/sh", "")
			for _, want := range []string{`"name":"agent_job_per_project","unit":"requests","limit":100,"used":6,`,
				`"name":"sh1","unit":"requests","limit":2,"used":2,`, `"name":"sh2","unit":"requests","limit":4,"used":4,`} {
				if code != 200 || !strings.Contains(body, want) {
					t.Fatalf("usage %d %s, want %s", code, body, want)
				}
			}
			if code, body := adminGet(t, p, "/usage/top?limit=sh2", ""); code != 200 || !strings.Contains(body, `"id":"sh","used":4,`) {
				t.Fatalf("/usage/top?limit=sh2: %d %s", code, body)
			}
			m := scrape(t, p)
			for lim, want := range map[string]float64{"sh1": 4, "sh2": 2} {
				k := fmt.Sprintf(`gateway_ratelimit_decisions_total{decision="shadow_denied",limit=%q,route="agent_job"}`, lim)
				if m[k] != want {
					t.Fatalf("%s = %v, want %v", k, m[k], want)
				}
			}
			limiterHealthy(t, p)
		})
	}
}

// redisCounter counts the script calls of a standalone Redis (nil: not counted).
type redisCounter struct{ client *redis.Client }

func newRedisCounter(t *testing.T, redisCfg string) *redisCounter {
	c := redis.NewClient(&redis.Options{Addr: storeAddrs(t, redisCfg)[0]})
	t.Cleanup(func() { c.Close() })
	return &redisCounter{c}
}

func (r *redisCounter) calls(t *testing.T) int {
	if r == nil {
		return 0
	}
	return redistest.ScriptCalls(t, r.client)
}
