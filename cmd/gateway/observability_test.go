package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"
)

const adminToken = "admin-token-0123456789"

// platform is an upstream that answers jobs with 201 and streams assistant answers, ending
// with a d: part unless the domain is "cut".
func platform(t *testing.T) string {
	t.Helper()
	srvURL := serveHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if strings.HasPrefix(r.URL.Path, "/discovery/") {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			fmt.Fprint(w, "f:{\"messageId\":\"m\"}\n0:\"hi\"\n")
			if !strings.Contains(r.URL.Path, "/cut/") {
				fmt.Fprint(w, "e:{\"finishReason\":\"stop\"}\nd:{\"finishReason\":\"stop\"}\n")
			}
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(201)
		fmt.Fprint(w, `{"id":"j"}`)
	}))
	return srvURL
}

func send(t *testing.T, p *proc, method, path, key, body string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(method, "http://"+p.public+path, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res
}

func adminGet(t *testing.T, p *proc, path, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+p.admin+path, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(data)
}

// scrape returns every sample of the exposition as "name{labels}" -> value.
func scrape(t *testing.T, p *proc) map[string]float64 {
	t.Helper()
	code, body := adminGet(t, p, "/metrics", adminToken)
	if code != 200 {
		t.Fatalf("/metrics: %d", code)
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("bad sample %q", line)
		}
		out[line[:i]] = v
	}
	return out
}

// openBreakers returns the nodes whose gateway_ratelimit_breaker_open is not 0 in a scrape, and how many
// nodes have the series at all.
func openBreakers(m map[string]float64) (open []string, nodes int) {
	for k, v := range m {
		node, ok := strings.CutPrefix(k, `gateway_ratelimit_breaker_open{node="`)
		if !ok {
			continue
		}
		nodes++
		if v != 0 {
			open = append(open, strings.TrimSuffix(node, `"}`))
		}
	}
	sort.Strings(open)
	return open, nodes
}

// A known mix of requests, then the scrape compared number for number.
func TestMetricsNumberForNumber(t *testing.T) {
	t.Parallel()
	p := startGateway(t, platform(t), fmt.Sprintf(`admin_token: %q
orgs:
  acme: [acme-docs, acme-api]
limits:
  agent_job_per_project: {limit: 2}
  assistant_per_org: {limit: 3}
routes:
  - {name: assistant_message_v2, method: POST, path: "/discovery/v2/assistant/{domain}/message", key: assistant, stream: true,
     limits: [assistant_per_key, assistant_per_org, assistant_per_ip]}
`, adminToken))
	asst := `{"fp":"a","messages":[]}`
	asstV2 := `{"fp":"a","messages":[{"id":"1","role":"user","parts":[{"type":"text","text":"hi"}]}]}`
	for range 3 { // 2 admitted, 1 denied
		send(t, p, "POST", "/v2/agent/p1/job", "svc_m", `{"prompt":"x"}`)
	}
	send(t, p, "POST", "/v2/agent/p1/job", "", `{"prompt":"x"}`)                                                                     // 401 missing
	send(t, p, "POST", "/v2/agent/p1/job", "svc_dsc_m", `{"prompt":"x"}`)                                                            // 403
	send(t, p, "POST", "/v2/agent/p1/job", "svc_m", `{"prompt":""}`)                                                                 // 400 prompt
	send(t, p, "POST", "/discovery/v1/assistant/x/message", "svc_dsc_m", `{"fp":"a","messages":[{"id":"1","role":2,"content":""}]}`) // 400
	send(t, p, "POST", "/discovery/v1/assistant/acme-docs/message", "svc_dsc_m", asst)                                               // acme 1
	send(t, p, "POST", "/discovery/v2/assistant/acme-api/message", "svc_dsc_m", asstV2)                                              // acme 2 (shared quota)
	send(t, p, "POST", "/discovery/v1/assistant/acme-docs/message", "svc_dsc_m", asst)                                               // acme 3
	send(t, p, "POST", "/discovery/v1/assistant/acme-docs/message", "svc_dsc_m", asst)                                               // acme denied
	send(t, p, "POST", "/discovery/v1/assistant/cut/message", "svc_dsc_m", asst)                                                     // other, incomplete stream
	send(t, p, "GET", "/nope", "", "")                                                                                               // 404

	time.Sleep(100 * time.Millisecond) // access-log and metrics are recorded as handlers return
	m := scrape(t, p)
	want := map[string]float64{
		`gateway_requests_total{code="201",route="agent_job"}`:                                                         2,
		`gateway_requests_total{code="429",route="agent_job"}`:                                                         1,
		`gateway_requests_total{code="401",route="agent_job"}`:                                                         1,
		`gateway_requests_total{code="403",route="agent_job"}`:                                                         1,
		`gateway_requests_total{code="400",route="agent_job"}`:                                                         1,
		`gateway_requests_total{code="200",route="assistant_message"}`:                                                 3,
		`gateway_requests_total{code="429",route="assistant_message"}`:                                                 1,
		`gateway_requests_total{code="400",route="assistant_message"}`:                                                 1,
		`gateway_requests_total{code="200",route="assistant_message_v2"}`:                                              1,
		`gateway_requests_total{code="404",route="unmatched"}`:                                                         1,
		`gateway_auth_rejections_total{reason="missing",route="agent_job"}`:                                            1,
		`gateway_auth_rejections_total{reason="wrong_key_type",route="agent_job"}`:                                     1,
		`gateway_validation_rejections_total{field="prompt",route="agent_job"}`:                                        1,
		`gateway_validation_rejections_total{field="messages[].role",route="assistant_message"}`:                       1,
		`gateway_ratelimit_decisions_total{decision="allowed",limit="agent_job_per_project",route="agent_job"}`:        2,
		`gateway_ratelimit_decisions_total{decision="denied",limit="agent_job_per_project",route="agent_job"}`:         1,
		`gateway_ratelimit_decisions_total{decision="allowed",limit="assistant_per_org",route="assistant_message"}`:    3,
		`gateway_ratelimit_decisions_total{decision="denied",limit="assistant_per_org",route="assistant_message"}`:     1,
		`gateway_ratelimit_decisions_total{decision="allowed",limit="assistant_per_org",route="assistant_message_v2"}`: 1,
		`gateway_ratelimit_decisions_total{decision="allowed",limit="assistant_per_key",route="assistant_message"}`:    3,
		`gateway_ratelimit_near_limit_total{limit="agent_job_per_project",route="agent_job"}`:                          1, // 2nd of 2 left 0
		`gateway_ratelimit_near_limit_total{limit="assistant_per_org",route="assistant_message"}`:                      1, // 3rd of 3 left 0
		`gateway_org_requests_total{decision="allowed",org="acme"}`:                                                    3,
		`gateway_org_requests_total{decision="denied",org="acme"}`:                                                     1,
		`gateway_org_requests_total{decision="allowed",org="other"}`:                                                   1,
		`gateway_stream_finished_total{reason="stop",route="assistant_message"}`:                                       2,
		`gateway_stream_finished_total{reason="incomplete",route="assistant_message"}`:                                 1,
		`gateway_stream_finished_total{reason="stop",route="assistant_message_v2"}`:                                    1,
		`gateway_stream_duration_seconds_count{route="assistant_message"}`:                                             3,
		`gateway_stream_first_byte_seconds_count{route="assistant_message"}`:                                           3,
		`gateway_upstream_duration_seconds_count{route="agent_job"}`:                                                   2,
		`gateway_request_duration_seconds_count{route="agent_job"}`:                                                    6,
		`gateway_ratelimit_decision_duration_seconds_count`:                                                            8, // 3 agent + 5 assistant
		`gateway_ratelimit_decision_errors_total{kind="data"}`:                                                         0,
		`gateway_ratelimit_decision_errors_total{kind="node"}`:                                                         0,
		`gateway_ratelimit_decision_errors_total{kind="timeout"}`:                                                      0,
		`gateway_ratelimit_decision_errors_total{kind="breaker_open"}`:                                                 0,
		`gateway_ratelimit_decision_errors_total{kind="canceled"}`:                                                     0,
		`gateway_inflight_requests{route="agent_job"}`:                                                                 0,
	}
	for k, v := range want {
		if got, ok := m[k]; !ok || got != v {
			t.Errorf("%s = %v (present %t), want %v", k, got, ok, v)
		}
	}
	if _, nodes := openBreakers(m); nodes != 0 {
		t.Errorf("gateway_ratelimit_breaker_open has %d series with the in-process store, which has no Redis node", nodes)
	}
	for k := range m {
		for _, bad := range []string{"svc_", "p1", "127.0.0.1", "acme-docs"} {
			if strings.Contains(k, bad) {
				t.Errorf("a label holds %q: %s", bad, k)
			}
		}
	}
}

func TestUsageAPI(t *testing.T) {
	t.Parallel()
	p := startGateway(t, platform(t), fmt.Sprintf("admin_token: %q\norgs:\n  acme: [acme-docs]\nclient_ip:\n  trusted_proxies: [127.0.0.1]\n", adminToken))
	for range 3 {
		send(t, p, "POST", "/v2/agent/proj-7/job", "svc_u", `{"prompt":"x"}`)
	}
	for range 2 {
		req, _ := http.NewRequest("POST", "http://"+p.public+"/discovery/v1/assistant/acme-docs/message", strings.NewReader(`{"fp":"a","messages":[]}`))
		req.Header.Set("Authorization", "Bearer svc_dsc_usage")
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Forwarded-For", "2001:db8:5:6::1")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
	}
	type usage struct {
		Limits []struct {
			Name                   string
			Limit, Used, Remaining int64
			Reset                  time.Time
		}
	}
	get := func(path string) usage {
		code, body := adminGet(t, p, path, adminToken)
		if code != 200 {
			t.Fatalf("%s: %d %s", path, code, body)
		}
		var u usage
		if err := json.Unmarshal([]byte(body), &u); err != nil {
			t.Fatal(err)
		}
		return u
	}
	check := func(u usage, name string, used int64) {
		t.Helper()
		if len(u.Limits) != 1 || u.Limits[0].Name != name || u.Limits[0].Used != used ||
			u.Limits[0].Remaining != u.Limits[0].Limit-used || !u.Limits[0].Reset.After(time.Now()) {
			t.Fatalf("usage = %+v, want %s used %d", u, name, used)
		}
	}
	check(get("/usage/projects/proj-7"), "agent_job_per_project", 3)
	check(get("/usage/projects/proj-7"), "agent_job_per_project", 3) // reading consumes nothing
	check(get("/usage/projects/other"), "agent_job_per_project", 0)
	check(get("/usage/orgs/acme"), "assistant_per_org", 2)
	check(get("/usage/ips/2001:db8:5:6::99"), "assistant_per_ip", 2) // same /64

	req, _ := http.NewRequest("POST", "http://"+p.admin+"/usage/key", strings.NewReader(`{"key":"svc_dsc_usage"}`))
	req.Header.Set("Authorization", "Bearer "+adminToken)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var u usage
	_ = json.NewDecoder(res.Body).Decode(&u)
	res.Body.Close()
	check(u, "assistant_per_key", 2)

	for _, path := range []string{"/usage/projects/proj-7", "/metrics", "/debug/pprof/"} {
		if code, _ := adminGet(t, p, path, ""); code != 401 {
			t.Fatalf("%s without the admin token: %d", path, code)
		}
		if code, _ := adminGet(t, p, path, "wrong-token-0123456789"); code != 401 {
			t.Fatalf("%s with a wrong token: %d", path, code)
		}
	}
	for _, path := range []string{"/healthz", "/readyz"} {
		if code, _ := adminGet(t, p, path, ""); code != 200 {
			t.Fatalf("%s must not need the token: %d", path, code)
		}
	}
	if code, _ := adminGet(t, p, "/usage/ips/not-an-ip", adminToken); code != 400 {
		t.Fatalf("bad ip: %d", code)
	}
	if res := send(t, p, "GET", "/usage/projects/proj-7", "", ""); res.StatusCode != 404 {
		t.Fatalf("usage on the public listener: %d", res.StatusCode)
	}
	if strings.Contains(p.out.String(), "svc_dsc_usage") {
		t.Fatal("the key reached the logs")
	}
}
