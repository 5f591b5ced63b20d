package main

import (
	"fmt"
	"testing"
	"time"
)

// The numbers a quota event carries are the counters' (issue 45, "numbers that must say what
// the counters say"): an event's used is the tenant's counter as /usage shows it, a tokens
// limit with a reserve says what the answers in flight hold in reserved, and every event names
// the unit its counter counts.

// eventNumbersConfig is one tokens limit on the v1 assistant route: 1,500 a month for acme,
// 1,000 with a reserve of 100 for globex (plan held).
func eventNumbersConfig(hooks string) string {
	return fmt.Sprintf(`admin_token: %q
orgs:
  acme: [acme-docs]
  globex: {domains: [globex-docs], plan: held}
plans:
  held:
    org_tokens: {limit: 1000, reserve: 100, thresholds: [0.5]}
limits:
  org_tokens: {limit: 1500, window: month, by: org, unit: tokens, thresholds: [1.0]}
`, adminToken) + limitHooked("org_tokens", hooks)
}

// limitHooked puts limit on the v1 assistant route (beside its per-key and per-IP limits) and
// sends its events to hooks.
func limitHooked(limit, hooks string) string {
	return fmt.Sprintf(`routes:
  - name: assistant_message
    limits: [assistant_per_key, assistant_per_ip, %s]
notifications:
  webhooks:
    - {name: billing, url: %q, secret: %q, limits: [%s], allow_private_addresses: true}
`, limit, hooks, hookSecret, limit)
}

// answerOf sends one answer of domain that costs fp ("t-P-C") and waits until it is settled:
// org's counter of limit reads used then, nothing held.
func answerOf(t *testing.T, ps []*proc, up *gatedUpstream, domain, org, fp string, used int64) {
	t.Helper()
	rs, done := startStreamsTo(t, ps, 1, domain, fp)
	if rs[0].status != 200 {
		t.Fatalf("%s answer %s: %+v", org, fp, rs[0])
	}
	up.open()
	done.Wait()
	waitUsageSettledAt(t, ps[len(ps)-1], org, "org_tokens", used)
}

// The reproduction, on every store: a tokens limit of 1,500 run to 1,531 by an answer
// reports the 1.0 crossing with used 1,531 and the refusal after it with used 1,531 too (not
// the quota, 1,500); on a limit with a reserve, the refusal while 3 answers hold 300 tokens
// says used 700 and reserved 300 (not 1,000 used). Each used is what /usage says at once.
func TestEventUsedIsTheCounter(t *testing.T) {
	t.Parallel()
	for _, st := range holdStores() {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			recv := newHookReceiver(t, hookSecret)
			up := newGatedUpstream(t)
			ps := startReplicas(t, up.url, st, eventNumbersConfig(recv.url+"/hooks"))

			// acme: five answers of 250 tokens, then one of 281 takes it to 1,531 of 1,500.
			for i := range 5 {
				answerOf(t, ps, up, "acme-docs", "acme", "t-100-150", int64(250*(i+1)))
			}
			answerOf(t, ps, up, "acme-docs", "acme", "t-131-150", 1531)
			if rs, done := startStreamsTo(t, ps, 1, "acme-docs", "t-1-1"); rs[0].status != 429 {
				t.Fatalf("acme past its tokens: %+v", rs[0])
			} else {
				done.Wait()
			}
			// globex: two answers of 350 (700, crossing 0.5), then three held in flight: 300
			// held, nothing remains net of the holds, and the next is refused.
			answerOf(t, ps, up, "globex-docs", "globex", "t-200-150", 350)
			answerOf(t, ps, up, "globex-docs", "globex", "t-200-150", 700)
			rs, inFlight := startStreamsTo(t, ps, 3, "globex-docs", "t-1-1")
			if countStatus(rs, 200) != 3 {
				t.Fatalf("globex's three answers in flight: %+v", rs)
			}
			if rs, done := startStreamsTo(t, ps, 1, "globex-docs", "t-1-1"); rs[0].status != 429 {
				t.Fatalf("globex with its tokens held: %+v", rs[0])
			} else {
				done.Wait()
			}
			want := map[string]int{
				"quota.threshold_crossed org_tokens acme 1":     1,
				"quota.exhausted org_tokens acme":               1,
				"quota.threshold_crossed org_tokens globex 0.5": 1,
				"quota.exhausted org_tokens globex":             1,
			}
			last := recv.waitEvents(t, want, 15*time.Second)
			d := func(k string) map[string]any { m, _ := last[k].Data.(map[string]any); return m }
			acme, globex := orgLimitUsage(t, ps[0], "acme", "org_tokens"), orgLimitUsage(t, ps[0], "globex", "org_tokens")
			if acme.Used != 1531 || globex.Used != 700 || globex.Reserved != 300 {
				t.Fatalf("/usage: acme %+v, globex %+v", acme, globex)
			}
			for k, w := range map[string]struct {
				used, quota float64
				reserved    any // nil: no such field (the limit holds nothing)
			}{
				"quota.threshold_crossed org_tokens acme 1":     {1531, 1500, nil},
				"quota.exhausted org_tokens acme":               {1531, 1500, nil},
				"quota.threshold_crossed org_tokens globex 0.5": {700, 1000, 0.0},
				"quota.exhausted org_tokens globex":             {700, 1000, 300.0},
			} {
				ev := d(k)
				reserved, has := ev["reserved"]
				if ev["used"] != w.used || ev["quota"] != w.quota || ev["unit"] != "tokens" || has != (w.reserved != nil) || has && reserved != w.reserved {
					t.Errorf("%s: %v; want used %v, quota %v, unit tokens, reserved %v", k, ev, w.used, w.quota, w.reserved)
				}
			}
			up.open()
			inFlight.Wait()
		})
	}
}

// A limit whose unit a reload changes mid-window keeps a counter per unit, and each reports
// its own crossings: the requests counter's 0.5 (2 of 4) before the change and the tokens
// counter's 0.5 (80 of 100) after it are two events of one limit, tenant and window that say
// which unit they count.
func TestEventsNameTheirUnit(t *testing.T) {
	t.Parallel()
	for _, st := range holdStores()[:2] {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			recv := newHookReceiver(t, hookSecret)
			up := newGatedUpstream(t)
			cfg := fmt.Sprintf("admin_token: %q\norgs: {acme: [acme-docs]}\n", adminToken) + limitHooked("change_per_org", recv.url+"/hooks") + reloadMarker
			const requests = "limits:\n  change_per_org: {limit: 4, window: hour, by: org, thresholds: [0.5]}\n"
			const tokens = "limits:\n  change_per_org: {limit: 100, window: hour, by: org, unit: tokens, thresholds: [0.5]}\n"
			ps := startReplicas(t, up.url, st, cfg+requests)
			roomInWindow(t, time.Hour, 30*time.Second)
			for range 2 {
				rs, done := startStreams(t, ps, 1, "t-1-1")
				if rs[0].status != 200 {
					t.Fatalf("%+v", rs[0])
				}
				up.open()
				done.Wait()
			}
			key := "quota.threshold_crossed change_per_org acme 0.5"
			recv.waitEvents(t, map[string]int{key: 1}, 10*time.Second)
			reloadAll(t, ps, tokens)
			rs, done := startStreams(t, ps, 1, "t-30-50")
			if rs[0].status != 200 {
				t.Fatalf("%+v", rs[0])
			}
			up.open()
			done.Wait()
			recv.waitEvents(t, map[string]int{key: 2}, 10*time.Second)
			recv.mu.Lock()
			defer recv.mu.Unlock()
			got := map[string]bool{}
			for _, evs := range recv.events {
				d, _ := evs[0].Data.(map[string]any)
				got[fmt.Sprintf("%v %v of %v", d["unit"], d["used"], d["quota"])] = true
			}
			if !got["requests 2 of 4"] || !got["tokens 80 of 100"] || len(got) != 2 {
				t.Fatalf("events %v, want one of the requests counter (2 of 4) and one of the tokens counter (80 of 100)", got)
			}
		})
	}
}
