package main

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/internal/redistest"
	"github.com/docsgate/gateway/notify"
)

const hookSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

// eventKey names what an event reports: its type, limit, tenant and threshold.
func eventKey(ev notify.Event) string {
	d, _ := ev.Data.(map[string]any)
	k := fmt.Sprintf("%s %v %v", ev.Type, d["limit"], d["tenant"])
	if th, ok := d["threshold"]; ok {
		k += fmt.Sprintf(" %v", th)
	}
	return k
}

// byKey counts the events received by eventKey, each id once, and says whether any id came
// twice.
func (h *hookReceiver) byKey() (map[string]int, map[string]notify.Event, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	n, last, twice := map[string]int{}, map[string]notify.Event{}, false
	for _, evs := range h.events {
		n[eventKey(evs[0])]++
		last[eventKey(evs[0])] = evs[0]
		twice = twice || len(evs) > 1
	}
	return n, last, twice
}

// waitEvents waits until every key of want was received, then a moment more for any extra
// or repeated delivery, and compares.
func (h *hookReceiver) waitEvents(t *testing.T, want map[string]int, within time.Duration) map[string]notify.Event {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		n, _, _ := h.byKey()
		all := true
		for k := range want {
			all = all && n[k] > 0
		}
		if all || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond)
	n, last, twice := h.byKey()
	if fmt.Sprint(n) != fmt.Sprint(want) || twice {
		t.Fatalf("events %v (an id twice: %v), want %v", n, twice, want)
	}
	return last
}

// inWindowOf waits until the clock is between from and to into a window of length w (windows
// of a duration are aligned on the Unix epoch).
func inWindowOf(w, from, to time.Duration) {
	for {
		in := time.Duration(time.Now().UnixNano() % int64(w))
		if in >= from && in < to {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Every quota event, as an endpoint receives it from the binary, on every store (in process;
// two replicas on Redis; two on a Cluster): thresholds crossed by requests and by the tokens
// answers are charged, each tenant's first refusal, a forecast, with the thresholds and
// forecast of the tenant's plan; each once and signed. Then an override's end.
func TestNotificationEventsEveryStore(t *testing.T) {
	t.Parallel()
	up := tokenUpstream(t)
	for _, st := range holdStores() {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel() // each store its own Redis and receiver; the windows are per tenant
			recv := newHookReceiver(t, hookSecret)
			cfg := fmt.Sprintf(`admin_token: %q
orgs:
  acme: [acme-docs]
  globex: {domains: [globex-docs], plan: pro}
plans:
  pro:
    assistant_per_org: {limit: 10, window: 20s, thresholds: [0.5, 1.0], forecast: true}
limits:
  assistant_per_org: {limit: 1000, window: hour, thresholds: [0.5]}
  assistant_tokens_per_org: {limit: 1000, window: month, by: org, unit: tokens, reserve: 100, thresholds: [0.5, 0.9]}
routes:
  - name: assistant_message
    limits: [assistant_per_key, assistant_per_org, assistant_per_ip, assistant_tokens_per_org]
notifications:
  webhooks:
    - {name: billing, url: %q, secret: %q, limits: [assistant_per_org, assistant_tokens_per_org], allow_private_addresses: true}
`, adminToken, recv.url+"/hooks", hookSecret)
			ps := startReplicas(t, up, st, cfg)
			ask := func(i int, domain, fp string) int {
				res, _ := sendBody(t, ps[i%len(ps)], "/discovery/v1/assistant/"+domain+"/message", "svc_dsc_n", `{"fp":"`+fp+`","messages":[]}`)
				return res.StatusCode
			}
			// acme: answers of 250 tokens each; the second takes the org past 0.5 of its
			// tokens, the fourth past 0.9, and the fifth is its first refusal.
			for i := range 4 {
				if code := ask(i, "acme-docs", "u-100-150-1-full"); code != 200 {
					t.Fatalf("acme answer %d: %d", i, code)
				}
				waitUsageSettledAt(t, ps[0], "acme", "assistant_tokens_per_org", int64(250*(i+1)))
			}
			if code := ask(4, "acme-docs", "u-100-150-1-full"); code != 429 {
				t.Fatalf("acme past its tokens: %d", code)
			}
			// globex, on the pro plan: 10 requests of its 20 s window, and one refused; at the
			// rate of 10 in a few seconds it runs out long before the window ends.
			inWindowOf(20*time.Second, 1200*time.Millisecond, 6*time.Second)
			for i := range 11 {
				if code, want := ask(i, "globex-docs", "a"), map[bool]int{true: 200, false: 429}[i < 10]; code != want {
					t.Fatalf("globex request %d: %d, want %d", i, code, want)
				}
			}
			want := map[string]int{
				"quota.threshold_crossed assistant_tokens_per_org acme 0.5": 1,
				"quota.threshold_crossed assistant_tokens_per_org acme 0.9": 1,
				"quota.exhausted assistant_tokens_per_org acme":             1,
				"quota.threshold_crossed assistant_per_org globex 0.5":      1,
				"quota.threshold_crossed assistant_per_org globex 1":        1,
				"quota.exhausted assistant_per_org globex":                  1,
				"quota.forecast assistant_per_org globex":                   1,
			}
			last := recv.waitEvents(t, want, 15*time.Second)
			d := func(k string) map[string]any { m, _ := last[k].Data.(map[string]any); return m }
			if tok := d("quota.threshold_crossed assistant_tokens_per_org acme 0.5"); tok["used"] != 500.0 || tok["quota"] != 1000.0 ||
				tok["by"] != "org" || tok["org"] != "acme" || tok["window_start"] != time.Now().UTC().Format("2006-01-")+"01T00:00:00Z" {
				t.Errorf("tokens threshold: %v", tok)
			}
			if g := d("quota.threshold_crossed assistant_per_org globex 1"); g["used"] != 10.0 || g["quota"] != 10.0 {
				t.Errorf("globex at its limit: %v", g)
			}
			f := d("quota.forecast assistant_per_org globex")
			ws, _ := time.Parse(time.RFC3339, fmt.Sprint(f["window_start"]))
			runsOut, err := time.Parse(time.RFC3339, fmt.Sprint(f["runs_out_at"]))
			if err != nil || !runsOut.Before(ws.Add(20*time.Second)) || f["rate_per_hour"].(float64) < 10*3600/20.0 {
				t.Errorf("forecast: %v", f)
			}

			// An override of globex's limit ends: quota.override_expired, once whatever the
			// replicas, after its end.
			mustStatus(t, adminCall(t, http.DefaultClient, "http://"+ps[0].admin, "PUT", "/quota/overrides/assistant_per_org/globex",
				map[string]string{"Authorization": "Bearer " + adminToken, "Content-Type": "application/json"}, `{"limit":12,"ttl":"7s","reason":"launch"}`), 200)
			set := time.Now()
			want["quota.override_expired assistant_per_org globex"] = 1
			ev := recv.waitEvents(t, want, 20*time.Second)["quota.override_expired assistant_per_org globex"]
			if o, _ := ev.Data.(map[string]any); o["override"] != 12.0 || o["reason"] != "launch" || o["by"] != "org" || time.Since(set) < 7*time.Second {
				t.Errorf("override_expired %v after %v", o, time.Since(set))
			}
		})
	}
}

// waitUsageSettledAt waits until org's use of a tokens limit reads used with nothing held.
func waitUsageSettledAt(t *testing.T, p *proc, org, name string, used int64) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		u := orgLimitUsage(t, p, org, name)
		if u.Used == used && u.Reserved == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s of %s: %+v, want %d used and nothing held", name, org, u, used)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// With notifications on, a request that crosses nothing costs what it cost without them: one
// script call, and no other command on its path. What MONITOR sees besides is the notifier's
// own timed work (the outbox's polls, the overrides' read), never per request.
func TestNotificationsCostNothingOnRequestPath(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	recv := newHookReceiver(t, hookSecret)
	p := startGateway(t, tokenUpstream(t), fmt.Sprintf("redis: {addrs: [%q]}\norgs: {acme: [acme-docs]}\n"+
		"notifications:\n  webhooks:\n    - {name: billing, url: %q, secret: %q, allow_private_addresses: true}\n", srv.Addr, recv.url, hookSecret))
	send(t, p, "POST", "/v2/agent/warm/job", "svc_a", `{"prompt":"x"}`)

	lines, stop := watchMonitor(t, srv.Addr)
	const n = 20
	sendMixed(t, p, n)
	stop()
	var scripts, timed, other []string
	for l := range lines {
		lower := strings.ToLower(l)
		switch kind := monitorKind(l); {
		case kind == monitorInner, kind == monitorDial:
		case strings.Contains(l, `gw:notify:{notify}:`) || kind == monitorPoll ||
			strings.Contains(lower, `"zrangebyscore" "gw:{quota}:overrides"`) || strings.HasSuffix(lower, `"time"`):
			timed = append(timed, l)
		case kind == monitorScript:
			scripts = append(scripts, l)
		default:
			other = append(other, l)
		}
	}
	// The assistant answers' tokens are counted by no limit here: one call per request.
	if len(scripts) != 2*n || len(other) != 0 {
		t.Fatalf("MONITOR saw %d script calls on the request path (want %d) and other commands: %v", len(scripts), 2*n, other)
	}
	if len(timed) > 2*n {
		t.Fatalf("the notifier's timed work looks per request: %d commands", len(timed))
	}
}

// A replica SIGKILLed while it delivers an event leaves it to a live replica, which delivers
// it within 30 s (the lease of a delivery, 15 s by default, then the next poll), with the same
// id; every setting at its default.
func TestNotificationTakeoverAfterSIGKILL(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	upURL, _ := recordingUpstream(t)
	keys, err := config.ParseSecrets(hookSecret)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var attempts []string // webhook-id of each attempt
	hung := make(chan struct{}, 1)
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	url := serveHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := notify.Verify(keys, r.Header, body, time.Now(), 5*time.Minute); err != nil {
			t.Errorf("unverified delivery: %v", err)
		}
		mu.Lock()
		attempts = append(attempts, r.Header.Get(notify.HeaderID))
		first := len(attempts) == 1
		mu.Unlock()
		if first { // the first attempt hangs: its replica dies mid-delivery
			hung <- struct{}{}
			select {
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		w.WriteHeader(204)
	}))
	cfg := fmt.Sprintf("redis:\n  addrs: [%q]\n  timeout: 2s\nlimits:\n  agent_job_per_project: {limit: 4, thresholds: [0.5]}\n"+
		"notifications:\n  webhooks:\n    - {name: billing, url: %q, secret: %q, allow_private_addresses: true}\n", srv.Addr, url, hookSecret)
	a := startGateway(t, upURL, cfg)
	for range 2 {
		if res := job(t, a, "p1"); res.StatusCode != 201 {
			t.Fatalf("job: %d", res.StatusCode)
		}
	}
	select {
	case <-hung:
	case <-time.After(20 * time.Second):
		t.Fatal("no delivery attempt")
	}
	b := startGateway(t, upURL, cfg) // the live replica, started once a's attempt is under way
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	deadline := killed.Add(30 * time.Second)
	for {
		mu.Lock()
		n := len(attempts)
		ids := slices.Clone(attempts)
		mu.Unlock()
		if n >= 2 {
			if ids[0] != ids[1] || n != 2 {
				t.Fatalf("attempts: %v", ids)
			}
			t.Logf("delivered by the live replica %s after the kill", time.Since(killed).Round(time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not delivered within 30 s of the kill\n%s", b.out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
	waitMetric(t, b, "gateway_notifications_pending", 10*time.Second, func(v float64) bool { return v == 0 })
}

// A receiver that answers 503 for a while, then accepts: every event is delivered, each id
// accepted once, and the outbox empties; every setting at its default.
func TestNotificationsReceiverDownThenUp(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	upURL, _ := recordingUpstream(t)
	keys, _ := config.ParseSecrets(hookSecret)
	var mu sync.Mutex
	accepted := map[string]int{}
	refused := 0
	up := time.Now().Add(6 * time.Second)
	url := serveHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := notify.Verify(keys, r.Header, body, time.Now(), 5*time.Minute); err != nil {
			t.Errorf("unverified delivery: %v", err)
		}
		mu.Lock()
		defer mu.Unlock()
		if time.Now().Before(up) {
			refused++
			w.WriteHeader(503)
			return
		}
		accepted[r.Header.Get(notify.HeaderID)]++
		w.WriteHeader(204)
	}))
	cfg := fmt.Sprintf("redis:\n  addrs: [%q]\n  timeout: 2s\nlimits:\n  agent_job_per_project: {limit: 4, thresholds: [0.5, 1.0]}\n"+
		"notifications:\n  webhooks:\n    - {name: billing, url: %q, secret: %q, allow_private_addresses: true}\n", srv.Addr, url, hookSecret)
	ps := []*proc{startGateway(t, upURL, cfg), startGateway(t, upURL, cfg)}
	for i := range 5 { // 0.5, 1.0, then the first refusal: three events
		job(t, ps[i%2], "p1")
	}
	deadline := time.Now().Add(40 * time.Second)
	for {
		mu.Lock()
		n, r := len(accepted), refused
		mu.Unlock()
		if n == 3 && r > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("accepted %v after %d refusals", accepted, r)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, p := range ps {
		waitMetric(t, p, "gateway_notifications_pending", 10*time.Second, func(v float64) bool { return v == 0 })
	}
	time.Sleep(500 * time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	for id, n := range accepted {
		if n != 1 {
			t.Errorf("%s accepted %d times", id, n)
		}
	}
}
