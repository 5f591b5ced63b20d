package main

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/docsgate/gateway/internal/redistest"
)

// Run-time quotas as operators meet them: the built binary, its admin API, requests on the
// public listener. Everything runs with the settings a deployment has by default (redis.timeout
// 100ms, coalescing on), on a real Redis and in process.

const quotaToken = "quota-admin-token-0123456789"

// quotaAPI calls p's admin API with the token as a bearer, or as the Basic-auth password of
// user when user is set.
func quotaAPI(t *testing.T, p *proc, user, method, path, body string) adminAnswer {
	t.Helper()
	hdr := map[string]string{"Authorization": "Bearer " + quotaToken}
	if user != "" {
		hdr["Authorization"] = "Basic " + basicAuth(user, quotaToken)
	}
	if body != "" {
		hdr["Content-Type"] = "application/json"
	}
	return adminCall(t, http.DefaultClient, "http://"+p.admin, method, path, hdr, body)
}

func basicAuth(user, pass string) string {
	req, _ := http.NewRequest("GET", "http://x/", nil)
	req.SetBasicAuth(user, pass)
	return strings.TrimPrefix(req.Header.Get("Authorization"), "Basic ")
}

func mustStatus(t *testing.T, a adminAnswer, want int) adminAnswer {
	t.Helper()
	if a.status != want {
		t.Fatalf("admin answer %d %s, want %d", a.status, a.body, want)
	}
	return a
}

// job sends one agent job for project on p.
func job(t *testing.T, p *proc, project string) *http.Response {
	t.Helper()
	return send(t, p, "POST", "/v2/agent/"+project+"/job", "svc_quota", `{"prompt":"x"}`)
}

// jobs sends n jobs and counts the statuses.
func jobs(t *testing.T, p *proc, project string, n int) map[int]int {
	t.Helper()
	codes := map[int]int{}
	for range n {
		codes[job(t, p, project).StatusCode]++
	}
	return codes
}

type auditT struct {
	Time   time.Time `json:"time"`
	Actor  string    `json:"actor"`
	Action string    `json:"action"`
	Limit  string    `json:"limit"`
	ID     string    `json:"id"`
	Before stateT    `json:"before"`
	After  stateT    `json:"after"`
	Reason string    `json:"reason"`
}

type stateT struct{ Limit, Used, Granted int64 }

func auditOf(t *testing.T, p *proc) []auditT {
	t.Helper()
	var out struct{ Entries []auditT }
	a := mustStatus(t, quotaAPI(t, p, "", "GET", "/quota/audit?n=100", ""), 200)
	if err := json.Unmarshal([]byte(a.body), &out); err != nil {
		t.Fatal(err)
	}
	return out.Entries
}

type overrideT struct {
	Limit, ID, Reason, Actor string
	Value                    int64
	Expires, Created         time.Time
}

func overridesOf(t *testing.T, p *proc) []overrideT {
	t.Helper()
	var out struct{ Overrides []overrideT }
	a := mustStatus(t, quotaAPI(t, p, "", "GET", "/quota/overrides", ""), 200)
	if err := json.Unmarshal([]byte(a.body), &out); err != nil {
		t.Fatal(err)
	}
	return out.Overrides
}

const quotaCfg = `admin_token: ` + quotaToken + `
limits:
  agent_job_per_project: {limit: 3}
`

// TestQuotaActions: a grant, overrides that lapse by themselves (0 and 1), a reset and the
// audit trail, on two replicas sharing Redis and on the in-process store; on Redis the
// actions survive a restart of every replica, and each request stays one script call.
func TestQuotaActions(t *testing.T) {
	awayFromHourEnd(t)
	up, _ := recordingUpstream(t)
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Start(t)
		// redis.timeout 2s: exact counts are checked, not the timeout (exactTimeout).
		cfg := fmt.Sprintf("redis: {addrs: [%q], timeout: 2s}\n%s", srv.Addr, quotaCfg)
		a, b := startGateway(t, up, cfg), startGateway(t, up, cfg)
		exerciseQuotas(t, a, b, srv)
		// Every replica restarts: grants, overrides and the trail are Redis'.
		before := auditOf(t, a)
		mustStatus(t, quotaAPI(t, a, "", "PUT", "/quota/overrides/agent_job_per_project/p4", `{"limit":1,"ttl":"1h","reason":"long one"}`), 200)
		for _, p := range []*proc{a, b} {
			_ = p.cmd.Process.Kill()
			p.wait(t, 10*time.Second)
		}
		c := startGateway(t, up, cfg)
		after := auditOf(t, c)
		if len(after) != len(before)+1 || after[0].ID != "p4" || after[1] != before[0] || after[len(after)-1] != before[len(before)-1] {
			t.Fatalf("audit after the restart: %+v, want the %d entries before it and the override of p4", after, len(before))
		}
		if os := overridesOf(t, c); len(os) != 1 || os[0].ID != "p4" || os[0].Value != 1 {
			t.Fatalf("overrides after the restart: %+v", os)
		}
		if c := jobs(t, c, "p4", 2); c[201] != 1 || c[429] != 1 {
			t.Fatalf("p4 under its override of 1 after the restart: %v", c)
		}
		if u := usageOf(t, c, "p1"); u.Granted != 2 || u.Limit != 5 {
			t.Fatalf("p1's grant after the restart: %+v", u)
		}
	})
	t.Run("memory", func(t *testing.T) {
		a := startGateway(t, up, quotaCfg)
		exerciseQuotas(t, a, a, nil)
	})
}

// awayFromHourEnd waits for the next hour when less than a minute of this one is left: the
// tests count in hour windows, and grants end with them.
func awayFromHourEnd(t *testing.T) {
	t.Helper()
	if left := time.Until(time.Now().Truncate(time.Hour).Add(time.Hour)); left < time.Minute {
		t.Logf("waiting %v for the next hour window", left)
		time.Sleep(left + time.Second)
	}
}

type usageT struct {
	Limit, Used, Remaining, Granted int64
	Override                        *struct {
		Value   int64
		Expires time.Time
	}
}

func usageOf(t *testing.T, p *proc, project string) usageT {
	t.Helper()
	var out struct{ Limits []usageT }
	a := mustStatus(t, quotaAPI(t, p, "", "GET", "/usage/projects/"+project, ""), 200)
	if err := json.Unmarshal([]byte(a.body), &out); err != nil || len(out.Limits) != 1 {
		t.Fatalf("usage of %s: %s %v", project, a.body, err)
	}
	return out.Limits[0]
}

// exerciseQuotas runs the actions on a and checks their effect on b (the same replica in
// process); srv, when set, is the Redis both share.
func exerciseQuotas(t *testing.T, a, b *proc, srv *redistest.Server) {
	if c := jobs(t, a, "p1", 3); c[201] != 3 {
		t.Fatalf("p1 before: %v", c)
	}
	if res := job(t, b, "p1"); res.StatusCode != 429 {
		t.Fatalf("p1's 4th job: %d", res.StatusCode)
	}
	// A grant made on a admits on b within a second: exactly the 2 granted.
	g := mustStatus(t, quotaAPI(t, a, "alice", "POST", "/quota/grants", `{"limit":"agent_job_per_project","id":"p1","amount":2,"reason":"ticket 4711"}`), 201)
	granted := time.Now()
	var grant struct {
		Limit, ID string
		Granted   int64
		WindowEnd time.Time `json:"window_end"`
	}
	if err := json.Unmarshal([]byte(g.body), &grant); err != nil || grant.Granted != 2 || grant.Limit != "agent_job_per_project" || grant.ID != "p1" ||
		!grant.WindowEnd.Equal(time.Now().UTC().Truncate(time.Hour).Add(time.Hour)) {
		t.Fatalf("grant answer %s", g.body)
	}
	var first *http.Response
	for first == nil || first.StatusCode != 201 {
		if time.Since(granted) > time.Second {
			t.Fatalf("the grant made on one replica did not admit on the other within 1 s (last %d)", first.StatusCode)
		}
		first = job(t, b, "p1")
	}
	t.Logf("the grant admitted on the other replica %v after it was answered", time.Since(granted))
	if first.Header.Get("RateLimit-Limit") != "5" || first.Header.Get("RateLimit-Policy") != `"agent_job_per_project";q=5;w=3600` {
		t.Fatalf("headers after the grant: %v", first.Header)
	}
	var calls int
	if srv != nil {
		calls = redistest.ScriptCalls(t, srv.Client(t))
	}
	if c := jobs(t, b, "p1", 3); c[201] != 1 || c[429] != 2 {
		t.Fatalf("p1 after granting 2: %v, want 1 more admitted", c)
	}
	if srv != nil {
		if n := redistest.ScriptCalls(t, srv.Client(t)) - calls; n != 3 {
			t.Fatalf("%d script calls for 3 requests with a grant in force, want 3", n)
		}
	}

	// An override of 0 for a few seconds refuses everything, tells to retry when it ends,
	// and lapses by itself.
	mustStatus(t, quotaAPI(t, a, "", "PUT", "/quota/overrides/agent_job_per_project/p2", `{"limit":0,"ttl":"3s","reason":"incident 93"}`), 200)
	ends := time.Now().Add(3 * time.Second)
	res := job(t, b, "p2")
	retry, _ := strconv.Atoi(res.Header.Get("Retry-After"))
	if res.StatusCode != 429 || retry < 1 || retry > 3 || res.Header.Get("RateLimit-Limit") != "0" {
		t.Fatalf("p2 under an override of 0: %d Retry-After %q %v", res.StatusCode, res.Header.Get("Retry-After"), res.Header)
	}
	// An override of 1 for a few seconds, on p3.
	mustStatus(t, quotaAPI(t, a, "", "PUT", "/quota/overrides/agent_job_per_project/p3", `{"limit":1,"expires":"`+
		time.Now().Add(4*time.Second).UTC().Format(time.RFC3339Nano)+`","reason":"incident 94"}`), 200)
	if c := jobs(t, b, "p3", 2); c[201] != 1 || c[429] != 1 {
		t.Fatalf("p3 under an override of 1: %v", c)
	}
	if os := overridesOf(t, b); len(os) != 2 || os[0].ID != "p2" || os[1].ID != "p3" || os[0].Actor != "token" || os[1].Reason != "incident 94" {
		t.Fatalf("overrides in force: %+v", os)
	}
	time.Sleep(time.Until(ends.Add(1500 * time.Millisecond)))
	if c := jobs(t, b, "p2", 4); c[201] != 3 || c[429] != 1 {
		t.Fatalf("p2 after its override lapsed: %v, want the plan's 3", c)
	}
	if c := jobs(t, b, "p3", 3); c[201] != 2 || c[429] != 1 {
		t.Fatalf("p3 after its override lapsed: %v, want 2 more of the plan's 3", c)
	}
	if os := overridesOf(t, b); len(os) != 0 {
		t.Fatalf("overrides after they lapsed: %+v", os)
	}
	mustStatus(t, quotaAPI(t, a, "", "DELETE", "/quota/overrides/agent_job_per_project/p2?reason=gone", ""), 404)

	// A reset empties the window: p1 gets its 3 and the 2 granted again.
	mustStatus(t, quotaAPI(t, a, "", "POST", "/quota/resets", `{"limit":"agent_job_per_project","id":"p1","reason":"client bug"}`), 200)
	if c := jobs(t, b, "p1", 6); c[201] != 5 || c[429] != 1 {
		t.Fatalf("p1 after the reset: %v, want 5", c)
	}

	// The trail, newest first, with who did what and the numbers around it.
	want := []auditT{
		{Actor: "token", Action: "reset", ID: "p1", Before: stateT{5, 5, 2}, After: stateT{5, 0, 2}, Reason: "client bug"},
		{Actor: "token", Action: "override", ID: "p3", Before: stateT{3, 0, 0}, After: stateT{1, 0, 0}, Reason: "incident 94"},
		{Actor: "token", Action: "override", ID: "p2", Before: stateT{3, 0, 0}, After: stateT{0, 0, 0}, Reason: "incident 93"},
		{Actor: "alice", Action: "grant", ID: "p1", Before: stateT{3, 3, 0}, After: stateT{5, 3, 2}, Reason: "ticket 4711"},
	}
	got := auditOf(t, b)
	if len(got) != len(want) {
		t.Fatalf("audit: %+v, want %d entries", got, len(want))
	}
	for i, w := range want {
		g := got[i]
		w.Time, w.Limit = g.Time, "agent_job_per_project"
		if g != w || (i > 0 && g.Time.After(got[i-1].Time)) || time.Since(g.Time) > time.Minute {
			t.Fatalf("audit entry %d: %+v, want %+v (newest first)", i, g, w)
		}
	}
	// The audit log line of each write names the tenant.
	lines := waitAudit(t, a, 5)
	if l := lines[0]; l["action"] != "quota.grant" || l["target"] != "agent_job_per_project/p1" || l["actor"] != "alice" || l["status"] != float64(201) {
		t.Fatalf("admin write line %v", l)
	}
}

// On a Redis Cluster, with tenants on different masters: grants and overrides apply to each
// tenant on its own master (the quota hash shares its counter's slot), a request stays one
// script call per master it touches, and a tenant blocked on one master is charged nothing
// on the others.
func TestQuotaOnRedisCluster(t *testing.T) {
	awayFromHourEnd(t)
	cl := redistest.StartCluster(t, 3)
	up, _ := recordingUpstream(t)
	addrs := make([]string, len(cl.Addrs))
	for i, a := range cl.Addrs {
		addrs[i] = strconv.Quote(a)
	}
	// redis.timeout 2s: exact counts are checked, not the timeout (exactTimeout).
	cfg := fmt.Sprintf("redis: {addrs: [%s], timeout: 2s}\nclient_ip: {trusted_proxies: [127.0.0.1]}\n%s  assistant_per_org: {limit: 5}\n", strings.Join(addrs, ", "), quotaCfg)
	a, b := startGateway(t, up, cfg), startGateway(t, up, cfg)
	master := func(key string) string { return cl.MasterOf(t, key).Addr }

	// Two projects on different masters.
	pA, pB := "pa0", ""
	for i := 0; pB == ""; i++ {
		if id := fmt.Sprintf("pb%d", i); master("gw:agent_job_per_project:hour:{"+id+"}") != master("gw:agent_job_per_project:hour:{"+pA+"}") {
			pB = id
		}
	}
	mustStatus(t, quotaAPI(t, a, "", "POST", "/quota/grants", `{"limit":"agent_job_per_project","id":"`+pA+`","amount":3,"reason":"launch"}`), 201)
	mustStatus(t, quotaAPI(t, a, "", "PUT", "/quota/overrides/agent_job_per_project/"+pB, `{"limit":1,"ttl":"1h","reason":"hold"}`), 200)
	time.Sleep(time.Second) // every replica applies an action within a second
	if c := jobs(t, b, pA, 7); c[201] != 6 || c[429] != 1 {
		t.Fatalf("%s with 3 granted on one master: %v, want 6", pA, c)
	}
	if c := jobs(t, b, pB, 2); c[201] != 1 || c[429] != 1 {
		t.Fatalf("%s overridden to 1 on another master: %v", pB, c)
	}

	// An assistant request: its key, org and IP counters on three masters when possible.
	const key = "svc_dsc_cluster_quota"
	digest := fmt.Sprintf("%x", sha256.Sum256([]byte(key)))
	orgKey := "gw:assistant_per_org:hour:{acme-docs}"
	ip := ""
	for i := 1; ip == ""; i++ {
		cand := fmt.Sprintf("198.51.100.%d", i)
		if master("gw:assistant_per_ip:day:{"+cand+"}") != master(orgKey) {
			ip = cand
		}
	}
	ask := func(p *proc, ip string) *http.Response {
		res, err := http.DefaultClient.Do(assistantFrom(p.public, "acme-docs", key, ip))
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		return res
	}
	// Warm up the scripts on every master, then count one admitted request's calls.
	for _, ip := range []string{"203.0.113.1", "203.0.113.2", "203.0.113.3"} {
		ask(a, ip)
	}
	other := "203.0.113.9"
	nodes := map[string]bool{master("gw:assistant_per_key:month:{" + digest + "}"): true, master(orgKey): true, master("gw:assistant_per_ip:day:{" + other + "}"): true}
	calls := func() int {
		n := 0
		for _, s := range cl.Servers {
			n += redistest.ScriptCalls(t, s.Client(t))
		}
		return n
	}
	before := calls()
	if res := ask(a, other); res.StatusCode != 201 {
		t.Fatalf("assistant request: %d", res.StatusCode)
	}
	if n := calls() - before; n != len(nodes) {
		t.Fatalf("%d script calls for one request touching %d masters, want one per master", n, len(nodes))
	}
	// Blocked on its IP's master: refused, and its org and key counters elsewhere stay put.
	mustStatus(t, quotaAPI(t, a, "", "PUT", "/quota/overrides/assistant_per_ip/"+ip, `{"limit":0,"ttl":"5s","reason":"scraper"}`), 200)
	time.Sleep(time.Second)
	orgBefore := orgUsed(t, b, "acme-docs")
	res := ask(b, ip)
	retry, _ := strconv.Atoi(res.Header.Get("Retry-After"))
	if res.StatusCode != 429 || retry < 1 || retry > 4 || !strings.Contains(res.Header.Get("RateLimit"), `"assistant_per_ip";r=0;t=`) {
		t.Fatalf("blocked IP: %d Retry-After %d %v", res.StatusCode, retry, res.Header)
	}
	if got := orgUsed(t, b, "acme-docs"); got != orgBefore {
		t.Fatalf("the org's counter moved from %d to %d for a request its IP was refused", orgBefore, got)
	}
	if e := auditOf(t, b); len(e) != 3 || e[0].ID != ip || e[1].ID != pB || e[2].ID != pA {
		t.Fatalf("audit on the cluster: %+v", e)
	}
}

func orgUsed(t *testing.T, p *proc, org string) int64 {
	t.Helper()
	var out struct{ Limits []struct{ Used int64 } }
	a := mustStatus(t, quotaAPI(t, p, "", "GET", "/usage/orgs/"+org, ""), 200)
	if err := json.Unmarshal([]byte(a.body), &out); err != nil || len(out.Limits) == 0 {
		t.Fatalf("usage of org %s: %s", org, a.body)
	}
	return out.Limits[0].Used
}
