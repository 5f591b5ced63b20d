package main

import (
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"
)

// Changes of a limit while it counts, as operators make them: a reload that changes a limit's
// unit or window with answers in flight, and a plan change that moves a tenant to another
// window. Nothing counted is lost, counted twice or read in another unit, no request is refused
// because of the change, and the answers in flight keep their holds. On the in-process store
// and on two replicas sharing Redis or a Redis Cluster.

// changeConfig is an org's tokens limit on the v1 assistant route; reloadMarker lets a test
// replace the limit.
const changeConfig = "admin_token: " + adminToken + `
orgs: {acme: [acme-docs]}
routes:
  - name: assistant_message
    limits: [assistant_per_key, assistant_per_org, assistant_per_ip, change_per_org]
` + reloadMarker

// roomInWindow waits, when less than need is left of the current window of length window
// (aligned as the limits align theirs), for the next one, so that a test's phases fall into
// one window.
func roomInWindow(t *testing.T, window, need time.Duration) {
	t.Helper()
	if left := time.Until(time.Now().Truncate(window).Add(window)); left < need {
		time.Sleep(left + 100*time.Millisecond)
	}
}

// reloadAll reloads every replica with limits as the part after reloadMarker.
func reloadAll(t *testing.T, ps []*proc, limits string) {
	t.Helper()
	for _, p := range ps {
		reloadConfig(t, p, limits)
	}
}

// A tokens limit (1,000 a minute, reserve 100) with 600 tokens used and 4 answers in flight is
// reloaded as a requests limit of 20 a minute under the same name: the requests count starts at
// 0 (the 600 tokens are not read as requests) and 10 requests pass at once; the 4 answers end
// and their tokens land in the tokens counter, which /usage/history and /usage/export still
// show with ?unit=tokens: 600 + 4 × 70.
func TestUnitChangeByReload(t *testing.T) {
	t.Parallel()
	const tokens = "change_per_org: {limit: 1000, window: 60s, by: org, unit: tokens, reserve: 100, history: 3}\n"
	const requests = "change_per_org: {limit: 20, window: 60s, by: org, history: 3}\n"
	for _, st := range holdStores() {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			up := newGatedUpstream(t)
			ps := startReplicas(t, up.url, st, changeConfig+"limits:\n  "+tokens)
			roomInWindow(t, time.Minute, 40*time.Second)
			rs, done := startStreams(t, ps, 6, "t-40-60")
			if countStatus(rs, 200) != 6 {
				t.Fatalf("the first 6 answers: %+v", rs)
			}
			up.open()
			done.Wait()
			waitUsage(t, ps[0], "change_per_org", 600, 0, 5*time.Second)
			rs, inFlight := startStreams(t, ps, 4, "t-30-40")
			if countStatus(rs, 200) != 4 {
				t.Fatalf("the 4 answers kept in flight: %+v", rs)
			}
			reloadAll(t, ps, "limits:\n  "+requests)
			for _, p := range ps {
				if u := acmeUsage(t, p, "change_per_org"); u.Unit != "requests" || u.Used != 0 || u.Remaining != 20 {
					t.Fatalf("right after the reload: %+v, want 0 of 20 requests used (600 tokens are no requests)", u)
				}
			}
			rs, more := startStreams(t, ps, 10, "t-1-1")
			if countStatus(rs, 200) != 10 {
				t.Fatalf("after the reload, 10 requests against 20: %+v", rs)
			}
			up.open()
			inFlight.Wait()
			more.Wait()
			if u := acmeUsage(t, ps[len(ps)-1], "change_per_org"); u.Used != 10 {
				t.Fatalf("requests counted after the reload: %+v, want 10", u)
			}
			last := ps[len(ps)-1]
			deadline := time.Now().Add(5 * time.Second)
			for {
				h := historyIn(t, last, "change_per_org", "acme", "tokens")
				if h.Unit == "tokens" && len(h.Windows) > 0 && h.Windows[0].Used == 880 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("tokens history: %+v, want 880 in the current window (600 and the 4 answers' 70 each)", h)
				}
				time.Sleep(50 * time.Millisecond)
			}
			if h := historyIn(t, last, "change_per_org", "acme", ""); h.Unit != "requests" || h.Windows[0].Used != 10 {
				t.Fatalf("requests history: %+v, want 10", h)
			}
			// The tokens rows carry no limit: the limit in force counts requests.
			for query, want := range map[string]string{"&unit=tokens": "acme,880,0,,,\n", "": "acme,10,20,,,\n", "&unit=requests": "acme,10,20,,,\n"} {
				code, _, body := exportOf(t, last, "limit=change_per_org&window=current"+query)
				if code != 200 || body != "id,used,limit,plan,label,org\n"+want {
					t.Errorf("export with %q: %d %q, want %q", query, code, body, want)
				}
			}
		})
	}
}

// historyIn is GET /usage/history in unit ("" for the limit's own).
func historyIn(t *testing.T, p *proc, limit, id, unit string) historyT {
	t.Helper()
	q := url.Values{"limit": {limit}, "id": {id}}
	if unit != "" {
		q.Set("unit", unit)
	}
	return adminRead(p, adminToken, "/usage/history?"+q.Encode()).history(t)
}

// A tokens limit of 1,000 a minute with a reserve of 100 and 10 answers in flight (all 1,000
// held) is reloaded to a 30 s window: the holds stay (0 remaining, 5 more requests refused),
// and the 10 answers' 50 tokens each are billed to the 30 s window they end in, where
// /usage/history and the export read them: 500.
func TestWindowChangeByReload(t *testing.T) {
	t.Parallel()
	const limit = "change_per_org: {limit: 1000, window: %s, by: org, unit: tokens, reserve: 100, history: 3}\n"
	for _, st := range holdStores() {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			up := newGatedUpstream(t)
			ps := startReplicas(t, up.url, st, changeConfig+"limits:\n  "+fmt.Sprintf(limit, "60s"))
			// Admitted in a minute's second half: the 60 s window they count in began in the
			// 30 s window before the one they end in, so an answer charged in its admission's
			// window would be billed to the wrong one.
			if sec := time.Now().Second(); sec < 31 || sec > 38 {
				time.Sleep(time.Duration((91-sec)%60) * time.Second)
			}
			rs, inFlight := startStreams(t, ps, 10, "t-20-30")
			if countStatus(rs, 200) != 10 {
				t.Fatalf("the 10 answers kept in flight: %+v", rs)
			}
			reloadAll(t, ps, "limits:\n  "+fmt.Sprintf(limit, "30s"))
			w30 := time.Now().Truncate(30 * time.Second).UTC()
			for _, p := range ps {
				if u := acmeUsage(t, p, "change_per_org"); u.Used != 0 || u.Reserved != 1000 || u.Remaining != 0 {
					t.Fatalf("right after the reload: %+v, want the 10 answers' 1000 held and 0 remaining", u)
				}
			}
			rs, refused := startStreams(t, ps, 5, "t-1-1")
			refused.Wait()
			if countStatus(rs, 429) != 5 {
				t.Fatalf("5 more beside the holds: %+v, want 5 refused", rs)
			}
			for _, r := range rs {
				if r.limit != "change_per_org" {
					t.Fatalf("a refusal naming %q, want change_per_org", r.limit)
				}
			}
			up.open()
			inFlight.Wait()
			last := ps[len(ps)-1]
			// The answers are billed to the 30 s window they end in: w30, or the next one on a
			// machine slow enough to reach it. Their 500 tokens are there, and nothing is held.
			deadline := time.Now().Add(5 * time.Second)
			for {
				var sum int64
				for _, w := range historyOf(t, last, "change_per_org", "acme").Windows {
					if !w.Start.Before(w30) {
						sum += w.Used
					}
				}
				u := acmeUsage(t, last, "change_per_org")
				if sum == 500 && u.Reserved == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("after the answers ended: %d tokens in the 30 s windows since the reload, %+v, want 500 and nothing held", sum, u)
				}
				time.Sleep(50 * time.Millisecond)
			}
			var exported int64
			for ws := w30; !ws.After(time.Now()); ws = ws.Add(30 * time.Second) {
				body := exportOfWindow(t, last, "change_per_org", ws)
				var used int64
				if _, err := fmt.Sscanf(strings.TrimPrefix(body, "id,used,limit,plan,label,org\nacme,"), "%d", &used); err == nil {
					exported += used
				}
			}
			if exported != 500 {
				t.Fatalf("the exports since the reload add up to %d, want 500", exported)
			}
		})
	}
}

// An org moved by reload between plans whose limits count in windows of 3 s and 2 s, and back,
// while a second org stays: every window's export lists both orgs whatever their plan, and
// over the kept windows each org's rows and its /usage/history add up to the requests the
// client saw admitted.
func TestPlanChangeOfWindow(t *testing.T) {
	t.Parallel()
	const base = "admin_token: " + adminToken + `
routes:
  - name: assistant_message
    limits: [assistant_per_key, assistant_per_ip, plan_per_org]
` + reloadMarker
	orgs := func(acmePlan string) string {
		return fmt.Sprintf(`orgs:
  acme: {domains: [acme-docs], plan: %s}
  globex: {domains: [globex-docs]}
plans:
  fast: {plan_per_org: {limit: 1000, window: 2s}}
  slow: {plan_per_org: {limit: 1000, window: 3s}}
limits:
  plan_per_org: {limit: 1000, window: 3s, by: org, history: 20}
`, acmePlan)
	}
	up := tokenUpstream(t)
	for _, st := range holdStores() {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			ps := startReplicas(t, up, st, base+orgs("slow"))
			admitted := map[string]int{}
			ask := func(org string, n int) {
				for i := range n {
					p := ps[i%len(ps)]
					res := send(t, p, "POST", "/discovery/v1/assistant/"+org+"-docs/message", "svc_dsc_planchange0123456789abcd", `{"fp":"x","messages":[]}`)
					if res.StatusCode == 200 {
						admitted[org]++
					}
				}
			}
			start := time.Now()
			for round, plan := range []string{"fast", "slow", "fast", "slow"} {
				ask("acme", 3+round)
				ask("globex", 2)
				time.Sleep(1200 * time.Millisecond) // into another window of each length, now and then
				reloadAll(t, ps, orgs(plan))
				ask("acme", 2)
			}
			if admitted["acme"] != 26 || admitted["globex"] != 8 {
				t.Fatalf("admitted %v, want acme 26 and globex 8", admitted)
			}
			last := ps[len(ps)-1]
			for _, org := range []string{"acme", "globex"} {
				var sum int64
				for _, w := range historyOf(t, last, "plan_per_org", org).Windows {
					sum += w.Used
				}
				if sum != int64(admitted[org]) {
					t.Errorf("%s: /usage/history adds up to %d, the client saw %d admitted", org, sum, admitted[org])
				}
			}
			// Every 3 s window since the start, read by start: the rows add up per org.
			exported := map[string]int64{}
			now := time.Now()
			for ws := start.Truncate(3 * time.Second); !ws.After(now); ws = ws.Add(3 * time.Second) {
				for _, line := range strings.Split(strings.TrimSpace(exportOfWindow(t, last, "plan_per_org", ws.UTC())), "\n")[1:] {
					var id string
					var used int64
					if _, err := fmt.Sscanf(strings.ReplaceAll(line, ",", " "), "%s %d", &id, &used); err != nil {
						t.Fatalf("export row %q: %v", line, err)
					}
					exported[id] += used
				}
			}
			for _, org := range []string{"acme", "globex"} {
				if exported[org] != int64(admitted[org]) {
					t.Errorf("%s: the exports add up to %d, the client saw %d admitted (%v)", org, exported[org], admitted[org], exported)
				}
			}
		})
	}
}
