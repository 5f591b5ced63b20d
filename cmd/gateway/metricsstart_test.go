package main

import (
	"fmt"
	"net/http"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/docsgate/gateway/internal/redistest"
	"github.com/docsgate/gateway/metrics"
)

// The series the alerts and the dashboard select exist at 0 in the first scrape after start,
// before any request: rate() and increase() then see the first event, and an alert on them
// evaluates from the start. gateway_build_info and the config reload series are there too,
// and the reload series follow a rejected and an applied reload.
func TestMetricsAtStart(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	// redis.timeout 2s: exact series values are checked, not the timeout (exactTimeout).
	const cfgBody = `admin_token: %q
redis: {addrs: [%q], timeout: 2s}
auth: {failure_limit: 20}
orgs:
  acme: [acme-docs]
limits:
  tokens_per_org: {limit: 1000000, window: month, by: org, unit: tokens, reserve: 10}
routes:
  - {name: assistant_message_v2, method: POST, path: "/discovery/v2/assistant/{domain}/message", key: assistant, stream: true,
     limits: [assistant_per_key, assistant_per_org, assistant_per_ip, tokens_per_org]}
  - {name: assistant_message, limits: [assistant_per_key, assistant_per_org, assistant_per_ip, tokens_per_org],
     deprecation: {since: "2025-06-01", sunset: "2026-12-31"}}
`
	before := time.Now()
	p := startGateway(t, platform(t), fmt.Sprintf(cfgBody, adminToken, srv.Addr))
	m := scrape(t, p)

	want := []string{
		// the alerts' and panels' label values
		`gateway_requests_total{code="429",route="agent_job"}`,
		`gateway_requests_total{code="503",route="assistant_message_v2"}`,
		`gateway_request_duration_seconds_bucket{route="agent_job",le="+Inf"}`,
		`gateway_stream_first_byte_seconds_bucket{route="assistant_message",le="+Inf"}`,
		`gateway_upstream_errors_total{kind="timeout",route="agent_job"}`,
		`gateway_upstream_errors_total{kind="canceled",route="assistant_message_v2"}`,
		`gateway_auth_rejections_total{reason="missing",route="agent_job"}`,
		`gateway_auth_rejections_total{reason="too_many_failures",route="assistant_message"}`,
		`gateway_ratelimit_decisions_total{decision="denied",limit="assistant_per_org",route="assistant_message_v2"}`,
		`gateway_ratelimit_near_limit_total{limit="agent_job_per_project",route="agent_job"}`,
		`gateway_ratelimit_refunds_total{limit="agent_job_per_project",reason="upstream_401"}`,
		`gateway_ratelimit_refunds_total{limit="tokens_per_org",reason="upstream_403"}`,
		`gateway_ratelimit_tokens_near_limit_total{limit="tokens_per_org",route="assistant_message"}`,
		`gateway_ratelimit_holds_expired_total{limit="tokens_per_org"}`,
		`gateway_ratelimit_decision_errors_total{kind="node"}`,
		`gateway_ratelimit_decision_errors_total{kind="data"}`,
		`gateway_ratelimit_decision_duration_seconds_bucket{le="+Inf"}`,
		`gateway_ratelimit_breaker_open{node="` + srv.Addr + `"}`,
		`gateway_org_requests_total{decision="allowed",org="acme"}`,
		`gateway_stream_finished_total{reason="stop",route="assistant_message_v2"}`,
		`gateway_stream_finished_total{reason="incomplete",route="assistant_message"}`,
		`gateway_stream_tokens_total{kind="completion",org="acme",route="assistant_message_v2"}`,
		`gateway_stream_tokens_total{kind="prompt",org="other",route="assistant_message"}`,
		`gateway_stream_tokens_estimated_total{kind="prompt",route="assistant_message"}`,
		`gateway_stream_stalled_total{route="assistant_message_v2"}`,
		`gateway_deprecated_requests_total{org="other",route="assistant_message"}`,
		// the deprecated names, for one release
		`gateway_limiter_errors_total{kind="node"}`,
		`gateway_breaker_open{node="` + srv.Addr + `"}`,
		`gateway_token_limit_near_total{limit="tokens_per_org",route="assistant_message"}`,
		`gateway_token_holds_expired_total{limit="tokens_per_org"}`,
		`gateway_streams_stalled_total{route="assistant_message_v2"}`,
		`gateway_limiter_duration_seconds_bucket{le="+Inf"}`,
	}
	for _, k := range want {
		if v, ok := m[k]; !ok || v != 0 {
			t.Errorf("%s = %v (present %t), want 0 before any request", k, v, ok)
		}
	}
	for _, r := range metrics.Renames() {
		if !hasSeries(m, r.Old) || !hasSeries(m, r.New) {
			t.Errorf("renamed %s -> %s: old present %t, new present %t", r.Old, r.New, hasSeries(m, r.Old), hasSeries(m, r.New))
		}
	}

	info := ""
	for k, v := range m {
		if strings.HasPrefix(k, "gateway_build_info{") {
			if info != "" || v != 1 {
				t.Errorf("gateway_build_info: %s = %v besides %s", k, v, info)
			}
			info = k
		}
	}
	for _, label := range []string{`version="v0.0.0-test"`, `goversion="` + runtime.Version() + `"`, `revision="`} {
		if !strings.Contains(info, label) {
			t.Errorf("gateway_build_info %q lacks %s", info, label)
		}
	}
	if strings.Contains(info, `revision=""`) {
		t.Errorf("gateway_build_info %q has an empty revision", info)
	}

	const ok, at = "gateway_config_last_reload_successful", "gateway_config_last_reload_success_timestamp_seconds"
	loaded := m[at]
	if m[ok] != 1 || loaded < float64(before.Unix())-1 || loaded > float64(time.Now().Unix())+1 {
		t.Fatalf("at start: %s = %v, %s = %v (started at %d)", ok, m[ok], at, loaded, before.Unix())
	}

	// A rejected reload: 0, and the config in force keeps its time.
	path := p.cmd.Args[2]
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, append(good, []byte("limits: {nope: {limit: -1}}\n")...), 0o600); err != nil {
		t.Fatal(err)
	}
	if code := postReload(t, p, adminToken); code != http.StatusUnprocessableEntity {
		t.Fatalf("reload of a bad file: %d", code)
	}
	if m := scrape(t, p); m[ok] != 0 || m[at] != loaded {
		t.Fatalf("after a rejected reload: %s = %v, %s = %v (want 0 and %v)", ok, m[ok], at, m[at], loaded)
	}
	// An applied one: 1 again, at its time.
	time.Sleep(10 * time.Millisecond)
	if err := os.WriteFile(path, good, 0o600); err != nil {
		t.Fatal(err)
	}
	if code := postReload(t, p, adminToken); code != http.StatusOK {
		t.Fatalf("reload of the good file: %d", code)
	}
	if m := scrape(t, p); m[ok] != 1 || m[at] <= loaded {
		t.Fatalf("after an applied reload: %s = %v, %s = %v (want 1 and later than %v)", ok, m[ok], at, m[at], loaded)
	}
}

func hasSeries(m map[string]float64, name string) bool {
	for k := range m {
		if k == name || strings.HasPrefix(k, name+"{") || strings.HasPrefix(k, name+"_bucket{") {
			return true
		}
	}
	return false
}

// postReload sends POST /reload with the admin token and returns the answer's status.
func postReload(t *testing.T, p *proc, token string) int {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://"+p.admin+"/reload", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res.StatusCode
}
