package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/docsgate/gateway/internal/redistest"
)

// doorsLimit is the one limit every door counts in TestOneCountThroughEveryDoor.
const doorsLimit = 30

// doorsConfig is a replica of TestOneCountThroughEveryDoor: job_status (a pass-through route,
// which forward auth serves) applies job_status_per_project, and Envoy's descriptor
// [{key: project}] counts the same limit; door is the replica's forward_auth or
// rate_limit_service section.
func doorsConfig(upURL, redisAddr, door string) string {
	return fmt.Sprintf(`upstream: {url: %q}
admin_token: %q
# Exact counts under -race on a busy machine: see docs/contributing.md.
redis: {addrs: [%q], timeout: 2s}
%s`, upURL, adminToken, redisAddr, door) + jobStatusRoute(doorsLimit)
}

// A tenant's count is one count whichever door its requests came through: two replicas on one
// Redis, real nginx (auth_request) asking replica A's forward-auth door, Envoy's gRPC client
// asking replica B's rate limit service, and both replicas' own proxies; 3×30 requests of one
// project at once over the four ways in admit exactly 30 of the limit of 30, every refusal is
// its door's (429 rate_limited through HTTP, OVER_LIMIT through gRPC), the upstream sees only
// what the HTTP doors admitted, and the admin API's usage says 30 used. A door counting on its
// own (another key, another store) admits more than 30 in total.
func TestOneCountThroughEveryDoor(t *testing.T) {
	t.Parallel()
	nginxBin := need(t, "nginx", "nginx")
	rdb := redistest.Start(t)
	upURL, upCount := recordingUpstream(t)
	addrs := freeAddrs(t, 3) // A's forward-auth door, B's rate limit service, nginx
	gwA := startGatewayRaw(t, doorsConfig(upURL, rdb.Addr, fmt.Sprintf("forward_auth: {listen: %q}\n", addrs[0])))
	gwB := startGatewayRaw(t, doorsConfig(upURL, rdb.Addr, fmt.Sprintf(`rate_limit_service:
  listen: %q
  domains:
    - domain: docsgate
      descriptors:
        - entries: [{key: project}]
          limits: [job_status_per_project]
`, addrs[1])))
	rls, _ := rlsClient(t, addrs[1])
	dir := t.TempDir()
	for _, f := range []struct{ name, body string }{
		{"gateway-auth-answer.conf", nginxAuthAnswer},
		{"nginx.conf", nginxConfig(dir, addrs[2], addrs[0], upURL)},
	} {
		if err := os.WriteFile(filepath.Join(dir, f.name), []byte(f.body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	startDaemon(t, "nginx", addrs[2], exec.Command(nginxBin, "-p", dir, "-c", filepath.Join(dir, "nginx.conf"), "-g", "daemon off;"))

	const project, path = "doors", "/v2/agent/doors/job/j1"
	web := []struct{ name, base string }{
		{"nginx (A)", "http://" + addrs[2]}, {"proxy A", "http://" + gwA.public}, {"proxy B", "http://" + gwB.public},
	}
	doors := len(web) + 1 // the last is the rate limit service
	sem := make(chan struct{}, 12)
	outcomes := concurrently(3*doorsLimit, func(i int) string {
		sem <- struct{}{}
		defer func() { <-sem }()
		d := i % doors
		if d == len(web) {
			resp, err := projectCall(t, rls, project)
			if err != nil {
				return "rls: " + err.Error()
			}
			return "rls " + resp.GetOverallCode().String()
		}
		a := fwdGet(t, web[d].base, path, "svc_one_count_every_door")
		if a.status == 201 { // the upstream's answer: admitted
			return "http admitted"
		}
		var b apierrorBody
		if err := json.Unmarshal([]byte(a.body), &b); err != nil {
			return fmt.Sprintf("http %d unreadable body %q", a.status, a.body)
		}
		return fmt.Sprintf("http %d %s", a.status, b.Code)
	})

	admitted := outcomes["http admitted"] + outcomes["rls "+rlsv3.RateLimitResponse_OK.String()]
	refused := outcomes["http 429 rate_limited"] + outcomes["rls "+rlsv3.RateLimitResponse_OVER_LIMIT.String()]
	if admitted != doorsLimit || admitted+refused != 3*doorsLimit {
		t.Fatalf("%d requests over four doors: %v; want exactly %d admitted in total, every other one refused 429 rate_limited or OVER_LIMIT",
			3*doorsLimit, outcomes, doorsLimit)
	}
	if got := upCount(); got != outcomes["http admitted"] {
		t.Fatalf("upstream saw %d requests; want the %d the HTTP doors admitted", got, outcomes["http admitted"])
	}
	for _, p := range []*proc{gwA, gwB} {
		if u := orgUsageOf(t, p, "/usage/projects/"+project, "job_status_per_project"); u.Used != doorsLimit || u.Limit != doorsLimit || u.Remaining != 0 {
			t.Fatalf("admin usage of %s: %+v; want %d used of %d", project, u, doorsLimit, doorsLimit)
		}
	}
}
