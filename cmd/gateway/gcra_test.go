package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/docsgate/gateway/internal/redistest"
)

// GCRA, 5 per 10 s, through the binary on Redis: five at once, the sixth is told to come back
// in 2 s (the next unit), not in 10 s (a full bucket), and is admitted when it does.
func TestGCRARetryAfterBinary(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	// redis.timeout 2s: exact counts are checked, not the timeout (exactTimeout).
	p := startGateway(t, tokenUpstream(t), fmt.Sprintf(`redis: {addrs: [%q], timeout: 2s}
limits:
  agent_job_per_project: {limit: 5, window: 10s, algorithm: gcra}
`, srv.Addr))
	for i := range 5 {
		if res := send(t, p, "POST", "/v2/agent/gcra/job", "svc_g", `{"prompt":"x"}`); res.StatusCode != 201 {
			t.Fatalf("burst %d: %d", i, res.StatusCode)
		}
	}
	res := send(t, p, "POST", "/v2/agent/gcra/job", "svc_g", `{"prompt":"x"}`)
	if res.StatusCode != 429 || res.Header.Get("Retry-After") != "2" ||
		!strings.Contains(res.Header.Get("RateLimit"), `"agent_job_per_project";r=0;t=2`) || res.Header.Get("RateLimit-Reset") != "10" {
		t.Fatalf("sixth: %d Retry-After %q RateLimit %q RateLimit-Reset %q", res.StatusCode,
			res.Header.Get("Retry-After"), res.Header.Get("RateLimit"), res.Header.Get("RateLimit-Reset"))
	}
	time.Sleep(2 * time.Second)
	if res := send(t, p, "POST", "/v2/agent/gcra/job", "svc_g", `{"prompt":"x"}`); res.StatusCode != 201 {
		t.Fatalf("after Retry-After: %d", res.StatusCode)
	}
}
