package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/docsgate/gateway/internal/redistest"
)

// Every refusal of the /quota endpoints, against the binary, on Redis and in process: the
// status, the code and the field named, and that nothing was changed or recorded.
func TestQuotaRefusals(t *testing.T) {
	t.Parallel()
	up, _ := recordingUpstream(t)
	srv := redistest.Start(t)
	// redis.timeout 2s: exact counts are checked, not the timeout (exactTimeout).
	stores := map[string]string{"memory": "", "redis": fmt.Sprintf("redis: {addrs: [%q], timeout: 2s}\n", srv.Addr)}
	for name, store := range stores {
		t.Run(name, func(t *testing.T) {
			checkQuotaRefusals(t, startGateway(t, up, store+quotaCfg))
		})
	}
}

func checkQuotaRefusals(t *testing.T, p *proc) {
	grant := func(fields string) string {
		return `{"limit":"agent_job_per_project","id":"p1","amount":1,"reason":"r"` + fields + `}`
	}
	long := strings.Repeat("x", 501)
	cases := []struct {
		name, method, path, body string
		hdr                      map[string]string
		status                   int
		code, field              string
	}{
		// Grants.
		{"no body", "POST", "/quota/grants", "", nil, 415, "unsupported_media_type", ""},
		{"not json", "POST", "/quota/grants", "limit=x", nil, 400, "invalid_request", "body"},
		{"two objects", "POST", "/quota/grants", grant("") + "{}", nil, 400, "invalid_request", "body"},
		{"unknown field", "POST", "/quota/grants", grant(`,"amout":5`), nil, 400, "invalid_request", "amout"},
		// A member named twice: encoding/json would grant the last.
		{"amount twice", "POST", "/quota/grants", grant(`,"amount":1000000`), nil, 400, "invalid_request", "amount"},
		{"id twice, one escaped", "POST", "/quota/grants", grant(`,"id":"p2"`), nil, 400, "invalid_request", "id"},
		{"missing limit", "POST", "/quota/grants", `{"id":"p1","amount":1,"reason":"r"}`, nil, 400, "invalid_request", "limit"},
		{"limit not a string", "POST", "/quota/grants", `{"limit":5,"id":"p1","amount":1,"reason":"r"}`, nil, 400, "invalid_request", "limit"},
		{"unknown limit", "POST", "/quota/grants", `{"limit":"nope","id":"p1","amount":1,"reason":"r"}`, nil, 404, "unknown_limit", ""},
		{"html limit", "POST", "/quota/grants", `{"limit":"<script>x</script>","id":"p1","amount":1,"reason":"r"}`, nil, 404, "unknown_limit", ""},
		{"missing id", "POST", "/quota/grants", `{"limit":"agent_job_per_project","amount":1,"reason":"r"}`, nil, 400, "invalid_request", "id"},
		{"id with braces", "POST", "/quota/grants", `{"limit":"agent_job_per_project","id":"p}1{x","amount":1,"reason":"r"}`, nil, 400, "invalid_request", "id"},
		{"id with glob", "POST", "/quota/grants", `{"limit":"agent_job_per_project","id":"*","amount":1,"reason":"r"}`, nil, 400, "invalid_request", "id"},
		{"id with newline", "POST", "/quota/grants", `{"limit":"agent_job_per_project","id":"p1\nx","amount":1,"reason":"r"}`, nil, 400, "invalid_request", "id"},
		{"id with space", "POST", "/quota/grants", `{"limit":"agent_job_per_project","id":"p 1","amount":1,"reason":"r"}`, nil, 400, "invalid_request", "id"},
		{"huge id", "POST", "/quota/grants", `{"limit":"agent_job_per_project","id":"` + strings.Repeat("a", 129) + `","amount":1,"reason":"r"}`, nil, 400, "invalid_request", "id"},
		{"not an ip", "POST", "/quota/grants", `{"limit":"assistant_per_ip","id":"10.0.0.300","amount":1,"reason":"r"}`, nil, 400, "invalid_request", "id"},
		{"ipv6 prefix of another length", "POST", "/quota/grants", `{"limit":"assistant_per_ip","id":"2001:db8::/48","amount":1,"reason":"r"}`, nil, 400, "invalid_request", "id"},
		{"not a digest", "POST", "/quota/grants", `{"limit":"assistant_per_key","id":"svc_dsc_rawkey","amount":1,"reason":"r"}`, nil, 400, "invalid_request", "id"},
		{"amount 0", "POST", "/quota/grants", `{"limit":"agent_job_per_project","id":"p1","amount":0,"reason":"r"}`, nil, 400, "invalid_request", "amount"},
		{"amount negative", "POST", "/quota/grants", `{"limit":"agent_job_per_project","id":"p1","amount":-3,"reason":"r"}`, nil, 400, "invalid_request", "amount"},
		{"amount fraction", "POST", "/quota/grants", `{"limit":"agent_job_per_project","id":"p1","amount":1.5,"reason":"r"}`, nil, 400, "invalid_request", "amount"},
		{"amount string", "POST", "/quota/grants", `{"limit":"agent_job_per_project","id":"p1","amount":"5","reason":"r"}`, nil, 400, "invalid_request", "amount"},
		{"amount past 2^53", "POST", "/quota/grants", `{"limit":"agent_job_per_project","id":"p1","amount":9007199254740992,"reason":"r"}`, nil, 400, "invalid_request", "amount"},
		{"amount past int64", "POST", "/quota/grants", `{"limit":"agent_job_per_project","id":"p1","amount":1e30,"reason":"r"}`, nil, 400, "invalid_request", "amount"},
		{"allowance past 2^53", "POST", "/quota/grants", `{"limit":"agent_job_per_project","id":"p1","amount":9007199254740990,"reason":"r"}`, nil, 400, "invalid_request", "amount"},
		{"missing reason", "POST", "/quota/grants", `{"limit":"agent_job_per_project","id":"p1","amount":1}`, nil, 400, "invalid_request", "reason"},
		{"blank reason", "POST", "/quota/grants", `{"limit":"agent_job_per_project","id":"p1","amount":1,"reason":"   "}`, nil, 400, "invalid_request", "reason"},
		{"reason too long", "POST", "/quota/grants", `{"limit":"agent_job_per_project","id":"p1","amount":1,"reason":"` + long + `"}`, nil, 400, "invalid_request", "reason"},
		{"reason with newline", "POST", "/quota/grants", `{"limit":"agent_job_per_project","id":"p1","amount":1,"reason":"a\nFORGED LINE"}`, nil, 400, "invalid_request", "reason"},
		{"reason with escape", "POST", "/quota/grants", `{"limit":"agent_job_per_project","id":"p1","amount":1,"reason":"a\u001b[31m"}`, nil, 400, "invalid_request", "reason"},
		{"reason with a bidi override", "POST", "/quota/grants", `{"limit":"agent_job_per_project","id":"p1","amount":1,"reason":"approved by \u202eecila"}`, nil, 400, "invalid_request", "reason"},
		{"reason with a bidi isolate", "POST", "/quota/grants", `{"limit":"agent_job_per_project","id":"p1","amount":1,"reason":"ok \u2067x\u2069"}`, nil, 400, "invalid_request", "reason"},
		{"reason with a line separator", "POST", "/quota/grants", `{"limit":"agent_job_per_project","id":"p1","amount":1,"reason":"a\u2028FORGED LINE"}`, nil, 400, "invalid_request", "reason"},
		{"reason with a paragraph separator", "POST", "/quota/grants", `{"limit":"agent_job_per_project","id":"p1","amount":1,"reason":"a\u2029FORGED"}`, nil, 400, "invalid_request", "reason"},
		{"reason with a zero-width space", "POST", "/quota/grants", `{"limit":"agent_job_per_project","id":"p1","amount":1,"reason":"ti\u200bcket"}`, nil, 400, "invalid_request", "reason"},
		{"basic user with a bidi override", "POST", "/quota/grants", grant(""), map[string]string{"Authorization": "Basic " + basicAuth("\u202eecila", quotaToken)}, 400, "invalid_request", "user"},
		{"basic user with a line separator", "POST", "/quota/resets", grant(""), map[string]string{"Authorization": "Basic " + basicAuth("ops\u2028FORGED", quotaToken)}, 400, "invalid_request", "user"},
		{"basic user with a zero-width space", "PUT", "/quota/overrides/agent_job_per_project/p1", `{"limit":5,"ttl":"1h","reason":"r"}`, map[string]string{"Authorization": "Basic " + basicAuth("op\u200bs", quotaToken)}, 400, "invalid_request", "user"},
		{"basic user with a bidi override, reading", "GET", "/quota/audit", "", map[string]string{"Authorization": "Basic " + basicAuth("\u202eecila", quotaToken)}, 400, "invalid_request", "user"},
		{"body too large", "POST", "/quota/grants", `{"limit":"agent_job_per_project","id":"p1","amount":1,"reason":"` + strings.Repeat("x", 17<<10) + `"}`, nil, 400, "invalid_request", "body"},
		{"text/plain", "POST", "/quota/grants", grant(""), map[string]string{"Content-Type": "text/plain"}, 415, "unsupported_media_type", ""},
		{"form", "POST", "/quota/grants", "limit=agent_job_per_project", map[string]string{"Content-Type": "application/x-www-form-urlencoded"}, 415, "unsupported_media_type", ""},
		{"no token", "POST", "/quota/grants", grant(""), map[string]string{"Authorization": ""}, 401, "invalid_credentials", ""},
		{"wrong token", "POST", "/quota/grants", grant(""), map[string]string{"Authorization": "Bearer quota-admin-token-0123456780"}, 401, "invalid_credentials", ""},
		{"cross-site page", "POST", "/quota/grants", grant(""), map[string]string{"Sec-Fetch-Site": "cross-site", "Origin": "https://evil.example"}, 403, "cross_origin_refused", ""},
		{"foreign origin", "POST", "/quota/resets", grant(""), map[string]string{"Origin": "https://evil.example"}, 403, "cross_origin_refused", ""},
		{"rebinding host", "POST", "/quota/grants", grant(""), map[string]string{"Host": "evil.example"}, 421, "misdirected_request", ""},
		// Overrides.
		{"override: no end", "PUT", "/quota/overrides/agent_job_per_project/p1", `{"limit":5,"reason":"r"}`, nil, 400, "invalid_request", "expires"},
		{"override: both ends", "PUT", "/quota/overrides/agent_job_per_project/p1", `{"limit":5,"ttl":"1h","expires":"2099-01-01T00:00:00Z","reason":"r"}`, nil, 400, "invalid_request", "ttl"},
		{"override: past", "PUT", "/quota/overrides/agent_job_per_project/p1", `{"limit":5,"expires":"2020-01-01T00:00:00Z","reason":"r"}`, nil, 400, "invalid_request", "expires"},
		{"override: past a year", "PUT", "/quota/overrides/agent_job_per_project/p1", `{"limit":5,"expires":"` + time.Now().AddDate(1, 0, 2).UTC().Format(time.RFC3339) + `","reason":"r"}`, nil, 400, "invalid_request", "expires"},
		{"override: not RFC 3339", "PUT", "/quota/overrides/agent_job_per_project/p1", `{"limit":5,"expires":"tomorrow","reason":"r"}`, nil, 400, "invalid_request", "expires"},
		{"override: bad ttl", "PUT", "/quota/overrides/agent_job_per_project/p1", `{"limit":5,"ttl":"1 day","reason":"r"}`, nil, 400, "invalid_request", "ttl"},
		{"override: ttl 0", "PUT", "/quota/overrides/agent_job_per_project/p1", `{"limit":5,"ttl":"0s","reason":"r"}`, nil, 400, "invalid_request", "ttl"},
		{"override: negative ttl", "PUT", "/quota/overrides/agent_job_per_project/p1", `{"limit":5,"ttl":"-1h","reason":"r"}`, nil, 400, "invalid_request", "ttl"},
		{"override: ttl past a year", "PUT", "/quota/overrides/agent_job_per_project/p1", `{"limit":5,"ttl":"9000h","reason":"r"}`, nil, 400, "invalid_request", "ttl"},
		{"override: no limit", "PUT", "/quota/overrides/agent_job_per_project/p1", `{"ttl":"1h","reason":"r"}`, nil, 400, "invalid_request", "limit"},
		{"override: negative limit", "PUT", "/quota/overrides/agent_job_per_project/p1", `{"limit":-1,"ttl":"1h","reason":"r"}`, nil, 400, "invalid_request", "limit"},
		{"override: limit as text", "PUT", "/quota/overrides/agent_job_per_project/p1", `{"limit":"10","ttl":"1h","reason":"r"}`, nil, 400, "invalid_request", "limit"},
		{"override: limit past 2^53", "PUT", "/quota/overrides/agent_job_per_project/p1", `{"limit":9007199254740992,"ttl":"1h","reason":"r"}`, nil, 400, "invalid_request", "limit"},
		{"override: limit twice", "PUT", "/quota/overrides/agent_job_per_project/p1", `{"limit":0,"ttl":"1h","reason":"r","limit":1000000}`, nil, 400, "invalid_request", "limit"},
		{"override: id in body", "PUT", "/quota/overrides/agent_job_per_project/p1", `{"limit":5,"ttl":"1h","reason":"r","id":"p2"}`, nil, 400, "invalid_request", "id"},
		{"override: unknown limit", "PUT", "/quota/overrides/nope/p1", `{"limit":5,"ttl":"1h","reason":"r"}`, nil, 404, "unknown_limit", ""},
		{"override: bad id", "PUT", "/quota/overrides/agent_job_per_project/p%7B1%7D", `{"limit":5,"ttl":"1h","reason":"r"}`, nil, 400, "invalid_request", "id"},
		{"override: id with a slash", "PUT", "/quota/overrides/agent_job_per_project/a/b", `{"limit":5,"ttl":"1h","reason":"r"}`, nil, 400, "invalid_request", "id"},
		{"override: no reason", "PUT", "/quota/overrides/agent_job_per_project/p1", `{"limit":5,"ttl":"1h"}`, nil, 400, "invalid_request", "reason"},
		{"override: text/plain", "PUT", "/quota/overrides/agent_job_per_project/p1", `{"limit":5,"ttl":"1h","reason":"r"}`, map[string]string{"Content-Type": "text/plain"}, 415, "unsupported_media_type", ""},
		{"end: none", "DELETE", "/quota/overrides/agent_job_per_project/p1?reason=r", "", nil, 404, "unknown_override", ""},
		{"end: no reason", "DELETE", "/quota/overrides/agent_job_per_project/p1", "", nil, 400, "invalid_request", "reason"},
		{"end: reason twice", "DELETE", "/quota/overrides/agent_job_per_project/p1?reason=a&reason=b", "", nil, 400, "invalid_request", "reason"},
		{"end: reason in both", "DELETE", "/quota/overrides/agent_job_per_project/p1?reason=a", `{"reason":"b"}`, nil, 400, "invalid_request", "reason"},
		{"end: body not json", "DELETE", "/quota/overrides/agent_job_per_project/p1", `reason=b`, map[string]string{"Content-Type": "text/plain"}, 415, "unsupported_media_type", ""},
		{"end: unknown field", "DELETE", "/quota/overrides/agent_job_per_project/p1", `{"why":"b"}`, nil, 400, "invalid_request", "why"},
		{"end: newline reason", "DELETE", "/quota/overrides/agent_job_per_project/p1?reason=a%0Ab", "", nil, 400, "invalid_request", "reason"},
		{"end: bidi reason", "DELETE", "/quota/overrides/agent_job_per_project/p1?reason=a%E2%80%AEb", "", nil, 400, "invalid_request", "reason"},
		{"end: unknown limit", "DELETE", "/quota/overrides/nope/p1?reason=r", "", nil, 404, "unknown_limit", ""},
		{"end: cross-site", "DELETE", "/quota/overrides/agent_job_per_project/p1?reason=r", "", map[string]string{"Sec-Fetch-Site": "cross-site"}, 403, "cross_origin_refused", ""},
		// Resets.
		{"reset: unknown limit", "POST", "/quota/resets", `{"limit":"nope","id":"p1","reason":"r"}`, nil, 404, "unknown_limit", ""},
		{"reset: bad id", "POST", "/quota/resets", `{"limit":"agent_job_per_project","id":"","reason":"r"}`, nil, 400, "invalid_request", "id"},
		{"reset: amount", "POST", "/quota/resets", `{"limit":"agent_job_per_project","id":"p1","reason":"r","amount":5}`, nil, 400, "invalid_request", "amount"},
		// Reads.
		{"audit: n 0", "GET", "/quota/audit?n=0", "", nil, 400, "invalid_request", "n"},
		{"audit: n huge", "GET", "/quota/audit?n=10001", "", nil, 400, "invalid_request", "n"},
		{"audit: n text", "GET", "/quota/audit?n=ten", "", nil, 400, "invalid_request", "n"},
		{"audit: no token", "GET", "/quota/audit", "", map[string]string{"Authorization": ""}, 401, "invalid_credentials", ""},
		{"overrides: no token", "GET", "/quota/overrides", "", map[string]string{"Authorization": ""}, 401, "invalid_credentials", ""},
	}
	for _, c := range cases {
		hdr := map[string]string{"Authorization": "Bearer " + quotaToken}
		if c.body != "" {
			hdr["Content-Type"] = "application/json"
		}
		for k, v := range c.hdr {
			hdr[k] = v
		}
		if hdr["Authorization"] == "" {
			delete(hdr, "Authorization")
		}
		if c.name == "no body" {
			delete(hdr, "Content-Type")
		}
		a := adminCall(t, http.DefaultClient, "http://"+p.admin, c.method, c.path, hdr, c.body)
		var body struct{ Error, Code, Field string }
		if err := json.Unmarshal([]byte(a.body), &body); err != nil || a.status != c.status || body.Code != c.code || body.Field != c.field || body.Error == "" {
			t.Errorf("%s: %d %s, want %d %s naming %q", c.name, a.status, a.body, c.status, c.code, c.field)
		}
		if strings.Contains(a.body, "<script>") || strings.Contains(a.body, "FORGED") {
			t.Errorf("%s: the answer repeats hostile input: %s", c.name, a.body)
		}
	}
	// Nothing was changed and nothing recorded.
	if e := auditOf(t, p); len(e) != 0 {
		t.Fatalf("refusals left audit entries: %+v", e)
	}
	if u := usageOf(t, p, "p1"); u.Granted != 0 || u.Override != nil || u.Limit != 3 {
		t.Fatalf("refusals changed p1: %+v", u)
	}
	// HTML in a reason is kept as text, and comes back JSON-escaped.
	a := mustStatus(t, quotaAPI(t, p, "<b>eve</b>", "POST", "/quota/grants", `{"limit":"agent_job_per_project","id":"p1","amount":1,"reason":"<img src=x onerror=alert(1)> \"quoted\""}`), 201)
	e := auditOf(t, p)
	if strings.Contains(a.body, "<") || len(e) != 1 || e[0].Reason != `<img src=x onerror=alert(1)> "quoted"` || e[0].Actor != "<b>eve</b>" {
		t.Fatalf("hostile reason and actor: %s %+v", a.body, e)
	}
	// IPv6 clients are named by the prefix the limit counts, whichever way the operator writes it.
	a = mustStatus(t, quotaAPI(t, p, "", "POST", "/quota/grants", `{"limit":"assistant_per_ip","id":"2001:DB8:0:1::abcd","amount":1,"reason":"r"}`), 201)
	if !strings.Contains(a.body, `"id":"2001:db8:0:1::/64"`) {
		t.Fatalf("an IPv6 address is granted as its /64: %s", a.body)
	}
}

// Writes are refused until admin_token is set, reads are open on a loopback listener like
// the other admin reads.
func TestQuotaWritesNeedToken(t *testing.T) {
	t.Parallel()
	up, _ := recordingUpstream(t)
	p := startGateway(t, up, "limits:\n  agent_job_per_project: {limit: 3}\n")
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/quota/grants", `{"limit":"agent_job_per_project","id":"p1","amount":1,"reason":"r"}`},
		{"PUT", "/quota/overrides/agent_job_per_project/p1", `{"limit":0,"ttl":"1h","reason":"r"}`},
		{"DELETE", "/quota/overrides/agent_job_per_project/p1?reason=r", ""},
		{"POST", "/quota/resets", `{"limit":"agent_job_per_project","id":"p1","reason":"r"}`},
	} {
		hdr := map[string]string{}
		if c.body != "" {
			hdr["Content-Type"] = "application/json"
		}
		if a := adminCall(t, http.DefaultClient, "http://"+p.admin, c.method, c.path, hdr, c.body); a.status != 403 || a.code != "admin_token_required" {
			t.Errorf("%s %s without admin_token: %d %s", c.method, c.path, a.status, a.body)
		}
	}
	if code, body := adminGet(t, p, "/quota/audit", ""); code != 200 || body != "{\"entries\":[]}\n" {
		t.Fatalf("audit without admin_token: %d %s", code, body)
	}
}

// The CLI against the binary: each command, its refusals and exit codes.
func TestQuotaCLI(t *testing.T) {
	t.Parallel()
	up, _ := recordingUpstream(t)
	p := startGateway(t, up, quotaCfg)
	run := func(token string, args ...string) (int, string, string) {
		cmd := exec.Command(gatewayBin, append([]string{"quota"}, args...)...)
		cmd.Env = append(cmd.Environ(), "GATEWAY_ADMIN_TOKEN="+token)
		var out, errb strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return code, out.String(), errb.String()
	}
	admin := "-admin=http://" + p.admin
	steps := []struct {
		token string
		args  []string
		code  int
		out   string
	}{
		{quotaToken, []string{"grant", admin, "--limit", "agent_job_per_project", "--id", "p1", "--amount", "4", "--reason", "ticket 1"}, 0, "granted: agent_job_per_project p1 now has 4 granted"},
		{quotaToken, []string{"override", admin, "--limit", "agent_job_per_project", "--id", "p1", "--value", "0", "--ttl", "1h", "--reason", "incident"}, 0, "has a limit of 0 until"},
		{quotaToken, []string{"overrides", admin}, 0, "agent_job_per_project  p1  0"},
		{quotaToken, []string{"end", admin, "--limit", "agent_job_per_project", "--id", "p1", "--reason", "over"}, 0, "override_end: agent_job_per_project p1: before limit 0, used 0, granted 4; after limit 7"},
		{quotaToken, []string{"end", admin, "--limit", "agent_job_per_project", "--id", "p1", "--reason", "over"}, 1, "gateway: unknown_override: "},
		{quotaToken, []string{"reset", admin, "--limit", "agent_job_per_project", "--id", "p1", "--reason", "bug"}, 0, "reset: agent_job_per_project p1"},
		{quotaToken, []string{"audit", admin, "-n", "2"}, 0, "reset         agent_job_per_project  p1  0/7 (+4)"},
		{"", []string{"audit", admin}, 1, "gateway: invalid_credentials: "},
		{quotaToken, []string{"grant", admin, "--limit", "agent_job_per_project", "--id", "p1", "--amount", "4"}, 2, "--limit, --id and --reason are required"},
		{quotaToken, []string{"override", admin, "--limit", "l", "--id", "i", "--value", "1", "--reason", "r"}, 2, "give --ttl or --expires"},
		{quotaToken, []string{"grant", "-admin=ftp://x", "--limit", "l", "--id", "i", "--amount", "1", "--reason", "r"}, 2, "want http://host:port"},
		{quotaToken, []string{"frobnicate"}, 2, "unknown command"},
		{quotaToken, []string{"--help"}, 0, "Examples:"},
	}
	for _, s := range steps {
		code, out, errOut := run(s.token, s.args...)
		if code != s.code || !strings.Contains(out+errOut, s.out) {
			t.Fatalf("gateway quota %v: exit %d\n%s%s\nwant exit %d and %q", s.args, code, out, errOut, s.code, s.out)
		}
	}
	if e := auditOf(t, p); len(e) != 4 || e[0].Action != "reset" || e[3].Action != "grant" || e[3].Actor != "token" {
		t.Fatalf("audit after the CLI: %+v", e)
	}
}

// A grant on a streams limit (answers in flight, no window) used to answer 201 with a
// window_end a second ahead and vanish by then: it is refused naming the limit and pointing
// to an override, through the API and the CLI, on Redis and in process; nothing is recorded,
// and the override it points to is taken.
func TestGrantOnStreamsLimitRefused(t *testing.T) {
	t.Parallel()
	up, _ := recordingUpstream(t)
	cfg := `admin_token: ` + quotaToken + `
orgs: {acme: [acme-docs]}
limits:
  assistant_streams_per_org: {limit: 5, by: org, unit: streams}
routes:
  - name: assistant_message
    limits: [assistant_per_org, assistant_streams_per_org]
`
	for _, st := range quotaStores(true, false) {
		t.Run(st.name, func(t *testing.T) {
			p := startGateway(t, up, st.start(t)+cfg)
			a := quotaAPI(t, p, "", "POST", "/quota/grants", `{"limit":"assistant_streams_per_org","id":"acme","amount":5,"reason":"launch"}`)
			var body struct{ Error, Code, Field string }
			if err := json.Unmarshal([]byte(a.body), &body); err != nil || a.status != 400 || body.Code != "invalid_request" || body.Field != "limit" ||
				!strings.Contains(body.Error, "override") {
				t.Fatalf("grant on a streams limit: %d %s, want 400 invalid_request naming limit and saying to use an override", a.status, a.body)
			}
			cmd := exec.Command(gatewayBin, "quota", "grant", "-admin=http://"+p.admin, "--limit", "assistant_streams_per_org", "--id", "acme", "--amount", "5", "--reason", "launch")
			cmd.Env = append(cmd.Environ(), "GATEWAY_ADMIN_TOKEN="+quotaToken)
			out, err := cmd.CombinedOutput()
			if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "gateway: invalid_request: ") || !strings.Contains(string(out), "override") {
				t.Fatalf("gateway quota grant on a streams limit: %v\n%s", err, out)
			}
			if e := auditOf(t, p); len(e) != 0 {
				t.Fatalf("refused grants left audit entries: %+v", e)
			}
			// A grant on the requests limit of the same route still works.
			mustStatus(t, quotaAPI(t, p, "", "POST", "/quota/grants", `{"limit":"assistant_per_org","id":"acme","amount":5,"reason":"launch"}`), 201)
			o := mustStatus(t, quotaAPI(t, p, "", "PUT", "/quota/overrides/assistant_streams_per_org/acme", `{"limit":10,"ttl":"1h","reason":"launch"}`), 200)
			if !strings.Contains(o.body, `"value":10`) {
				t.Fatalf("override of the streams limit: %s", o.body)
			}
		})
	}
}

// What an older gateway stored before format and separator characters were refused (an
// audit entry whose actor and reason hold a bidi override, a line separator and a zero-width
// space) is shown without them: by gateway quota audit and on the usage page.
func TestQuotaAuditHidesStoredMisleadingText(t *testing.T) {
	t.Parallel()
	up, _ := recordingUpstream(t)
	srv := redistest.Start(t)
	// redis.timeout 2s: exact counts are checked, not the timeout (exactTimeout).
	p := startGateway(t, up, fmt.Sprintf("redis: {addrs: [%q], timeout: 2s}\n%s", srv.Addr, quotaCfg))
	entry := `{"time":"2026-11-25T12:00:00Z","actor":"\u202eecila","action":"grant","limit":"agent_job_per_project","id":"p1",` +
		`"before":{"limit":3,"used":0,"granted":0},"after":{"limit":4,"used":0,"granted":1},"reason":"ok\u2028FORGED LINE\u200b","amount":1}`
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer c.Close()
	if err := c.LPush(context.Background(), "gw:{quota}:audit", entry).Err(); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(gatewayBin, "quota", "audit", "-admin=http://"+p.admin)
	cmd.Env = append(cmd.Environ(), "GATEWAY_ADMIN_TOKEN="+quotaToken)
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "ecila") || !strings.Contains(string(out), "okFORGED LINE") {
		t.Fatalf("gateway quota audit: %v\n%s", err, out)
	}
	a := mustStatus(t, quotaAPI(t, p, "", "GET", "/ui/", ""), 200)
	if !strings.Contains(a.body, "okFORGED LINE") {
		t.Fatalf("the page does not list the entry:\n%s", a.body)
	}
	for _, shown := range []string{string(out), a.body} {
		if strings.ContainsAny(shown, "\u202e\u2028\u200b") {
			t.Errorf("a format or separator character was shown: %q", shown)
		}
	}
}
