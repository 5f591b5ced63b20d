package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// visitorsConfig is what the visitor-flood tests share: addresses from X-Forwarded-For behind
// the loopback proxy, the org acme on a plan of 20 requests (the tenant whose events are
// owed), and the other limits out of the way of a flood through one key and one domain.
const visitorsConfig = `admin_token: "admin-token-0123456789"
client_ip: {trusted_proxies: ["127.0.0.1/32"]}
orgs: {acme: {domains: [acme-docs], plan: small}}
plans: {small: {assistant_per_org: {limit: 20}}}
limits:
  assistant_per_org: {limit: 1000000}
  assistant_per_key: {limit: 1000000}
`

// visitorClient posts assistant messages through gateways as visitors at many addresses.
type visitorClient struct {
	gws    []*proc
	client *http.Client
}

func newVisitorClient(gws []*proc) *visitorClient {
	return &visitorClient{gws: gws, client: &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 32}}}
}

// assistantFrom is an assistant message (v1) to domain with key, from the client address ip
// as a trusted proxy in front of the gateway at public says (X-Forwarded-For).
func assistantFrom(public, domain, key, ip string) *http.Request {
	req, _ := http.NewRequest("POST", "http://"+public+"/discovery/v1/assistant/"+domain+"/message", strings.NewReader(`{"fp":"a","messages":[]}`))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Forwarded-For", ip)
	return req
}

// send posts one message to domain with key from ip through the i-th gateway (in turn).
func (v *visitorClient) send(t *testing.T, i int, domain, key, ip string) int {
	res, err := v.client.Do(assistantFrom(v.gws[i%len(v.gws)].public, domain, key, ip))
	if err != nil {
		t.Error(err)
		return 0
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode
}

// flood sends reqs requests from each of n addresses (10.x.y.z) to crowd-docs, from 16
// senders, each address's requests one after another; mid is called once half the addresses
// are done. It returns the statuses.
func (v *visitorClient) flood(t *testing.T, n, reqs int, mid func()) map[int]int {
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	var once sync.Once
	const senders = 16
	for w := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += senders {
				if i >= n/2 && mid != nil {
					once.Do(mid)
				}
				ip := fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)
				for r := range reqs {
					code := v.send(t, i+r, "crowd-docs", "svc_dsc_crowd", ip)
					mu.Lock()
					codes[code]++
					mu.Unlock()
				}
			}
		}()
	}
	wg.Wait()
	return codes
}

// acme sends n requests of the tenant acme, each from an address of its own (172.16.x.y from
// first on), and checks their statuses: admitted up to its plan's 20, then 429.
func (v *visitorClient) acme(t *testing.T, first, n int) {
	for i := first; i < first+n; i++ {
		want := 200
		if i >= 20 {
			want = 429
		}
		if code := v.send(t, i, "acme-docs", "svc_dsc_acme", fmt.Sprintf("172.16.%d.%d", i>>8&255, i&255)); code != want {
			t.Errorf("acme's request %d: %d, want %d", i+1, code, want)
		}
	}
}

// A limit by ip that sets nothing sends nothing, whatever the crowd: 300 addresses each run
// out of assistant_per_ip (its counter crossing 0.8, 1.0 and its first refusal), in process
// and on two replicas sharing Redis, while acme crosses its own thresholds. The endpoint,
// which takes every event of every limit, receives acme's three events and not one of the
// visitors'.
func TestVisitorLimitsQuietByDefault(t *testing.T) {
	t.Parallel()
	up := tokenUpstream(t)
	for _, st := range holdStores()[:2] {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			recv := newGateReceiver(t)
			recv.open.Store(true)
			cfg := visitorsConfig + "  assistant_per_ip: {limit: 2}\n" +
				fmt.Sprintf("notifications:\n  webhooks:\n    - {name: h, url: %q, secret: %q, allow_private_addresses: true}\n", recv.url+"/h", hookSecret)
			v := newVisitorClient(startReplicas(t, up, st, cfg))
			codes := v.flood(t, 300, 3, func() { v.acme(t, 0, 21) })
			if codes[200] != 600 || codes[429] != 300 {
				t.Fatalf("the crowd's answers: %v, want 600 admitted and 300 refused", codes)
			}
			recv.waitTenantEvents(t, map[string]int{
				"quota.threshold_crossed assistant_per_org acme 0.8": 1,
				"quota.threshold_crossed assistant_per_org acme 1":   1,
				"quota.exhausted assistant_per_org acme":             1,
			}, time.Now().Add(15*time.Second))
			time.Sleep(time.Second) // a visitor's event written with acme's would be delivered by now
			if n := recv.visitors.Load(); n != 0 {
				t.Fatalf("%d visitors' events delivered; a limit by ip that sets nothing sends none", n)
			}
		})
	}
}

// outboxHeld is what the outbox holds, pending and dead, as the admin API of p reads it.
func outboxHeld(t *testing.T, p *proc) int {
	t.Helper()
	code, body := adminGet(t, p, "/notifications?state=pending&n=1", adminToken)
	var c struct{ Pending, Dead int }
	if code != 200 || json.Unmarshal([]byte(body), &c) != nil {
		t.Fatalf("/notifications: %d %s", code, body)
	}
	return c.Pending + c.Dead
}

// A flood of 6,000 visitor addresses through the binary, each crossing both thresholds its
// per-IP limit sets (12,000 events, each for ten endpoints: 120,000 deliveries, past the
// outbox's bound of 100,000), in process and on two replicas sharing Redis, every
// notification setting at its default. acme's event owed from before the flood (the
// endpoints answering 503) is not evicted, and the events acme makes in the middle of the
// flood are not dropped: once the endpoints answer, all three reach each endpoint. The
// visitors' drops are counted and logged in a line a second at most; the tenants' are none.
func TestVisitorFloodThroughBinary(t *testing.T) {
	t.Parallel()
	up := tokenUpstream(t)
	for _, st := range holdStores()[:2] {
		t.Run(st.name, func(t *testing.T) {
			recv := newGateReceiver(t)
			var hooks strings.Builder
			for i := range 10 {
				fmt.Fprintf(&hooks, "    - {name: h%d, url: %q, secret: %q, allow_private_addresses: true}\n", i, fmt.Sprintf("%s/h%d", recv.url, i), hookSecret)
			}
			cfg := visitorsConfig + "  assistant_per_ip: {limit: 2, thresholds: [0.5, 1.0]}\nnotifications:\n  webhooks:\n" + hooks.String()
			gws := startReplicas(t, up, st, cfg)
			v := newVisitorClient(gws)
			start := time.Now()
			v.acme(t, 0, 16) // 0.8 of 20
			const visitors = 6000
			codes := v.flood(t, visitors, 2, func() { v.acme(t, 16, 5) })
			if codes[200] != 2*visitors {
				t.Fatalf("the crowd's answers: %v", codes)
			}
			// Written: what the outbox holds settles at its bound.
			last, since := -1, time.Now()
			for time.Since(since) < time.Second {
				if h := outboxHeld(t, gws[0]); h != last {
					last, since = h, time.Now()
				}
				time.Sleep(50 * time.Millisecond)
			}
			if last != outboxMax {
				t.Errorf("the outbox holds %d after the flood, want its bound %d", last, outboxMax)
			}
			flood := time.Since(start)

			recv.open.Store(true)
			want := map[string]int{}
			for _, k := range []string{"quota.threshold_crossed assistant_per_org acme 0.8", "quota.threshold_crossed assistant_per_org acme 1",
				"quota.exhausted assistant_per_org acme"} {
				want[k] = 10
			}
			// Pending since before the flood, acme's first event waits its next attempt: the
			// backoff doubles from 1 s while the endpoints answer 503.
			recv.waitTenantEvents(t, want, time.Now().Add(2*flood+30*time.Second))

			visitorDrops := 0.0
			for _, p := range gws {
				for k, n := range scrape(t, p) {
					switch {
					case !strings.HasPrefix(k, "gateway_notifications_dropped_total{"):
					case strings.Contains(k, `limit="assistant_per_ip"`):
						visitorDrops += n
					case n != 0:
						t.Errorf("%s = %v: a tenant's notification dropped", k, n)
					}
				}
				lines := strings.Count(p.out.String(), "notifications dropped")
				if lines == 0 || float64(lines) > flood.Seconds()+2 {
					t.Errorf("%d log lines about drops in %v, want one a second at most", lines, flood)
				}
			}
			if visitorDrops < 2*visitors*10-outboxMax {
				t.Errorf("%v visitors' notifications counted as dropped, want at least %d", visitorDrops, 2*visitors*10-outboxMax)
			}
		})
	}
}
