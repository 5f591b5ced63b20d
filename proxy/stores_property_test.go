package proxy

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/internal/redistest"
)

// TestStoresAgreeProperty drives a gateway on the in-process store and one on Redis with the
// same random sequences of requests, reloads (limits, windows, algorithms fixed and gcra, modes
// enforce and shadow) and plan changes, and compares every answer and header: status, error
// code and limit, RateLimit-Policy, every limit's remaining in RateLimit, RateLimit-Limit and
// RateLimit-Remaining exactly; the times (each limit's t, RateLimit-Reset, Retry-After,
// retry_after) to the second, as the two stores read two clocks a moment apart.
// PROPERTY_SEED replays a sequence.
func TestStoresAgreeProperty(t *testing.T) {
	srv := redistest.Start(t)
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("PROPERTY_SEED"); s != "" {
		seed, _ = strconv.ParseUint(s, 10, 64)
	}
	for run := range 4 {
		seed := seed + uint64(run)
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			propertyRun(t, srv, seed, 300)
		})
	}
}

// propertyConfig is one random configuration: the four built-in limits (fixed or gcra, hour or
// day, enforce or shadow, small limits) and a plan whose override of assistant_per_org changes
// them again, for the orgs on it.
type propertyConfig struct {
	limits   map[string]config.Limit
	gold     config.Limit
	acmeGold bool
}

func randomLimit(r *rand.Rand) config.Limit {
	// Limits that divide an hour and a day, so a GCRA bucket's emission interval is a whole
	// number of seconds: the two stores then compute the same doubles, whatever their clocks.
	n := int64(1 + r.IntN(6))
	l := config.Limit{Limit: &n, Window: []string{"hour", "day"}[r.IntN(2)], Algorithm: []string{"fixed", "gcra"}[r.IntN(2)]}
	if r.IntN(4) == 0 {
		l.Mode = "shadow"
	}
	return l
}

func randomConfig(r *rand.Rand) propertyConfig {
	pc := propertyConfig{limits: map[string]config.Limit{}, gold: randomLimit(r), acmeGold: r.IntN(2) == 0}
	for _, name := range []string{"agent_job_per_project", "assistant_per_key", "assistant_per_org", "assistant_per_ip"} {
		pc.limits[name] = randomLimit(r)
	}
	return pc
}

func (pc propertyConfig) apply(c *config.Config) {
	c.Limits = pc.limits
	c.Plans = map[string]map[string]config.Limit{"gold": {"assistant_per_org": pc.gold}}
	plan := ""
	if pc.acmeGold {
		plan = "gold"
	}
	c.Orgs = map[string]config.Org{"acme": {Domains: []string{"acme-docs"}, Plan: plan}, "beta": {Domains: []string{"beta-docs"}}}
}

func propertyRun(t *testing.T, srv *redistest.Server, seed uint64, steps int) {
	// Fixed windows of an hour: the sequence must not straddle the end of one.
	_, end := hourBounds(time.Now())
	if left := time.Until(end); left < 45*time.Second {
		time.Sleep(left + time.Second)
	}
	r := rand.New(rand.NewPCG(seed, 0x5eed))
	up := newUpstream(t, nil)
	pc := randomConfig(r)
	prefix := fmt.Sprintf("prop%d", seed%1_000_000_007)
	mem := newGateway(t, up, func(c *cfgT) { pc.apply(c) })
	// This run proves the stores agree, not Redis' latency: a roomy redis.timeout keeps a slow
	// call on a busy machine under -race from reading as a disagreement (503 against 429).
	redisOf := func(c *cfgT) {
		c.Redis.Addrs, c.Redis.KeyPrefix, c.Redis.Timeout = []string{srv.Addr}, prefix, 2*time.Second
	}
	red := newGateway(t, up, func(c *cfgT) { pc.apply(c); redisOf(c) })
	reload := func() {
		for _, g := range []*gateway{mem, red} {
			cfg := config.Defaults()
			cfg.Upstream.URL = up.URL
			pc.apply(&cfg)
			if g == red {
				redisOf(&cfg)
			}
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			if err := g.gw.Reload(&cfg); err != nil {
				t.Fatal(err)
			}
		}
	}
	var log []string
	statuses := map[int]int{}
	for step := range steps {
		switch x := r.IntN(100); {
		case x < 6:
			pc = randomConfig(r)
			reload()
			log = append(log, fmt.Sprintf("reload %+v gold %+v acme on gold %v", pc.limits, pc.gold, pc.acmeGold))
			continue
		case x < 10:
			pc.acmeGold = !pc.acmeGold
			reload()
			log = append(log, fmt.Sprint("acme on gold: ", pc.acmeGold))
			continue
		}
		var method, path, body, key string
		if r.IntN(3) == 0 {
			method, path, body, key = "POST", fmt.Sprintf("/v2/agent/p%d/job", r.IntN(3)), agentBody, adminKey
		} else {
			org := []string{"acme-docs", "beta-docs", "gamma"}[r.IntN(3)]
			method, path, body, key = "POST", "/discovery/v1/assistant/"+org+"/message", assistantBody, fmt.Sprintf("svc_dsc_prop%d", r.IntN(2))
		}
		log = append(log, path+" "+key[len(key)-1:])
		// Alternate which store goes first, so neither always reads the later clock.
		first, second := mem, red
		if step%2 == 1 {
			first, second = red, mem
		}
		a, aBody := first.do(t, method, path, jsonHdr(key), body)
		b, bBody := second.do(t, method, path, jsonHdr(key), body)
		if first == red {
			a, aBody, b, bBody = b, bBody, a, aBody
		}
		statuses[a.StatusCode]++
		if diff := answerDiff(a, aBody, b, bBody); diff != "" {
			tail := log[max(0, len(log)-12):]
			t.Fatalf("step %d (seed %d): the stores disagree: %s\nlast steps:\n  %s", step, seed, diff, strings.Join(tail, "\n  "))
		}
	}
	t.Logf("answers by status: %v", statuses)
	for _, g := range []*gateway{mem, red} {
		if n := g.counter(t, "gateway_ratelimit_decisions_total", "decision", "error"); n != 0 {
			t.Fatalf("limiter errors during the sequence: %v", n)
		}
	}
}

func hourBounds(now time.Time) (time.Time, time.Time) {
	start := now.UTC().Truncate(time.Hour)
	return start, start.Add(time.Hour)
}

var limitEntry = regexp.MustCompile(`"([a-z_]+)";r=(\d+);t=(\d+)`)

// answerDiff compares the answers of the in-process store (m) and Redis (r): "" when they agree.
func answerDiff(m *http.Response, mBody []byte, r *http.Response, rBody []byte) string {
	if m.StatusCode != r.StatusCode {
		return fmt.Sprintf("status %d (memory) vs %d (redis); bodies %s | %s", m.StatusCode, r.StatusCode, mBody, rBody)
	}
	for _, h := range []string{"RateLimit-Policy", "RateLimit-Limit", "RateLimit-Remaining"} {
		if m.Header.Get(h) != r.Header.Get(h) {
			return fmt.Sprintf("%s %q (memory) vs %q (redis)", h, m.Header.Get(h), r.Header.Get(h))
		}
	}
	for _, h := range []string{"RateLimit-Reset", "Retry-After"} {
		if !withinASecond(m.Header.Get(h), r.Header.Get(h)) {
			return fmt.Sprintf("%s %q (memory) vs %q (redis)", h, m.Header.Get(h), r.Header.Get(h))
		}
	}
	me, re := limitEntry.FindAllStringSubmatch(m.Header.Get("RateLimit"), -1), limitEntry.FindAllStringSubmatch(r.Header.Get("RateLimit"), -1)
	if len(me) != len(re) {
		return fmt.Sprintf("RateLimit %q (memory) vs %q (redis)", m.Header.Get("RateLimit"), r.Header.Get("RateLimit"))
	}
	for i := range me {
		if me[i][1] != re[i][1] || me[i][2] != re[i][2] || !withinASecond(me[i][3], re[i][3]) {
			return fmt.Sprintf("RateLimit %q (memory) vs %q (redis)", m.Header.Get("RateLimit"), r.Header.Get("RateLimit"))
		}
	}
	if m.StatusCode != 429 && m.StatusCode != 503 {
		return ""
	}
	var mb, rb struct {
		Code       string `json:"code"`
		Limit      string `json:"limit"`
		RetryAfter *int64 `json:"retry_after"`
	}
	if json.Unmarshal(mBody, &mb) != nil || json.Unmarshal(rBody, &rb) != nil || mb.Code != rb.Code || mb.Limit != rb.Limit ||
		(mb.RetryAfter == nil) != (rb.RetryAfter == nil) || (mb.RetryAfter != nil && !withinASecond(fmt.Sprint(*mb.RetryAfter), fmt.Sprint(*rb.RetryAfter))) {
		return fmt.Sprintf("bodies %s (memory) vs %s (redis)", mBody, rBody)
	}
	return ""
}

// withinASecond: two whole-second times, the same or one apart (rounded up from two clocks).
func withinASecond(a, b string) bool {
	if a == b {
		return true
	}
	x, err1 := strconv.ParseInt(a, 10, 64)
	y, err2 := strconv.ParseInt(b, 10, 64)
	return err1 == nil && err2 == nil && (x-y == 1 || y-x == 1)
}
