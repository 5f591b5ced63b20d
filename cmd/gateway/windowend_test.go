package main

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"
)

// A window's end, as billing meets it: a tenant's count of the window that just ended stays in
// /usage/history and /usage/export whatever comes before its next request (a reset, a grant,
// an override), and a unit refunded after the end (the upstream refused the key) comes off that
// window's count. Windows of 3 s, on the in-process store and on two replicas sharing Redis or
// a Redis Cluster.

// windowEndConfig keeps 3 ended windows of agent_job_per_project, 3 s each.
const windowEndConfig = "admin_token: " + adminToken + `
limits:
  agent_job_per_project: {limit: 100, window: 3s, history: 3}
`

// usedInWindow is a history's count of the window starting at ws; the window must be listed.
func usedInWindow(t *testing.T, h historyT, ws time.Time) int64 {
	t.Helper()
	for _, w := range h.Windows {
		if w.Start.Equal(ws) {
			return w.Used
		}
	}
	t.Fatalf("history %s of %s lists no window starting %s: %+v", h.Limit, h.ID, ws, h)
	return 0
}

// exportOfWindow is the CSV export of limit's window starting at ws.
func exportOfWindow(t *testing.T, p *proc, limit string, ws time.Time) string {
	t.Helper()
	code, _, body := exportOf(t, p, "limit="+limit+"&window="+url.QueryEscape(ws.Format(time.RFC3339)))
	if code != 200 {
		t.Fatalf("export of %s: %d %s", ws, code, body)
	}
	return body
}

// adminAction sends a quota action with adminToken and requires the status want.
func adminAction(t *testing.T, p *proc, method, path, body string, want int) {
	t.Helper()
	a := adminCall(t, http.DefaultClient, "http://"+p.admin, method, path,
		map[string]string{"Authorization": "Bearer " + adminToken, "Content-Type": "application/json"}, body)
	if a.status != want {
		t.Fatalf("%s %s: %d %s, want %d", method, path, a.status, a.body, want)
	}
}

// Five jobs of each of three projects in window w0; once w1 has begun, and before any of them
// sends its next job, one replica resets the first project, grants the second 2 more and
// overrides the third to 7. The ended window keeps its 5 for each (history, export by start and
// as "previous"), the current one shows none used, and the next job counts 1 in w1.
func TestQuotaActionsAfterWindowEnd(t *testing.T) {
	t.Parallel()
	up := tokenUpstream(t)
	for _, st := range holdStores() {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel() // each store its own servers, gateways and upstream; the windows are waited out together
			cfg := st.redis(t) + windowEndConfig
			gws := []*proc{startGateway(t, up, cfg)}
			if st.replicas > 1 {
				gws = append(gws, startGateway(t, up, cfg))
			}
			a, b := gws[0], gws[len(gws)-1]
			projects := []string{"p-reset", "p-grant", "p-override"}
			w0 := windowStartAfter(t, time.Time{})
			for _, project := range projects {
				if c := jobs(t, a, project, 5); c[201] != 5 {
					t.Fatalf("jobs of %s in w0: %v", project, c)
				}
			}
			inWindow(t, w0)
			w1 := windowStartAfter(t, w0)
			adminAction(t, b, "POST", "/quota/resets", `{"limit":"agent_job_per_project","id":"p-reset","reason":"client bug"}`, 200)
			adminAction(t, b, "POST", "/quota/grants", `{"limit":"agent_job_per_project","id":"p-grant","amount":2,"reason":"launch"}`, 201)
			adminAction(t, b, "PUT", "/quota/overrides/agent_job_per_project/p-override", `{"limit":7,"ttl":"1h","reason":"incident"}`, 200)

			for _, project := range projects {
				h := historyOf(t, a, "agent_job_per_project", project)
				if n := usedInWindow(t, h, w0); n != 5 {
					t.Errorf("%s: /usage/history shows %d for the ended window after the action, want 5", project, n)
				}
				if n := usedInWindow(t, h, w1); n != 0 {
					t.Errorf("%s: /usage/history shows %d for the current window, want 0", project, n)
				}
			}
			want := "id,used,limit,plan,label,org\np-grant,5,100,,,\np-override,5,100,,,\np-reset,5,100,,,\n"
			if got := exportOfWindow(t, a, "agent_job_per_project", w0); got != want {
				t.Errorf("export of the ended window: %q, want %q", got, want)
			}
			if time.Now().Before(w1.Add(historyWindow - 200*time.Millisecond)) {
				if code, _, got := exportOf(t, a, "limit=agent_job_per_project&window=previous"); code != 200 || got != want {
					t.Errorf("export of the previous window: %d %q, want %q", code, got, want)
				}
			}
			for _, project := range projects {
				if c := jobs(t, a, project, 1); c[201] != 1 {
					t.Fatalf("the next job of %s: %v", project, c)
				}
				h := historyOf(t, b, "agent_job_per_project", project)
				if n := usedInWindow(t, h, w0); n != 5 {
					t.Errorf("%s: /usage/history shows %d for w0 after the next job, want 5", project, n)
				}
				var since int64 // the next job's window: w1, or a later one on a slow machine
				for _, w := range h.Windows {
					if w.Start.After(w0) {
						since += w.Used
					}
				}
				if since != 1 {
					t.Errorf("%s: the windows since w0 show %d used after the next job, want 1", project, since)
				}
			}
		})
	}
}

// heldUpstream answers jobs with 201, but a job sent with key refused waits until release is
// closed and then gets 401 (the platform refusing the key): an answer that comes after the
// window it was counted in has ended. arrived receives once per refused request, when it
// reaches the upstream.
func heldUpstream(t *testing.T, refused string) (url string, arrived <-chan struct{}, release func()) {
	in := make(chan struct{}, 8)
	gate := make(chan struct{})
	var once sync.Once
	url = serveHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ") == refused {
			in <- struct{}{}
			<-gate
			w.WriteHeader(401)
			_, _ = w.Write([]byte(`{"error":"Invalid API key."}`))
			return
		}
		w.WriteHeader(201)
		_, _ = w.Write([]byte(`{"id":"j"}`))
	}))
	release = func() { once.Do(func() { close(gate) }) }
	t.Cleanup(release)
	return url, in, release
}

// Three jobs of a project in w0 and a fourth whose key the upstream refuses, answered only
// after w0 ended and the project's next job (on the other replica) moved w0's count (4) into
// history: the refund of the fourth takes it off w0 (history and export show 3), and leaves
// w1's job counted.
func TestRefundAfterWindowEnd(t *testing.T) {
	t.Parallel()
	const refused = "svc_inventedSECRET"
	for _, st := range holdStores() {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel() // each store its own servers, gateways and upstream; the windows are waited out together
			up, arrived, release := heldUpstream(t, refused)
			cfg := st.redis(t) + windowEndConfig
			gws := []*proc{startGateway(t, up, cfg)}
			if st.replicas > 1 {
				gws = append(gws, startGateway(t, up, cfg))
			}
			a, b := gws[0], gws[len(gws)-1]
			w0 := windowStartAfter(t, time.Time{})
			if c := jobs(t, a, "p1", 3); c[201] != 3 {
				t.Fatalf("jobs in w0: %v", c)
			}
			late := make(chan int, 1)
			go func() {
				res, err := http.DefaultClient.Do(jobRequest(a, "p1", refused))
				if err != nil {
					late <- 0
					return
				}
				res.Body.Close()
				late <- res.StatusCode
			}()
			select {
			case <-arrived:
			case <-time.After(5 * time.Second):
				t.Fatal("the refused job never reached the upstream")
			}
			inWindow(t, w0)
			w1 := windowStartAfter(t, w0)
			if c := jobs(t, b, "p1", 1); c[201] != 1 {
				t.Fatalf("the job in w1: %v", c)
			}
			if n := usedInWindow(t, historyOf(t, b, "agent_job_per_project", "p1"), w0); n != 4 {
				t.Fatalf("before the refund, w0 shows %d, want 4 (3 jobs and the one in flight)", n)
			}
			release()
			if code := <-late; code != 401 {
				t.Fatalf("the refused job: %d, want the upstream's 401", code)
			}
			waitMetric(t, a, `gateway_ratelimit_refunds_total{limit="agent_job_per_project",reason="upstream_401"}`, 10*time.Second,
				func(v float64) bool { return v == 1 })
			h := historyOf(t, b, "agent_job_per_project", "p1")
			if n := usedInWindow(t, h, w0); n != 3 {
				t.Errorf("after the refund, /usage/history shows %d for w0, want 3", n)
			}
			if n := usedInWindow(t, h, w1); n != 1 {
				t.Errorf("after the refund, /usage/history shows %d for w1, want 1 (the refund is w0's)", n)
			}
			if got, want := exportOfWindow(t, b, "agent_job_per_project", w0), "id,used,limit,plan,label,org\np1,3,100,,,\n"; got != want {
				t.Errorf("export of w0 after the refund: %q, want %q", got, want)
			}
		})
	}
}

// jobRequest is one agent job of project on p with key.
func jobRequest(p *proc, project, key string) *http.Request {
	req, _ := http.NewRequest("POST", "http://"+p.public+"/v2/agent/"+project+"/job", strings.NewReader(`{"prompt":"x"}`))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	return req
}

// billingConfig has two tokens limits on the assistant route, 3 s windows standing in for
// months: one by org with a reserve, one by ip without (debited after the answer).
const billingConfig = `orgs: {acme: [acme-docs]}
limits:
  assistant_tokens_per_org: {limit: 500, window: 3s, by: org, unit: tokens, reserve: 100, history: 3}
  assistant_tokens_per_ip: {limit: 100000, window: 3s, by: ip, unit: tokens, history: 3}
routes:
  - name: assistant_message
    limits: [assistant_per_key, assistant_per_org, assistant_per_ip, assistant_tokens_per_org, assistant_tokens_per_ip]
`

// An answer admitted in one window and ended in the next is billed to the window it ends in,
// and its hold counts in both: in process and on two replicas sharing Redis or a Cluster. In w0
// an answer of 100 tokens ends and answer X is admitted (holding 100 of the org's 500), kept
// waiting by the upstream. In w1 the org shows 0 used and X's 100 held, and of 5 more requests
// exactly 4 are admitted (used + holds = 500). The test then lets X (70 tokens) and the 4 (100
// each) end in w1: with a reserve and without, /usage/history and /usage/export show w0 100 (X
// not in it) and w1 470 (X in it).
func TestAnswerAcrossWindowEnd(t *testing.T) {
	t.Parallel()
	const org, ip = "assistant_tokens_per_org", "assistant_tokens_per_ip"
	for _, st := range holdStores() {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel() // each store its own servers, gateways and upstream; the windows are waited out together
			up := newGatedUpstream(t)
			ps := startReplicas(t, up.url, st, billingConfig)
			first, last := ps[:1], ps[len(ps)-1]
			w0 := windowStartAfter(t, time.Time{})
			if rs, done := startStreams(t, first, 1, "t-40-60"); rs[0].status == 200 {
				up.open()
				done.Wait()
			} else {
				t.Fatalf("the answer in w0: %+v", rs[0])
			}
			waitUsage(t, last, org, 100, 0, 2*time.Second)
			rs, x := startStreams(t, first, 1, "t-30-40")
			if rs[0].status != 200 {
				t.Fatalf("X in w0: %+v", rs[0])
			}
			if u := acmeUsage(t, last, org); u.Used != 100 || u.Reserved != 100 || u.Remaining != 300 {
				t.Fatalf("w0 with X in flight: %+v, want 100 used and 100 held", u)
			}
			inWindow(t, w0)

			w1 := windowStartAfter(t, w0)
			if u := acmeUsage(t, last, org); u.Used != 0 || u.Reserved != 100 || u.Remaining != 400 {
				t.Fatalf("w1 with X in flight: %+v, want 0 used and X's 100 held", u)
			}
			rs, more := startStreams(t, ps, 5, "t-40-60")
			if countStatus(rs, 200) != 4 {
				t.Fatalf("w1 admitted %d of 5 beside X's hold, want 4: %+v", countStatus(rs, 200), rs)
			}
			for _, r := range rs {
				if r.status != 200 && (r.status != 429 || r.limit != org || r.retryAfter != "1") {
					t.Fatalf("w1: a denial %+v, want 429 naming %s with Retry-After 1", r, org)
				}
			}
			if u := acmeUsage(t, last, org); u.Used != 0 || u.Reserved != 500 || u.Remaining != 0 {
				t.Fatalf("w1 with 5 answers in flight: %+v, want 500 held", u)
			}
			up.open()
			x.Wait()
			more.Wait()
			settledUsage(t, last, "acme") // and the debits, which land with the settles
			inWindow(t, w1)

			for _, c := range []struct{ limit, id, row string }{{org, "acme", "acme,%d,500,,,\n"}, {ip, "127.0.0.1", "127.0.0.1,%d,100000,,,\n"}} {
				h := historyOf(t, last, c.limit, c.id)
				if n0, n1 := usedInWindow(t, h, w0), usedInWindow(t, h, w1); n0 != 100 || n1 != 470 {
					t.Errorf("%s: /usage/history shows w0 %d and w1 %d, want 100 and 470 (X's 70 in w1)", c.limit, n0, n1)
				}
				for ws, n := range map[time.Time]int{w0: 100, w1: 470} {
					if got, want := exportOfWindow(t, last, c.limit, ws), "id,used,limit,plan,label,org\n"+fmt.Sprintf(c.row, n); got != want {
						t.Errorf("%s: export of the window starting %s: %q, want %q", c.limit, ws, got, want)
					}
				}
			}
		})
	}
}
