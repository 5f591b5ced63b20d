package proxy

import (
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"

	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/internal/redistest"
)

var rateLimitT = regexp.MustCompile(`"agent_job_per_project";r=(\d+);t=(\d+)`)

// A denying GCRA limit tells the client when the next request is admitted (Retry-After, the
// body's retry_after and the limit's t in RateLimit), not when the bucket is full again
// (RateLimit-Reset), and both agree with redis_rate, on Redis and in process.
func TestGCRARetryAfterMatchesRedisRate(t *testing.T) {
	ref := redistest.Start(t)
	stores(t, func(t *testing.T, withStore gatewayOpt, _ *redistest.Server) {
		g := newGateway(t, newUpstream(t, nil), withStore, func(c *cfgT) {
			c.Limits = map[string]config.Limit{"agent_job_per_project": {Limit: limitPtr(5), Window: "10s", Algorithm: "gcra"}}
		})
		lim := redis_rate.NewLimiter(ref.Client(t))
		refKey := fmt.Sprintf("ref:%d", time.Now().UnixNano())
		refLimit := redis_rate.Limit{Rate: 5, Burst: 5, Period: 10 * time.Second}
		project := fmt.Sprintf("g%d", time.Now().UnixNano())
		// ceilMatch: our whole seconds are redis_rate's duration rounded up; within 50 ms of a
		// whole second the two calls (a few ms apart) may round either way.
		ceilMatch := func(got int64, want time.Duration) bool {
			w := want.Seconds()
			if math.Abs(w-math.Round(w)) < 0.05 {
				return got == int64(math.Round(w)) || got == int64(math.Round(w))+1
			}
			return got == int64(math.Ceil(w))
		}
		step := func(label string) (admitted bool, retry int64) {
			t.Helper()
			res, body := g.do(t, "POST", "/v2/agent/"+project+"/job", jsonHdr(adminKey), agentBody)
			want, err := lim.Allow(t.Context(), refKey, refLimit)
			if err != nil {
				t.Fatal(err)
			}
			if (res.StatusCode == 201) != (want.Allowed == 1) {
				t.Fatalf("%s: status %d, redis_rate allowed=%d", label, res.StatusCode, want.Allowed)
			}
			m := rateLimitT.FindStringSubmatch(res.Header.Get("RateLimit"))
			if m == nil {
				t.Fatalf("%s: RateLimit %q", label, res.Header.Get("RateLimit"))
			}
			tval, _ := strconv.ParseInt(m[2], 10, 64)
			legacyReset, _ := strconv.ParseInt(res.Header.Get("RateLimit-Reset"), 10, 64)
			if !ceilMatch(legacyReset, want.ResetAfter) {
				t.Fatalf("%s: RateLimit-Reset %d, redis_rate ResetAfter %v", label, legacyReset, want.ResetAfter)
			}
			if res.StatusCode == 201 {
				return true, 0
			}
			retry, _ = strconv.ParseInt(res.Header.Get("Retry-After"), 10, 64)
			var e struct {
				RetryAfter int64 `json:"retry_after"`
			}
			if err := json.Unmarshal(body, &e); err != nil {
				t.Fatal(err)
			}
			if retry != e.RetryAfter || retry != tval {
				t.Fatalf("%s: Retry-After %d, retry_after %d and t=%d must agree", label, retry, e.RetryAfter, tval)
			}
			if !ceilMatch(retry, want.RetryAfter) {
				t.Fatalf("%s: Retry-After %d, redis_rate RetryAfter %v", label, retry, want.RetryAfter)
			}
			return false, retry
		}
		for i := range 5 {
			if ok, _ := step(fmt.Sprintf("burst %d", i)); !ok {
				t.Fatalf("burst %d denied", i)
			}
		}
		// 5 per 10 s: the next unit comes back after 2 s, the bucket is full after 10 s.
		ok, retry := step("sixth")
		if ok || retry != 2 {
			t.Fatalf("sixth: admitted=%v Retry-After %d, want denied with 2", ok, retry)
		}
		time.Sleep(time.Duration(retry) * time.Second)
		if ok, _ := step("after Retry-After"); !ok {
			t.Fatal("denied after waiting Retry-After")
		}
		if ok, _ := step("then"); ok {
			t.Fatal("a second request admitted after one unit came back")
		}
		time.Sleep(700 * time.Millisecond)
		step("after 700ms")
	})
}
