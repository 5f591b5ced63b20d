package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// What usage history says about a tenant's windows (issue 45, "numbers that must say what the
// counters say"): the windows it was counted in, the allowance in force with its grants, and
// one rule for the limit of counts kept in a unit the limit no longer counts.

// A limit configured minutes ago keeps 48 hourly windows in which nothing was counted:
// `gateway usage history` lists the current window and says the 48 are empty (it does not
// print 48 rows of today's limit), and shows the allowance in force right after a grant of
// 2 (7: 5 and +2), then with an override of 4 (6: 4 and +2), as /usage and the audit do. The
// admin API's current window carries the same allowance, grants and override.
func TestHistoryShowsWhatWasCounted(t *testing.T) {
	t.Parallel()
	if left := time.Until(time.Now().Truncate(time.Hour).Add(time.Hour)); left < time.Minute {
		time.Sleep(left + time.Second) // the whole test in one hourly window
	}
	p := startGateway(t, tokenUpstream(t), "admin_token: "+adminToken+"\nlimits:\n  agent_job_per_project: {limit: 5, window: hour}\n")
	for range 3 {
		if res := send(t, p, "POST", "/v2/agent/p1/job", "svc_a", `{"prompt":"x"}`); res.StatusCode != 201 {
			t.Fatalf("job: %d", res.StatusCode)
		}
	}
	env := []string{"GATEWAY_ADMIN_URL=http://" + p.admin, "GATEWAY_ADMIN_TOKEN=" + adminToken}
	cli := func(args ...string) string {
		t.Helper()
		code, out, errOut := cliRun(t, env, "", args...)
		if code != 0 {
			t.Fatalf("gateway %v: exit %d: %s", args, code, errOut)
		}
		return out
	}
	cli("quota", "grant", "--limit", "agent_job_per_project", "--id", "p1", "--amount", "2", "--reason", "launch")
	history := []string{"usage", "history", "--limit", "agent_job_per_project", "--id", "p1"}
	hour := time.Now().UTC().Truncate(time.Hour)
	want := []string{
		"agent_job_per_project p1 (requests)",
		"allowance now: 7 (limit 5, +2 granted)",
		"START END USED",
		hour.Format(time.RFC3339) + " " + hour.Add(time.Hour).Format(time.RFC3339) + " 3 current",
		"nothing counted in the 48 ended windows kept",
		"",
	}
	out := cli(history...)
	lines := strings.Split(out, "\n")
	for i := range lines {
		lines[i] = strings.Join(strings.Fields(lines[i]), " ") // the table's columns, without their padding
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Fatalf("gateway usage history:\n%s\nwant (columns padded):\n%s", out, strings.Join(want, "\n"))
	}
	if u := orgUsageOf(t, p, "/usage/projects/p1", "agent_job_per_project"); u.Limit != 7 || u.Used != 3 {
		t.Fatalf("/usage says %+v, want 3 of 7", u)
	}
	var h historyNow
	if err := json.Unmarshal([]byte(cli(append(history, "-json")...)), &h); err != nil {
		t.Fatal(err)
	}
	cur := h.Windows[0]
	if len(h.Windows) != 49 || cur.Used != 3 || cur.Limit != 5 || cur.Allowance == nil || *cur.Allowance != 7 || cur.Granted != 2 || cur.Override != nil {
		t.Fatalf("history -json: %d windows, current %+v", len(h.Windows), cur)
	}
	for _, w := range h.Windows[1:] {
		if w.Used != 0 || w.Allowance != nil || w.Granted != 0 || w.Override != nil {
			t.Fatalf("an ended window with run-time quota: %+v", w)
		}
	}

	cli("quota", "override", "--limit", "agent_job_per_project", "--id", "p1", "--value", "4", "--ttl", "1h", "--reason", "cap")
	out = cli(history...)
	if lines := strings.Split(out, "\n"); len(lines) < 2 || !strings.HasPrefix(lines[1], "allowance now: 6 (limit 5, override 4 until ") || !strings.HasSuffix(lines[1], ", +2 granted)") {
		t.Fatalf("with an override:\n%s", out)
	}
}

// historyNow is an answer of GET /usage/history with the current window's run-time quota.
type historyNow struct {
	Unit    string `json:"unit"`
	Windows []struct {
		Used      int64           `json:"used"`
		Limit     int64           `json:"limit"`
		Allowance *int64          `json:"allowance"`
		Granted   int64           `json:"granted"`
		Override  json.RawMessage `json:"override"`
	} `json:"windows"`
}

// historyNowOf reads /usage/history of limit and id in unit ("": the limit's own).
func historyNowOf(t *testing.T, p *proc, limit, id, unit string) historyNow {
	t.Helper()
	path := "/usage/history?limit=" + limit + "&id=" + id
	if unit != "" {
		path += "&unit=" + unit
	}
	code, body := adminGet(t, p, path, adminToken)
	var h historyNow
	if code != 200 || json.Unmarshal([]byte(body), &h) != nil || len(h.Windows) == 0 {
		t.Fatalf("%s: %d %s", path, code, body)
	}
	return h
}

// orgUsageOf reads one limit of a tenant's /usage answer at path.
func orgUsageOf(t *testing.T, p *proc, path, name string) orgUsage {
	t.Helper()
	code, body := adminGet(t, p, path, adminToken)
	var out struct{ Limits []orgUsage }
	if code != 200 || json.Unmarshal([]byte(body), &out) != nil {
		t.Fatalf("%s: %d %s", path, code, body)
	}
	for _, l := range out.Limits {
		if l.Name == name {
			return l
		}
	}
	t.Fatalf("%s has no %s: %s", path, name, body)
	return orgUsage{}
}

// A requests limit of 20 a minute, 11 requests, then reloaded as a tokens limit of 1,500:
// the requests counted before read with unit=requests carry limit 0 in the history as in the
// export (CSV and JSON), and no allowance: the limit in force counts tokens, and 1,500 tokens
// bound no requests. The limit's own unit shows the tokens limit.
func TestHistoryAndExportAgreeOnFormerUnit(t *testing.T) {
	t.Parallel()
	for _, st := range holdStores()[:2] {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			ps := startReplicas(t, tokenUpstream(t), st, changeConfig+"limits:\n  change_per_org: {limit: 20, window: 60s, by: org, history: 3}\n")
			roomInWindow(t, time.Minute, 20*time.Second)
			for i := range 11 {
				if res, _ := sendBody(t, ps[i%len(ps)], "/discovery/v1/assistant/acme-docs/message", "svc_dsc_n", `{"fp":"a","messages":[]}`); res.StatusCode != 200 {
					t.Fatalf("request %d: %d", i, res.StatusCode)
				}
			}
			reloadAll(t, ps, "limits:\n  change_per_org: {limit: 1500, window: 60s, by: org, unit: tokens, history: 3}\n")
			last := ps[len(ps)-1]
			h := historyNowOf(t, last, "change_per_org", "acme", "requests")
			if h.Unit != "requests" || h.Windows[0].Used != 11 {
				t.Fatalf("requests history: %+v", h)
			}
			for _, w := range h.Windows {
				if w.Limit != 0 || w.Allowance != nil || w.Granted != 0 || w.Override != nil {
					t.Fatalf("a window counted in the former unit: %+v, want limit 0 and no allowance", w)
				}
			}
			if code, _, body := exportOf(t, last, "limit=change_per_org&window=current&unit=requests"); code != 200 || body != "id,used,limit,plan,label,org\nacme,11,0,,,\n" {
				t.Fatalf("requests export: %d %q", code, body)
			}
			code, _, body := exportOf(t, last, "limit=change_per_org&window=current&unit=requests&format=json")
			var ex struct{ Tenants []struct{ Used, Limit int64 } }
			if code != 200 || json.Unmarshal([]byte(body), &ex) != nil || len(ex.Tenants) != 1 || ex.Tenants[0].Used != 11 || ex.Tenants[0].Limit != 0 {
				t.Fatalf("requests export as JSON: %d %s", code, body)
			}
			if h := historyNowOf(t, last, "change_per_org", "acme", ""); h.Unit != "tokens" || h.Windows[0].Limit != 1500 || h.Windows[0].Allowance == nil || *h.Windows[0].Allowance != 1500 {
				t.Fatalf("tokens history: %+v", h.Windows[0])
			}
		})
	}
}
