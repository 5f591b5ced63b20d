package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/docsgate/gateway/internal/redistest"
)

// rlsConfig is the rate limit service's section for the tests against the binary: Envoy's
// descriptor [{key: project}] counted by agent_job_per_project, as the docs' Envoy example
// sends it, and [{key: remote_address}] by assistant_per_ip.
func rlsConfig(listen string) string {
	return fmt.Sprintf(`rate_limit_service:
  listen: %q
  domains:
    - domain: docsgate
      descriptors:
        - entries: [{key: project}]
          limits: [agent_job_per_project]
        - entries: [{key: remote_address}]
          limits: [assistant_per_ip]
`, listen)
}

// rlsClient dials a gateway's rate limit service with the generated client.
func rlsClient(t *testing.T, addr string) (rlsv3.RateLimitServiceClient, *grpc.ClientConn) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return rlsv3.NewRateLimitServiceClient(conn), conn
}

// projectCall asks about one request of project.
func projectCall(t *testing.T, c rlsv3.RateLimitServiceClient, project string) (*rlsv3.RateLimitResponse, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return c.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "docsgate", Descriptors: []*commonv3.RateLimitDescriptor{
		{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "project", Value: project}}},
	}})
}

// Two gateway binaries sharing one Redis: 40 concurrent ShouldRateLimit calls against
// agent_job_per_project of 20 admit exactly 20, MONITOR sees one script call per call and no
// other command, and a project's count is one whichever door its requests come through (the
// proxy and the rate limit service, on both replicas, exactly 20 between them).
func TestRateLimitServiceReplicasExact(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	upURL, upCount := recordingUpstream(t)
	addrs := freeAddrs(t, 2)
	var gws []*proc
	var clients []rlsv3.RateLimitServiceClient
	for _, a := range addrs {
		// redis.timeout 2s: exact counts are checked, not the timeout (exactTimeout).
		p := startGateway(t, upURL, fmt.Sprintf("redis: {addrs: [%q], timeout: 2s}\nlimits:\n  agent_job_per_project: {limit: 20}\n", srv.Addr)+rlsConfig(a))
		gws = append(gws, p)
		c, _ := rlsClient(t, a)
		clients = append(clients, c)
	}
	// Warm up: each replica loads the script (EVALSHA, NOSCRIPT, EVAL) and dials the
	// connections a burst of 40 needs.
	rlsBurst(t, clients, 40, "warmup")
	lines, stop := watchMonitor(t, srv.Addr)
	codes := rlsBurst(t, clients, 40, "shared")
	stop()
	scripts, other := splitMonitor(lines)
	if codes[rlsv3.RateLimitResponse_OK] != 20 || codes[rlsv3.RateLimitResponse_OVER_LIMIT] != 20 {
		t.Fatalf("40 calls over two replicas: %v, want 20 OK and 20 OVER_LIMIT", codes)
	}
	if len(scripts) != 40 || len(other) != 0 {
		t.Fatalf("MONITOR: %d script calls and other commands %q for 40 calls, want 40 and none", len(scripts), other)
	}

	// One count through both doors: 20 proxy requests and 20 calls at once, over both replicas.
	var wg sync.WaitGroup
	var httpCodes map[int]int
	wg.Add(1)
	go func() {
		defer wg.Done()
		httpCodes = burst(t, gws, 20, "/v2/agent/mixed/job", "svc_both_doors", `{"prompt":"x"}`, nil)
	}()
	codes = rlsBurst(t, clients, 20, "mixed")
	wg.Wait()
	if got := httpCodes[201] + codes[rlsv3.RateLimitResponse_OK]; got != 20 || httpCodes[201]+httpCodes[429] != 20 {
		t.Fatalf("proxy %v and rate limit service %v: %d admitted, want exactly 20", httpCodes, codes, got)
	}
	if got := upCount(); got != httpCodes[201] {
		t.Fatalf("upstream saw %d requests, want the %d the proxy admitted", got, httpCodes[201])
	}
}

// rlsBurst sends n concurrent calls for project spread over the clients and counts the codes.
func rlsBurst(t *testing.T, clients []rlsv3.RateLimitServiceClient, n int, project string) map[rlsv3.RateLimitResponse_Code]int {
	t.Helper()
	return concurrently(n, func(i int) rlsv3.RateLimitResponse_Code {
		resp, err := projectCall(t, clients[i%len(clients)], project)
		if err != nil {
			t.Errorf("call %d: %v", i, err)
			return rlsv3.RateLimitResponse_UNKNOWN
		}
		return resp.GetOverallCode()
	})
}

// The service of one gateway in process: the answer Envoy reads (statuses, the RateLimit
// headers the proxy sends, Retry-After when refused), the gRPC health service, its metrics,
// and a reload that maps a descriptor anew.
func TestRateLimitServiceInProcess(t *testing.T) {
	t.Parallel()
	upURL, _ := recordingUpstream(t)
	addr := freeAddrs(t, 1)[0]
	cfg := "limits:\n  agent_job_per_project: {limit: 2, window: 1m}\n" + rlsConfig(addr)
	p := startGateway(t, upURL, cfg)
	c, conn := rlsClient(t, addr)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", h, err)
	}
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		resp, err := projectCall(t, c, "inproc")
		if err != nil || resp.GetOverallCode() != want {
			t.Fatalf("call %d: %v %v, want %v", i, resp, err, want)
		}
		st := resp.GetStatuses()[0]
		if st.GetCurrentLimit().GetName() != "agent_job_per_project" || st.GetCurrentLimit().GetRequestsPerUnit() != 2 ||
			st.GetCurrentLimit().GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE || st.GetLimitRemaining() != uint32(max(1-i, 0)) {
			t.Fatalf("call %d: status %v", i, st)
		}
		headers := map[string]string{}
		for _, hv := range resp.GetResponseHeadersToAdd() {
			headers[hv.GetKey()] = hv.GetValue()
		}
		if headers["RateLimit-Limit"] != "2" || headers["RateLimit-Remaining"] != fmt.Sprint(max(1-i, 0)) ||
			!strings.HasPrefix(headers["RateLimit"], `"agent_job_per_project";r=`) || headers["RateLimit-Policy"] != `"agent_job_per_project";q=2;w=60` {
			t.Fatalf("call %d: headers %v", i, headers)
		}
		if _, ok := headers["Retry-After"]; ok != (want == rlsv3.RateLimitResponse_OVER_LIMIT) {
			t.Fatalf("call %d: Retry-After %q", i, headers["Retry-After"])
		}
	}
	res, err := http.Get("http://" + p.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	body := string(raw)
	for _, series := range []string{`gateway_rls_requests_total{code="ok",domain="docsgate"} 2`, `gateway_rls_requests_total{code="over_limit",domain="docsgate"} 1`} {
		if !strings.Contains(body, series) {
			t.Fatalf("metrics lack %s", series)
		}
	}
	// Shutdown: the service stops with the public listener and the process exits cleanly.
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 30*time.Second); code != 0 || !strings.Contains(p.out.String(), `"stopped"`) {
		t.Fatalf("exit %d after SIGTERM", code)
	}
	if _, err := projectCall(t, c, "inproc"); err == nil {
		t.Fatal("the rate limit service still answers after shutdown")
	}
}

// A config that names no limit, or one the service cannot count, is refused by -check-config
// naming the key and the closest limit.
func TestRateLimitServiceConfigErrors(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ body, want string }{
		{"rate_limit_service:\n  listen: 127.0.0.1:1\n  domains: [{domain: d, descriptors: [{entries: [{key: project}], limits: [agent_jobs_per_project]}]}]\n",
			`rate_limit_service.domains[0].descriptors[0].limits[0]: "agent_jobs_per_project" is no limit (did you mean agent_job_per_project?)`},
		{"limits:\n  s: {limit: 3, by: org, unit: streams}\nrate_limit_service:\n  listen: 127.0.0.1:1\n  domains: [{domain: d, descriptors: [{entries: [{key: org}], limits: [s]}]}]\n",
			`rate_limit_service.domains[0].descriptors[0].limits[0]: "s" counts streams in flight`},
		{"rate_limit_service:\n  listen: \"\"\n  domains: [{domain: d, descriptors: [{entries: [{key: p}], limits: [agent_job_per_project]}, {entries: [{key: p}], limits: [agent_job_per_project]}]}]\n",
			`rate_limit_service.domains[0].descriptors[1].entries: the same entries are mapped twice`},
		{"rate_limit_service:\n  listen: \"\"\n  domains: [{domain: d, descriptors: [{entries: [{key: p}], limits: [agent_job_per_project]}]}]\n",
			`rate_limit_service.listen: is required`},
	} {
		path := writeConfig(t, "listen: 127.0.0.1:2\nadmin_listen: 127.0.0.1:3\nupstream: {url: \"http://127.0.0.1:4\"}\n"+c.body)
		code, _, _, stderr := checkConfigRun(t, path)
		if code == 0 || !strings.Contains(stderr, c.want) {
			t.Errorf("-check-config: exit %d, stderr %q; want it to say %q", code, stderr, c.want)
		}
	}
}
