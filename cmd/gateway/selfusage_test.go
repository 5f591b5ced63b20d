package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/internal/browsertest"
	"github.com/docsgate/gateway/internal/redistest"
)

// selfLimit is one limit of a GET /gateway/usage answer (and of the admin listener's).
type selfLimit struct {
	Name         string  `json:"name"`
	Unit         string  `json:"unit"`
	Window       *string `json:"window"`
	Limit        int64   `json:"limit"`
	Used         int64   `json:"used"`
	Reserved     int64   `json:"reserved"`
	Remaining    int64   `json:"remaining"`
	Reset        string  `json:"reset"`
	ResetSeconds int64   `json:"reset_seconds"`
	Forecast     *struct {
		RatePerHour float64 `json:"rate_per_hour"`
		RunsOutAt   *string `json:"runs_out_at"`
	} `json:"forecast"`
	Granted  int64           `json:"granted,omitempty"`
	Override json.RawMessage `json:"override,omitempty"`
}

type selfAnswer struct {
	Route  string      `json:"route"`
	Limits []selfLimit `json:"limits"`
}

func (a selfAnswer) limit(t *testing.T, name string) selfLimit {
	t.Helper()
	for _, l := range a.Limits {
		if l.Name == name {
			return l
		}
	}
	t.Fatalf("no %s in %+v", name, a)
	return selfLimit{}
}

// selfUsage asks p's usage endpoint with key; it fails unless the status is want, and decodes
// a 200 strictly (no field beyond the documented ones).
func selfUsage(t *testing.T, p *proc, query, key string, want int) (selfAnswer, string, http.Header) {
	t.Helper()
	status, h, data := selfStatus(t, p, query, key)
	if status != want {
		t.Fatalf("GET /gateway/usage?%s: %d %s, want %d", query, status, data, want)
	}
	var a selfAnswer
	if want == 200 {
		dec := json.NewDecoder(strings.NewReader(data))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&a); err != nil {
			t.Fatalf("%s: %v", data, err)
		}
		for _, l := range a.Limits {
			if l.Granted != 0 || l.Override != nil {
				t.Fatalf("the tenant's answer shows the operators' quota terms: %s", data)
			}
		}
	}
	return a, data, h
}

// adminCallOK is an admin call with the token that must answer want.
func adminCallOK(t *testing.T, p *proc, method, path, body string, want int) string {
	t.Helper()
	h := map[string]string{"Authorization": "Bearer " + adminToken}
	if body != "" {
		h["Content-Type"] = "application/json"
	}
	a := adminCall(t, http.DefaultClient, "http://"+p.admin, method, path, h, body)
	if a.status != want {
		t.Fatalf("%s %s: %d %s, want %d", method, path, a.status, a.body, want)
	}
	return a.body
}

// heldAnswers sends n assistant answers of key to domain on p and returns once each has its
// headers; the answers stay open at the upstream's gate until release is called.
func heldAnswers(t *testing.T, up *gatedUpstream, p *proc, key, domain string, n int) (release func()) {
	t.Helper()
	var wg sync.WaitGroup
	statuses := make(chan int, n)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequest("POST", "http://"+p.public+"/discovery/v1/assistant/"+domain+"/message", strings.NewReader(`{"fp":"t-40-60","messages":[]}`))
			req.Header.Set("Authorization", "Bearer "+key)
			req.Header.Set("Content-Type", "application/json")
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				statuses <- 0
				return
			}
			statuses <- res.StatusCode
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
		}()
	}
	for range n {
		if s := <-statuses; s != 200 {
			t.Fatalf("an answer was refused: %d", s)
		}
	}
	return func() { up.open(); wg.Wait() }
}

const selfUsageConfig = `admin_token: %q
%s
orgs:
  acme: {domains: [acme-docs], plan: gold}
  globex: [globex-docs]
plans:
  gold:
    assistant_per_org: {limit: 80}
limits:
  assistant_per_org: {limit: 50, window: hour}
  assistant_per_ip: {limit: 1000, window: day, mode: shadow}
  assistant_tokens_per_org: {limit: 1000, window: hour, by: org, unit: tokens, reserve: 100}
  assistant_streams_per_org: {limit: 5, by: org, unit: streams}
  agent_burst_per_project: {limit: 60, window: 1h, by: project, algorithm: gcra}
routes:
  - name: assistant_message
    limits: [assistant_per_key, assistant_per_org, assistant_per_ip, assistant_tokens_per_org, assistant_streams_per_org]
  - name: agent_job
    limits: [agent_job_per_project, agent_burst_per_project]
self_usage: {per_key_per_minute: 12}
`

// The endpoint against the binary on each store, in registry mode: every limit kind
// (requests, tokens with holds, streams, GCRA) after plans, grants and overrides, the same view
// as the admin listener's for the same counters, read by another replica than the one that
// counted, and the isolation rules.
func TestSelfUsageBinary(t *testing.T) {
	t.Parallel()
	const (
		keyA       = "svc_dsc_selfusageacme0123456789abcd" // acme (gold plan), acme-docs
		keyG       = "svc_dsc_selfusageglobex0123456789ab" // globex, globex-docs
		keyP       = "svc_selfusageadmin0123456789abcdefg" // acme, project p1
		keyRevoked = "svc_dsc_selfusagerevoked0123456789a"
	)
	for _, st := range holdStores() {
		t.Run(st.name, func(t *testing.T) {
			up := newGatedUpstream(t)
			store := st.redis(t)
			authCfg := "auth: {mode: registry}"
			if store == "" {
				authCfg = fmt.Sprintf("auth: {mode: registry, keys_file: %q}", filepath.Join(t.TempDir(), "keys.yaml"))
			}
			var ps []*proc
			for range st.replicas {
				ps = append(ps, startGateway(t, up.url, store+fmt.Sprintf(selfUsageConfig, adminToken, authCfg)))
			}
			counter, reader := ps[0], ps[len(ps)-1]
			for _, k := range []string{
				`{"key":"` + keyA + `","kind":"assistant","org":"acme","domains":["acme-docs"]}`,
				`{"key":"` + keyG + `","kind":"assistant","org":"globex","domains":["globex-docs"]}`,
				`{"key":"` + keyP + `","kind":"admin","org":"acme","projects":["p1"]}`,
				`{"key":"` + keyRevoked + `","kind":"assistant","org":"acme","domains":["acme-docs"]}`,
			} {
				adminCallOK(t, counter, "POST", "/keys", k, 201)
			}
			adminCallOK(t, counter, "DELETE", "/keys/"+auth.Digest(keyRevoked), "", 200)

			// Three answers of 100 tokens each end; two more stay in flight, holding 100 each.
			heldAnswers(t, up, counter, keyA, "acme-docs", 3)()
			waitUsage(t, counter, "assistant_tokens_per_org", 300, 0, 10*time.Second)
			release := heldAnswers(t, up, counter, keyA, "acme-docs", 2)
			defer release()
			adminCallOK(t, counter, "POST", "/quota/grants", `{"limit":"assistant_per_org","id":"acme","amount":10,"reason":"launch"}`, 201)
			for range 2 {
				if res := send(t, counter, "POST", "/v2/agent/p1/job", keyP, `{"prompt":"x","fp":"status-201"}`); res.StatusCode != 201 {
					t.Fatalf("agent job: %d", res.StatusCode)
				}
			}
			adminCallOK(t, counter, "PUT", "/quota/overrides/agent_job_per_project/p1", `{"limit":7,"ttl":"1h","reason":"trial"}`, 200)

			q := "route=assistant_message&domain=acme-docs"
			a, body, h := selfUsage(t, reader, q, keyA, 200)
			if h.Get("Cache-Control") != "no-store" || !strings.HasPrefix(h.Get("Content-Type"), "application/json") {
				t.Fatalf("headers: %v", h)
			}
			if a.Route != "assistant_message" || len(a.Limits) != 4 {
				t.Fatalf("want the four enforced limits, not the shadow per-IP one: %s", body)
			}
			key, org, tok, streams := a.limit(t, "assistant_per_key"), a.limit(t, "assistant_per_org"), a.limit(t, "assistant_tokens_per_org"), a.limit(t, "assistant_streams_per_org")
			if key.Used != 5 || *key.Window != "month" || key.Forecast == nil {
				t.Errorf("per key: %+v", key)
			}
			if org.Limit != 90 || org.Used != 5 || org.Remaining != 85 || *org.Window != "hour" || org.Forecast == nil || org.Forecast.RatePerHour <= 0 {
				t.Errorf("per org (gold plan 80, +10 granted): %+v", org)
			}
			if tok.Unit != "tokens" || tok.Used != 300 || tok.Reserved != 200 || tok.Remaining != 500 || tok.Forecast == nil {
				t.Errorf("tokens with holds: %+v", tok)
			}
			if streams.Unit != "streams" || streams.Window != nil || streams.Used != 2 || streams.Remaining != 3 || streams.Forecast != nil || streams.ResetSeconds != 0 {
				t.Errorf("streams: %s", body)
			}
			// The admin listener's answer for the org: the same view of the same counters.
			code, adminBody := adminGet(t, reader, "/usage/orgs/acme", adminToken)
			var ad selfAnswer
			if err := json.Unmarshal([]byte(adminBody), &ad); code != 200 || err != nil {
				t.Fatalf("admin: %d %s", code, adminBody)
			}
			for _, name := range []string{"assistant_per_org", "assistant_tokens_per_org", "assistant_streams_per_org"} {
				mine, theirs := a.limit(t, name), ad.limit(t, name)
				theirs.Granted, theirs.Override = 0, nil
				mine.ResetSeconds, theirs.ResetSeconds = 0, 0
				// A limit without a window resets "now": two reads a moment apart may differ.
				if ta, err1 := time.Parse(time.RFC3339, mine.Reset); err1 == nil {
					if tb, err2 := time.Parse(time.RFC3339, theirs.Reset); err2 == nil && ta.Sub(tb).Abs() <= 5*time.Second {
						mine.Reset = theirs.Reset
					}
				}
				if mine.Forecast != nil && theirs.Forecast != nil { // read a moment apart
					mine.Forecast.RatePerHour, theirs.Forecast.RatePerHour = 0, 0
					// The extrapolation moves with the clock: the same within a few seconds.
					if a, b := mine.Forecast.RunsOutAt, theirs.Forecast.RunsOutAt; a != nil && b != nil {
						ta, err1 := time.Parse(time.RFC3339, *a)
						tb, err2 := time.Parse(time.RFC3339, *b)
						if err1 == nil && err2 == nil && ta.Sub(tb).Abs() <= 5*time.Second {
							mine.Forecast.RunsOutAt = theirs.Forecast.RunsOutAt
						}
					}
				}
				m, _ := json.Marshal(mine)
				th, _ := json.Marshal(theirs)
				if string(m) != string(th) {
					t.Errorf("%s: tenant sees %s, admin %s", name, m, th)
				}
			}
			if ad.limit(t, "assistant_per_org").Granted != 10 {
				t.Errorf("admin answer lost the grant: %s", adminBody)
			}

			// The admin family: the override, and a GCRA limit (no forecast).
			a, body, _ = selfUsage(t, reader, "route=agent_job&projectId=p1", keyP, 200)
			if p := a.limit(t, "agent_job_per_project"); p.Limit != 7 || p.Used != 2 || p.Remaining != 5 {
				t.Errorf("override: %s", body)
			}
			if g := a.limit(t, "agent_burst_per_project"); g.Used != 2 || g.Remaining != 58 || g.Forecast != nil || *g.Window != "1h0m0s" {
				t.Errorf("gcra: %s", body)
			}

			// Isolation: another org's domain, another project, a revoked or unknown key, the
			// other family. None of them shows a counter.
			for _, c := range []struct {
				query, key string
				status     int
				code       string
			}{
				{"route=assistant_message&domain=globex-docs", keyA, 403, "forbidden"},
				{"route=assistant_message&domain=unknown-docs", keyA, 403, "forbidden"},
				{"route=agent_job&projectId=p2", keyP, 403, "forbidden"},
				{q, keyRevoked, 401, "invalid_credentials"},
				{q, "svc_dsc_selfusageinvented0123456789", 401, "invalid_credentials"},
				{"route=agent_job&projectId=p1", keyA, 403, "wrong_key_type"},
				{q, keyP, 403, "wrong_key_type"},
				{"route=assistant_message", keyA, 400, "invalid_request"},
			} {
				_, body, _ := selfUsage(t, reader, c.query, c.key, c.status)
				if !strings.Contains(body, `"code":"`+c.code+`"`) || strings.Contains(body, `"limits"`) {
					t.Errorf("%s with %.16s: %s, want %s", c.query, c.key, body, c.code)
				}
			}
			// Globex's own view: its org's counters, untouched by acme's answers.
			a, body, _ = selfUsage(t, reader, "route=assistant_message&domain=globex-docs", keyG, 200)
			if o := a.limit(t, "assistant_per_org"); o.Used != 0 || o.Limit != 50 || a.limit(t, "assistant_tokens_per_org").Used != 0 {
				t.Errorf("another org: %s", body)
			}

			// Reading counted nothing: the admin listener still sees five requests.
			if u := acmeUsage(t, counter, "assistant_per_org"); u.Used != 5 {
				t.Errorf("the reads were counted: %+v", u)
			}
			// The per-key bound (12 a minute in each replica), counted after authentication:
			// keyA has had one answer of reader so far, in this minute or the last.
			ok := 0
			for {
				status, h, body := selfStatus(t, reader, q, keyA)
				if status == 429 {
					if h.Get("Retry-After") == "" || !strings.Contains(body, `"code":"rate_limited"`) || !strings.Contains(body, `"limit":"self_usage"`) {
						t.Fatalf("429: %v %s", h, body)
					}
					break
				}
				if status != 200 || ok > 12 {
					t.Fatalf("read %d: %d %s", ok, status, body)
				}
				ok++
			}
			if ok != 11 && ok != 12 {
				t.Errorf("%d answers before the bound, want 11 (12 if the minute turned)", ok)
			}
			selfUsage(t, reader, "route=assistant_message&domain=globex-docs", keyG, 200) // its own bound
		})
	}
}

// selfStatus asks the usage endpoint and returns what came back, whatever it is.
func selfStatus(t *testing.T, p *proc, query, key string) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+p.public+"/gateway/usage?"+query, nil)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	data, _ := io.ReadAll(res.Body)
	return res.StatusCode, res.Header, string(data)
}

const roundTripConfig = `orgs: {acme: [acme-docs]}
limits:
  assistant_tokens_per_org: {limit: 1000, window: hour, by: org, unit: tokens, reserve: 100}
  assistant_streams_per_org: {limit: 5, by: org, unit: streams}
  assistant_tokens_per_ip: {limit: 5000, window: day, by: ip, unit: tokens}
routes:
  - name: assistant_message
    limits: [assistant_per_key, assistant_per_org, assistant_per_ip, assistant_tokens_per_org, assistant_streams_per_org, assistant_tokens_per_ip]
self_usage: {prefix_mode_exposes: [key, org]} # prefix mode: the limits by key and org too
`

// One answer of the endpoint is one script call on Redis, whatever the number of limits
// (MONITOR sees it and nothing else), and one per node holding one of its counters on a
// Cluster (INFO commandstats of every node).
func TestSelfUsageOneRoundTrip(t *testing.T) {
	t.Parallel()
	const key = "svc_dsc_roundtrip0123456789abcdefgh"
	q := "route=assistant_message&domain=acme-docs"
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Start(t)
		// redis.timeout 2s: exact counts are checked, not the timeout (exactTimeout).
		p := startGateway(t, "http://127.0.0.1:1", fmt.Sprintf("redis: {addrs: [%q], timeout: 2s}\n", srv.Addr)+roundTripConfig)
		selfUsage(t, p, q, key, 200) // connections and scripts are warm
		lines, stop := watchMonitor(t, srv.Addr)
		a, _, _ := selfUsage(t, p, q, key, 200)
		if len(a.Limits) != 6 {
			t.Fatalf("%+v", a)
		}
		time.Sleep(300 * time.Millisecond)
		stop()
		scripts, other := splitMonitor(lines)
		if len(scripts) != 1 || len(other) != 0 {
			t.Fatalf("one answer of six limits: script calls %q, other commands %q; want one script call", scripts, other)
		}
		for _, name := range []string{"assistant_per_key", "assistant_per_org", "assistant_per_ip", "assistant_tokens_per_org", "assistant_streams_per_org", "assistant_tokens_per_ip"} {
			if !strings.Contains(scripts[0], name) {
				t.Errorf("the script call does not read %s: %s", name, scripts[0])
			}
		}
	})
	t.Run("cluster", func(t *testing.T) {
		cl := redistest.StartCluster(t, 3)
		// redis.timeout 2s: exact counts are checked, not the timeout (exactTimeout).
		p := startGateway(t, "http://127.0.0.1:1", fmt.Sprintf("redis: {addrs: [%s], timeout: 2s}\n", quoteAll(cl.Addrs))+roundTripConfig)
		selfUsage(t, p, q, key, 200)
		// The masters of the counters' hash tags: the key's digest, the org, the address.
		cc := cl.Client(t)
		holding := map[string]bool{}
		for _, id := range []string{auth.Digest(key), "acme", "127.0.0.1"} {
			m, err := cc.MasterForKey(t.Context(), "{"+id+"}")
			if err != nil {
				t.Fatal(err)
			}
			holding[m.Options().Addr] = true
		}
		t.Logf("masters holding the counters: %v", holding)
		calls := func() map[string]int {
			out := map[string]int{}
			for _, s := range cl.Servers {
				out[s.Addr] = redistest.ScriptCalls(t, s.Client(t))
			}
			return out
		}
		before := calls()
		const n = 5
		for range n {
			selfUsage(t, p, q, key, 200)
		}
		after := calls()
		for _, s := range cl.Servers {
			want := 0
			if holding[s.Addr] {
				want = n
			}
			if got := after[s.Addr] - before[s.Addr]; got != want {
				t.Errorf("node %s ran %d script calls for %d answers, want %d (nodes holding counters: %v)", s.Addr, got, n, want, holding)
			}
		}
	})
}

// The forecast against a known burn: ten requests two seconds into a 20-second window of 40
// burn 10 per 2 s (18,000 an hour), so the 30 left last 6 s more, before the window ends; read
// again 14 s in, the same ten make 30 last 42 s, past the end: no runs_out_at.
func TestSelfUsageForecastOfAKnownBurn(t *testing.T) {
	t.Parallel()
	const key = "svc_forecast0123456789abcdefghijkl"
	up := serveHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(201) }))
	for _, st := range holdStores() {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel() // each waits for the same moments of a window: most of the test is sleep
			// Prefix mode: the limits by project are shown where the operator opts in.
			p := startGateway(t, up, st.redis(t)+"limits:\n  agent_job_per_project: {limit: 40, window: 20s}\nself_usage: {prefix_mode_exposes: [project]}\n")
			// Two seconds into a window (windows of a duration start at its multiples).
			now := time.Now()
			ws := now.Truncate(20 * time.Second)
			if now.Sub(ws) > 2*time.Second {
				ws = ws.Add(20 * time.Second)
			}
			time.Sleep(time.Until(ws.Add(2 * time.Second)))
			for range 10 {
				if res := send(t, p, "POST", "/v2/agent/burn/job", key, `{"prompt":"x"}`); res.StatusCode != 201 {
					t.Fatalf("burn: %d", res.StatusCode)
				}
			}
			read := func() (selfLimit, time.Time, time.Time) {
				t0 := time.Now()
				a, body, _ := selfUsage(t, p, "route=agent_job&projectId=burn", key, 200)
				t1 := time.Now()
				l := a.limit(t, "agent_job_per_project")
				if l.Used != 10 || l.Remaining != 30 || l.Forecast == nil || l.Reset != ws.Add(20*time.Second).UTC().Format(time.RFC3339) {
					t.Fatalf("%s", body)
				}
				return l, t0, t1
			}
			l, t0, t1 := read()
			if t1.Sub(ws) > 8*time.Second {
				t.Skipf("the machine is too slow for this window: read %v into it", t1.Sub(ws))
			}
			lo, hi := 10/t1.Sub(ws).Hours(), 10/t0.Sub(ws).Hours()
			if r := l.Forecast.RatePerHour; r < lo-0.001 || r > hi+0.001 {
				t.Errorf("rate %v an hour, want %.0f to %.0f", r, lo, hi)
			}
			if l.Forecast.RunsOutAt == nil {
				t.Fatalf("no runs_out_at: %+v", l.Forecast)
			}
			at, err := time.Parse(time.RFC3339, *l.Forecast.RunsOutAt)
			earliest := t0.Add(time.Duration(30 / hi * float64(time.Hour))).Truncate(time.Second)
			latest := t1.Add(time.Duration(30 / lo * float64(time.Hour)))
			if err != nil || at.Before(earliest) || at.After(latest) {
				t.Errorf("runs out at %s, want %s to %s", *l.Forecast.RunsOutAt, earliest.UTC().Format(time.RFC3339), latest.UTC().Format(time.RFC3339))
			}
			time.Sleep(time.Until(ws.Add(14 * time.Second)))
			l, t0, t1 = read()
			lo, hi = 10/t1.Sub(ws).Hours(), 10/t0.Sub(ws).Hours()
			if r := l.Forecast.RatePerHour; r < lo-0.001 || r > hi+0.001 || l.Forecast.RunsOutAt != nil {
				t.Errorf("14 s in: %+v %v, want a rate of %.0f to %.0f and no runs_out_at", *l.Forecast, l.Forecast.RunsOutAt, lo, hi)
			}
		})
	}
}

// Real Chromium on an allowed origin reads the endpoint cross-origin, as a documentation site's
// chat widget would (the key in Authorization makes the browser send a preflight first), and a
// refusal of its query too; the same page cannot read an answer about an admin route, and a
// page of another origin reads nothing.
func TestSelfUsageBrowserCrossOrigin(t *testing.T) {
	t.Parallel()
	browser := browsertest.Start(t)
	serve := func(host string) (string, func(page string)) {
		ln, err := net.Listen("tcp", host+":0")
		if err != nil {
			t.Fatal(err)
		}
		var body atomic.Value
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			fmt.Fprint(w, body.Load())
		})}
		go srv.Serve(ln)
		t.Cleanup(func() { srv.Close() })
		return "http://" + ln.Addr().String(), func(page string) { body.Store(page) }
	}
	allowed, setAllowed := serve("127.0.0.2")
	other, setOther := serve("127.0.0.3")
	p := startGateway(t, "http://127.0.0.1:1", fmt.Sprintf("cors: {allowed_origins: [%q]}\nlimits:\n  assistant_per_ip: {limit: 50, window: hour}\n", allowed))
	page := `<!doctype html><html><body><script>
(async () => {
  const ask = async (query, key) => {
    try {
      const res = await fetch("http://` + p.public + `/gateway/usage?" + query, {headers: {"Authorization": "Bearer " + key}});
      return {status: res.status, body: await res.json(), cache: res.headers.get("cache-control")};
    } catch (e) {
      return {error: String(e)};
    }
  };
  window.result = {
    usage: await ask("route=assistant_message_v2&domain=acme-docs", "svc_dsc_browserwidget0123456789abc"),
    refused: await ask("route=assistant_message_v2", "svc_dsc_browserwidget0123456789abc"),
    admin: await ask("route=agent_job&projectId=p1", "svc_browseradmin0123456789abcdefgh"),
  };
  document.title = "done";
})();
</script></body></html>`
	setAllowed(page)
	setOther(page)
	type answer struct {
		Status int
		Error  string
		Cache  string
		Body   struct {
			Route  string
			Code   string
			Field  string
			Limits []selfLimit
		}
	}
	var got struct{ Usage, Refused, Admin answer }
	read := func(origin string) {
		tab := browser.Open(t, origin+"/", nil)
		tab.WaitFor(t, `document.title === "done"`, 30*time.Second)
		var raw string
		tab.Eval(t, `JSON.stringify(window.result)`, &raw)
		if err := json.Unmarshal([]byte(raw), &got); err != nil {
			t.Fatalf("%v: %s", err, raw)
		}
	}
	read(allowed)
	u := got.Usage
	// Prefix mode with the defaults: the visitor's own address's limit only.
	if u.Error != "" || u.Status != 200 || u.Cache != "no-store" || u.Body.Route != "assistant_message_v2" || len(u.Body.Limits) != 1 {
		t.Fatalf("the widget's read: %+v", got.Usage)
	}
	if o := u.Body.Limits[0]; o.Name != "assistant_per_ip" || o.Limit != 50 || o.Used != 0 || o.Remaining != 50 {
		t.Fatalf("per ip: %+v", o)
	}
	if r := got.Refused; r.Status != 400 || r.Body.Code != "invalid_request" || r.Body.Field != "domain" {
		t.Fatalf("the refusal, read by the page: %+v", r)
	}
	if a := got.Admin; a.Error == "" {
		t.Fatalf("a page read an answer about an admin route: %+v", a)
	}
	read(other)
	if got.Usage.Error == "" || got.Refused.Error == "" {
		t.Fatalf("a page of another origin read the endpoint: %+v", got)
	}
	// The allowed page's preflights were answered by the gateway.
	preflights := 0
	for _, l := range accessLines(p) {
		if l["route"] == "cors_preflight" && l["status"] == float64(204) {
			preflights++
		}
	}
	if preflights == 0 {
		t.Fatalf("no preflight answered:\n%s", p.out.String())
	}
}
