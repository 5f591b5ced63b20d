package main

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docsgate/gateway/internal/redistest"
)

// historyWindow is the window of the history tests' limits: the "window: 3s" the issue
// checks with.
const historyWindow = 3 * time.Second

// historyConfig keeps 2 ended windows of a requests limit by project, a requests limit by
// org (acme on plan gold, which keeps 1) and a tokens limit by org.
var historyConfig = fmt.Sprintf(`
admin_token: %q
orgs:
  acme: {domains: [acme-docs], plan: gold}
  globex: [globex-docs]
plans:
  gold:
    assistant_per_org: {limit: 40, history: 1}
limits:
  agent_job_per_project: {limit: 100, window: 3s, history: 2}
  assistant_per_org: {limit: 10, window: 3s, history: 2}
  assistant_tokens_per_org: {limit: 100000, window: 3s, by: org, unit: tokens, history: 2}
routes:
  - name: agent_job
  - name: assistant_message
    limits: [assistant_per_org, assistant_tokens_per_org]
`, adminToken)

// windowStartAfter waits until 200 ms into the next 3 s window (epoch-aligned, as the limits
// count) and returns its start.
func windowStartAfter(t *testing.T, prev time.Time) time.Time {
	t.Helper()
	now := time.Now()
	s := now.Unix() - now.Unix()%3
	ws := time.Unix(s, 0)
	if !ws.After(prev) {
		ws = ws.Add(historyWindow)
	} else if now.Sub(ws) > time.Second {
		ws = ws.Add(historyWindow)
	}
	time.Sleep(time.Until(ws.Add(200 * time.Millisecond)))
	return ws.UTC()
}

// inWindow fails the test when the machine was too slow to finish a phase inside its window.
func inWindow(t *testing.T, ws time.Time) {
	t.Helper()
	if time.Now().After(ws.Add(historyWindow - 100*time.Millisecond)) {
		t.Fatalf("a phase of the test overran its 3 s window (started %s): the machine is too loaded", ws)
	}
}

// historyT is an answer of GET /usage/history (the CLI reads the same shape).
type historyT = historyAnswer

func historyOf(t *testing.T, p *proc, limit, id string) historyT {
	t.Helper()
	return historyIn(t, p, limit, id, "")
}

// checkHistory compares a history with the uses wanted, newest (current) window first.
func checkHistory(t *testing.T, h historyT, unit string, limit int64, cur time.Time, used ...int64) {
	t.Helper()
	if h.Unit != unit || len(h.Windows) != len(used) {
		t.Fatalf("history %s of %s: unit %q, %d windows (want %s, %d): %+v", h.Limit, h.ID, h.Unit, len(h.Windows), unit, len(used), h)
	}
	for i, w := range h.Windows {
		start := cur.Add(-time.Duration(i) * historyWindow)
		if !w.Start.Equal(start) || !w.End.Equal(start.Add(historyWindow)) || w.Used != used[i] || w.Limit != limit {
			t.Errorf("history %s of %s, window %d: %+v, want start %s used %d limit %d", h.Limit, h.ID, i, w, start, used[i], limit)
		}
	}
}

// readAnswer is one answer of the admin API (adminRead).
type readAnswer struct {
	path   string
	code   int
	header http.Header
	body   string
	err    error
}

// history decodes an answer of GET /usage/history.
func (a readAnswer) history(t *testing.T) historyT {
	t.Helper()
	if a.err != nil || a.code != 200 {
		t.Fatalf("GET %s: %d %s %v", a.path, a.code, a.body, a.err)
	}
	var h historyT
	if err := json.Unmarshal([]byte(a.body), &h); err != nil {
		t.Fatalf("GET %s: %v in %s", a.path, err, a.body)
	}
	return h
}

// adminGets sends every GET to the admin API at once, but the exports one after another (a
// replica runs at most two and refuses a third; one that has answered may not have released its
// place yet), and returns the answers in order.
func adminGets(p *proc, token string, paths ...string) []readAnswer {
	out := make([]readAnswer, len(paths))
	exports := make(chan struct{}, 1)
	var wg sync.WaitGroup
	for i, path := range paths {
		wg.Go(func() {
			if strings.HasPrefix(path, "/usage/export") {
				exports <- struct{}{}
				defer func() { <-exports }()
			}
			out[i] = adminRead(p, token, path)
		})
	}
	wg.Wait()
	return out
}

// historyPath is the admin API's path of one tenant's history.
func historyPath(limit, id string) string {
	return "/usage/history?" + url.Values{"limit": {limit}, "id": {id}}.Encode()
}

// adminRead sends one GET to the admin API with token; a failed request is the answer's err.
func adminRead(p *proc, token, path string) readAnswer {
	a := readAnswer{path: path}
	req, _ := http.NewRequest("GET", "http://"+p.admin+path, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		a.err = err
		return a
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	a.code, a.header, a.body, a.err = res.StatusCode, res.Header, string(body), err
	return a
}

// exportOf gets /usage/export and returns its status, headers and body.
func exportOf(t *testing.T, p *proc, query string) (int, http.Header, string) {
	t.Helper()
	a := adminRead(p, adminToken, "/usage/export?"+query)
	if a.err != nil {
		t.Fatal(a.err)
	}
	return a.code, a.header, a.body
}

// Usage driven to known numbers in consecutive 3 s windows, then /usage/history and
// /usage/export compared exactly; windows past history are gone; every refusal.
func TestUsageHistoryAndExport(t *testing.T) {
	t.Parallel()
	up := tokenUpstream(t)
	for _, st := range everyStore() {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel() // each store its own servers and gateway; the windows are waited out together
			p := startGateway(t, up, st.start(t)+historyConfig)
			jobs := func(project string, n int) {
				t.Helper()
				for range n {
					if res := send(t, p, "POST", "/v2/agent/"+project+"/job", "svc_a", `{"prompt":"x"}`); res.StatusCode != 201 {
						t.Fatalf("job %s: %d", project, res.StatusCode)
					}
				}
			}
			asks := func(org string, n int) { // 30 tokens each
				t.Helper()
				for range n {
					res := send(t, p, "POST", "/discovery/v1/assistant/"+org+"-docs/message", "svc_dsc_k", `{"fp":"u-10-20-1-full","messages":[]}`)
					if res.StatusCode != 200 {
						t.Fatalf("ask %s: %d", org, res.StatusCode)
					}
				}
			}
			settle := func(ws time.Time) { // the token debits land after the answers
				t.Helper()
				time.Sleep(300 * time.Millisecond)
				inWindow(t, ws)
			}
			w0 := windowStartAfter(t, time.Time{})
			jobs("p1", 3)
			jobs("p2", 1)
			asks("acme", 2)
			settle(w0)
			w1 := windowStartAfter(t, w0)
			jobs("p1", 2)
			jobs("p3", 4)
			jobs("p.z", 1)
			asks("acme", 1)
			asks("globex", 3)
			settle(w1)
			w2 := windowStartAfter(t, w1)
			jobs("p1", 1)
			settle(w2)
			w3 := windowStartAfter(t, w2)
			jobs("p2", 5)

			// Every read whose answer depends on w3 being the current window is sent at once,
			// so that the phase lasts about one request however busy the machine; the answers
			// are compared after the window is known not to have ended under them.
			w1q := url.QueryEscape(w1.Format(time.RFC3339))
			rs := adminGets(p, adminToken,
				historyPath("agent_job_per_project", "p1"),
				historyPath("agent_job_per_project", "p2"),
				historyPath("agent_job_per_project", "never"),
				historyPath("assistant_per_org", "acme"),
				historyPath("assistant_per_org", "globex"),
				historyPath("assistant_tokens_per_org", "globex"),
				"/usage/export?limit=agent_job_per_project&window="+w1q,
				"/usage/export?limit=agent_job_per_project&window=previous",
				"/usage/export?limit=agent_job_per_project&window=current",
				"/usage/export?limit=assistant_per_org&window="+w1q,
				"/usage/export?limit=assistant_tokens_per_org&window="+w1q+"&format=json",
				"/usage/export?limit=agent_job_per_project&window="+url.QueryEscape(w0.Format(time.RFC3339)),
				"/usage/export?limit=agent_job_per_project&window="+url.QueryEscape(w3.Add(historyWindow).Format(time.RFC3339)),
			)
			inWindow(t, w3)

			// history: 2 keeps the current window and two ended ones: w0 is gone.
			checkHistory(t, rs[0].history(t), "requests", 100, w3, 0, 1, 2)
			checkHistory(t, rs[1].history(t), "requests", 100, w3, 5, 0, 0)
			checkHistory(t, rs[2].history(t), "requests", 100, w3, 0, 0, 0)
			// acme's plan keeps one ended window: w1 is past it.
			checkHistory(t, rs[3].history(t), "requests", 40, w3, 0, 0)
			checkHistory(t, rs[4].history(t), "requests", 10, w3, 0, 0, 3)
			checkHistory(t, rs[5].history(t), "tokens", 100000, w3, 0, 0, 90)

			// An export of a past window, byte for byte, by its start and as "previous".
			want := "id,used,limit,plan,label,org\np.z,1,100,,,\np1,2,100,,,\np3,4,100,,,\n"
			if r := rs[6]; r.code != 200 || r.body != want {
				t.Fatalf("export of w1: %d %q, want %q", r.code, r.body, want)
			}
			if ct := rs[6].header.Get("Content-Type"); ct != "text/csv" {
				t.Errorf("Content-Type %q", ct)
			}
			wantCD := fmt.Sprintf(`attachment; filename="usage-agent_job_per_project-%s.csv"`, w1.Format("20060102T150405Z"))
			if cd := rs[6].header.Get("Content-Disposition"); cd != wantCD {
				t.Errorf("Content-Disposition %q, want %q", cd, wantCD)
			}
			if r := rs[7]; r.code != 200 || r.body != "id,used,limit,plan,label,org\np1,1,100,,,\n" {
				t.Errorf("export of the previous window: %d %q", r.code, r.body)
			}
			if r := rs[8]; r.code != 200 || r.body != "id,used,limit,plan,label,org\np2,5,100,,,\n" {
				t.Errorf("export of the current window: %d %q", r.code, r.body)
			}
			// Parsed by a real CSV reader: the plan column of a tenant on a plan.
			recs, err := csv.NewReader(strings.NewReader(rs[9].body)).ReadAll()
			// acme (gold keeps one ended window) is not listed for w1.
			wantRecs := [][]string{{"id", "used", "limit", "plan", "label", "org"}, {"globex", "3", "10", "", "", ""}}
			if rs[9].code != 200 || err != nil || fmt.Sprint(recs) != fmt.Sprint(wantRecs) {
				t.Errorf("export of assistant_per_org's w1: %d %v %q", rs[9].code, err, rs[9].body)
			}
			wantJSON := fmt.Sprintf(`{"limit":"assistant_tokens_per_org","unit":"tokens","start":%q,"end":%q,"tenants":[`+
				`{"id":"acme","used":30,"limit":100000,"plan":"gold","label":"","org":""},`+
				`{"id":"globex","used":90,"limit":100000,"plan":"","label":"","org":""}]}`+"\n",
				w1.Format(time.RFC3339), w1.Add(historyWindow).Format(time.RFC3339))
			if r := rs[10]; r.code != 200 || r.body != wantJSON || !strings.HasPrefix(r.header.Get("Content-Type"), "application/json") {
				t.Errorf("export of assistant_tokens_per_org's w1 as JSON: %d %s %q\nwant %q", r.code, r.header.Get("Content-Type"), r.body, wantJSON)
			}
			// A window past history and one not begun.
			for _, r := range rs[11:13] {
				if r.code != 404 || !strings.Contains(r.body, `"code":"unknown_window"`) {
					t.Errorf("export %s: %d %s, want 404 unknown_window", r.path, r.code, r.body)
				}
			}

			// Refusals.
			refusals := []struct {
				query string
				code  int
				err   string
			}{
				{"limit=agent_job_per_project&window=" + url.QueryEscape(w1.Add(time.Second).Format(time.RFC3339)), 400, "invalid_request"},
				{"limit=agent_job_per_project&window=yesterday", 400, "invalid_request"},
				{"limit=agent_job_per_project", 400, "invalid_request"},
				{"limit=agent_job_per_project&window=current&format=xml", 400, "invalid_request"},
				{"limit=agent_job_per_project&window=current&window=previous", 400, "invalid_request"},
				{"limit=nope&window=current", 404, "unknown_limit"},
				{"window=current", 400, "invalid_request"},
			}
			for _, r := range refusals {
				code, _, body := exportOf(t, p, r.query)
				if code != r.code || !strings.Contains(body, `"code":"`+r.err+`"`) {
					t.Errorf("export %s: %d %s, want %d %s", r.query, code, body, r.code, r.err)
				}
			}
			for _, r := range []struct {
				query string
				code  int
				err   string
			}{
				{"limit=nope&id=p1", 404, "unknown_limit"},
				{"limit=agent_job_per_project&id=" + url.QueryEscape("a b"), 400, "invalid_request"},
				{"limit=agent_job_per_project&id=" + strings.Repeat("x", 129), 400, "invalid_request"},
				{"limit=agent_job_per_project", 400, "invalid_request"},
				{"id=p1", 400, "invalid_request"},
			} {
				code, body := adminGet(t, p, "/usage/history?"+r.query, adminToken)
				if code != r.code || !strings.Contains(body, `"code":"`+r.err+`"`) {
					t.Errorf("history %s: %d %s, want %d %s", r.query, code, body, r.code, r.err)
				}
			}
			// Behind admin_token, like every read but the probes.
			if code, _ := adminGet(t, p, "/usage/history?limit=agent_job_per_project&id=p1", ""); code != 401 {
				t.Errorf("history without the token: %d", code)
			}
			if code, _ := adminGet(t, p, "/usage/export?limit=agent_job_per_project&window=current", ""); code != 401 {
				t.Errorf("export without the token: %d", code)
			}
		})
	}
}

// The request path gets no extra command: across window ends (where the ended window's count
// is kept), MONITOR sees exactly one script call per limited request and nothing else.
func TestUsageHistoryCostsNothingOnRequestPath(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	// redis.timeout 2s: exact counts are checked, not the timeout (exactTimeout).
	p := startGateway(t, tokenUpstream(t), fmt.Sprintf("redis: {addrs: [%q], timeout: 2s}\n%s", srv.Addr, historyConfig))
	send(t, p, "POST", "/v2/agent/warm/job", "svc_a", `{"prompt":"x"}`) // preload, connections

	lines, stop := watchMonitor(t, srv.Addr)

	var ws time.Time
	const perWindow = 5
	for range 3 {
		ws = windowStartAfter(t, ws)
		for i := range perWindow {
			if res := send(t, p, "POST", fmt.Sprintf("/v2/agent/p%d/job", i), "svc_a", `{"prompt":"x"}`); res.StatusCode != 201 {
				t.Fatalf("job: %d", res.StatusCode)
			}
		}
		inWindow(t, ws)
	}
	time.Sleep(300 * time.Millisecond)
	stop()
	var scripts, other []string
	var kept int
	for l := range lines {
		switch monitorKind(l) {
		case monitorInner:
			if strings.Contains(strings.ToLower(l), `"hdel"`) {
				kept++ // a window ended: its count was moved aside
			}
		case monitorScript:
			scripts = append(scripts, l)
		case monitorOther:
			other = append(other, l)
		}
	}
	if len(scripts) != 3*perWindow || len(other) != 0 {
		t.Fatalf("MONITOR saw %d script calls (want %d) and other commands: %v", len(scripts), 3*perWindow, other)
	}
	if kept != 2*perWindow {
		t.Errorf("MONITOR saw %d window ends handled inside the script, want %d", kept, 2*perWindow)
	}
	h := historyOf(t, p, "agent_job_per_project", "p0")
	checkHistory(t, h, "requests", 100, ws, 1, 1, 1)
}

// Limits by key in registry mode: the export names each key by its digest with its plan,
// label and org (a label with a comma and quotes quoted as CSV does), and a monthly limit keeps
// 13 ended months by default.
func TestUsageExportOfRegisteredKeys(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	up := tokenUpstream(t)
	// redis.timeout 2s: exact counts are checked, not the timeout (exactTimeout).
	cfg := fmt.Sprintf(`admin_token: %q
redis: {addrs: [%q], timeout: 2s}
auth: {mode: registry}
orgs:
  acme: {domains: [acme-docs], plan: gold}
  globex: [globex-docs]
plans:
  gold:
    assistant_per_key: {limit: 500}
`, adminToken, srv.Addr)
	p := startGateway(t, up, cfg)
	cfgFile := writeConfig(t, fmt.Sprintf("upstream: {url: %q}\n%s", up, cfg))
	const keyA, keyB = "svc_dsc_historyacme0123456789abcdef", "svc_dsc_historyglobex0123456789abcd"
	digestA := keysCLI(t, keyA+"\n", "add", "-config", cfgFile, "--kind", "assistant", "--org", "acme", "--domain", "acme-docs", "--label", `billing, "bot"`)
	digestB := keysCLI(t, keyB+"\n", "add", "-config", cfgFile, "--kind", "assistant", "--org", "globex", "--domain", "globex-docs")
	ask := func(org, key string, n int) {
		for range n {
			if res := send(t, p, "POST", "/discovery/v1/assistant/"+org+"-docs/message", key, `{"fp":"plain","messages":[]}`); res.StatusCode != 200 {
				t.Fatalf("ask %s: %d", org, res.StatusCode)
			}
		}
	}
	ask("acme", keyA, 3)
	ask("globex", keyB, 2)

	code, _, body := exportOf(t, p, "limit=assistant_per_key&window=current")
	rows := map[string][]string{
		digestA: {digestA, "3", "500", "gold", `billing, "bot"`, "acme"},
		digestB: {digestB, "2", "10000", "", "", "globex"},
	}
	want := [][]string{{"id", "used", "limit", "plan", "label", "org"}}
	for _, d := range []string{min(digestA, digestB), max(digestA, digestB)} {
		want = append(want, rows[d])
	}
	recs, err := csv.NewReader(strings.NewReader(body)).ReadAll()
	if code != 200 || err != nil || fmt.Sprint(recs) != fmt.Sprint(want) {
		t.Fatalf("export: %d %v\n%s\nwant %q", code, err, body, want)
	}
	if !strings.Contains(body, `,"billing, ""bot""",acme`) {
		t.Errorf("the label is not quoted as CSV: %s", body)
	}
	h := historyOf(t, p, "assistant_per_key", digestA)
	if len(h.Windows) != 14 || h.Windows[0].Used != 3 || h.Windows[0].Limit != 500 || h.Windows[1].Start.AddDate(0, 1, 0) != h.Windows[0].Start ||
		h.Windows[0].Start.Day() != 1 || h.Windows[13].Start.AddDate(0, 13, 0) != h.Windows[0].Start {
		t.Errorf("history of a key's monthly limit: %+v", h)
	}
	if code, body := adminGet(t, p, "/usage/history?limit=assistant_per_key&id=not-a-digest", adminToken); code != 400 || !strings.Contains(body, `"invalid_request"`) {
		t.Errorf("history of a bad digest: %d %s", code, body)
	}
}

// With Redis down, history and exports answer 503 limiter_unavailable with Retry-After, like
// every admin read; the refusals that need no store still come first.
func TestUsageHistoryRedisDown(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	p := startGateway(t, tokenUpstream(t), fmt.Sprintf("redis: {addrs: [%q]}\n%s", srv.Addr, historyConfig))
	srv.Stop(t)
	for _, path := range []string{
		"/usage/history?limit=agent_job_per_project&id=p1",
		"/usage/export?limit=agent_job_per_project&window=previous",
		"/usage/export?limit=agent_job_per_project&window=current&format=json",
	} {
		req, _ := http.NewRequest("GET", "http://"+p.admin+path, nil)
		req.Header.Set("Authorization", "Bearer "+adminToken)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 503 || res.Header.Get("Retry-After") != "1" || !strings.Contains(string(body), `"code":"limiter_unavailable"`) {
			t.Errorf("%s with Redis down: %d %v %s", path, res.StatusCode, res.Header, body)
		}
	}
	if code, body := adminGet(t, p, "/usage/export?limit=agent_job_per_project&window=sometime", adminToken); code != 400 || !strings.Contains(body, `"invalid_request"`) {
		t.Errorf("a bad window with Redis down: %d %s", code, body)
	}
}
