package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/engine"
	"github.com/docsgate/gateway/internal/redistest"
	"github.com/docsgate/gateway/metrics"
	"github.com/docsgate/gateway/notify"
)

// gateReceiver is a webhook server on 127.0.0.1 that answers 503 until opened, then verifies
// and records every delivery: the tenants' events by id and path (one path per endpoint),
// the visitors' (by ip) counted.
type gateReceiver struct {
	url      string
	open     atomic.Bool
	mu       sync.Mutex
	tenants  map[string][]notify.Event
	visitors atomic.Int64
}

func newGateReceiver(t *testing.T) *gateReceiver {
	keys, err := config.ParseSecrets(hookSecret)
	if err != nil {
		t.Fatal(err)
	}
	g := &gateReceiver{tenants: map[string][]notify.Event{}}
	g.url = serveHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !g.open.Load() {
			w.WriteHeader(503)
			return
		}
		var ev notify.Event
		if err := notify.Verify(keys, r.Header, body, time.Now(), 5*time.Minute); err != nil || json.Unmarshal(body, &ev) != nil {
			t.Errorf("a delivery that does not verify: %v %s", err, body)
			w.WriteHeader(400)
			return
		}
		if d, _ := ev.Data.(map[string]any); d["by"] == "ip" {
			g.visitors.Add(1)
		} else {
			g.mu.Lock()
			g.tenants[r.URL.Path+" "+ev.ID] = append(g.tenants[r.URL.Path+" "+ev.ID], ev)
			g.mu.Unlock()
		}
		w.WriteHeader(204)
	}))
	return g
}

// tenantEvents are the tenants' events received, by eventKey, each id once per endpoint;
// and whether an id came twice to one endpoint.
func (g *gateReceiver) tenantEvents() (map[string]int, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	n, twice := map[string]int{}, false
	for _, evs := range g.tenants {
		n[eventKey(evs[0])]++
		twice = twice || len(evs) > 1
	}
	return n, twice
}

// waitTenantEvents waits until the tenants' events received are want, each id once per
// endpoint, failing the test at deadline.
func (g *gateReceiver) waitTenantEvents(t *testing.T, want map[string]int, deadline time.Time) {
	t.Helper()
	for {
		got, twice := g.tenantEvents()
		if fmt.Sprint(got) == fmt.Sprint(want) && !twice {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("tenants' events received %v (an id twice: %v), want %v; visitors' received %d", got, twice, want, g.visitors.Load())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// gathered returns every sample of reg as "name{label=value,...}" -> value.
func gathered(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			sort.Strings(ls)
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
			out[f.GetName()+"{"+strings.Join(ls, ",")+"}"] = v
		}
	}
	return out
}

// 100,000 visitor addresses cross both per-IP thresholds (200,000 events) while tenants'
// events are owed, on Redis and in process, with every notification bound at its default:
// three tenant events pending from before the flood (the endpoint answering 503) are not
// evicted when the visitors' pass the outbox's bound of 100,000, and a tenant crossing in the
// middle of an unpaced burst of 20,000 visitors (past the queue's bound) is not dropped. Once
// the endpoint answers, all five tenant events arrive, each once. The visitors' drops are
// counted by limit and reason, the tenants' are none, and they are logged once a second at
// most.
func TestVisitorFloodKeepsTenantEvents(t *testing.T) {
	t.Parallel()
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) { testVisitorFlood(t, store) })
	}
}

func testVisitorFlood(t *testing.T, store string) {
	recv := newGateReceiver(t)
	body := "limits:\n  assistant_per_ip: {thresholds: [0.5, 1.0]}\n" +
		fmt.Sprintf("notifications:\n  webhooks:\n    - {name: h, url: %q, secret: %q, allow_private_addresses: true}\n", recv.url, hookSecret)
	if store == "redis" {
		body = fmt.Sprintf("redis: {addrs: [%q]}\n", redistest.Start(t).Addr) + body
	}
	cfg, err := loadConfig(writeConfig(t, "upstream: {url: 'http://127.0.0.1:1'}\n"+body))
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	core, logs := observer.New(zap.InfoLevel)
	nt := newNotifier(cfg, metrics.New(reg), zap.New(core))
	ctx, cancel := context.WithCancel(context.Background())
	nt.start(ctx, nil, nil)
	t.Cleanup(func() { cancel(); nt.close() })

	window := time.Now().UTC().Truncate(time.Hour)
	tenant := func(limit, by, id string, used int64, thresholds []float64, exhausted bool) engine.Crossing {
		return engine.Crossing{Limit: limit, Tenant: id, By: by, Org: id, WindowStart: window, Used: used, Quota: 10,
			Thresholds: thresholds, Exhausted: exhausted, Time: time.Now()}
	}
	visitor := func(i int) engine.Crossing {
		return engine.Crossing{Limit: "assistant_per_ip", Tenant: fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255), By: "ip",
			WindowStart: window, Used: 10, Quota: 10, Thresholds: []float64{0.5, 1}, Time: time.Now()}
	}
	held := func() int {
		p, d, err := nt.box.Count(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return p + d
	}
	// reach waits until the outbox holds want (the writer is done), and returns what it holds.
	// It gives up only once the outbox has not changed for stalled: a busy machine slows the
	// writer (a flood took 2.5 minutes beside three other test runs), a stuck one stops it.
	reach := func(want int, stalled time.Duration) int {
		last, since := held(), time.Now()
		for last != want && time.Since(since) < stalled {
			time.Sleep(20 * time.Millisecond)
			if h := held(); h != last {
				last, since = h, time.Now()
			}
		}
		return last
	}
	// drained waits until the writer has taken every queued crossing: it paces the flood as a
	// replica's requests over time would, whatever the writer's speed on this machine (paced
	// by a fixed quiet time instead, a slow machine dropped so many at the queue that the
	// outbox never reached its bound).
	drained := func() {
		for {
			nt.mu.Lock()
			n := nt.queue.Len()
			nt.mu.Unlock()
			if n == 0 {
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}

	// Owed before the flood: pending, each attempt answered 503.
	nt.crossed(tenant("assistant_per_org", "org", "acme", 8, []float64{0.8}, false))
	nt.crossed(tenant("assistant_per_org", "org", "acme", 10, []float64{1}, false))
	nt.crossed(tenant("agent_job_per_project", "project", "p1", 10, nil, true))
	if h := reach(3, 30*time.Second); h != 3 {
		t.Fatalf("outbox holds %d before the flood, want 3", h)
	}
	start := time.Now()
	// The flood, 4,000 addresses at a time paced by the writer (a replica's requests arrive
	// over time), and in the middle an unpaced burst of 20,000, a tenant crossing halfway
	// through it.
	const visitors, burst = 100_000, 20_000
	for i := 0; i < visitors; {
		if i == (visitors-burst)/2 {
			for j := range burst {
				if j == burst/2 {
					nt.crossed(tenant("assistant_per_org", "org", "globex", 8, []float64{0.8}, false))
				}
				nt.crossed(visitor(i + j))
			}
			i += burst
			continue
		}
		for j := range 4000 {
			nt.crossed(visitor(i + j))
		}
		i += 4000
		drained()
	}
	nt.crossed(tenant("assistant_per_org", "org", "globex", 10, nil, true))
	// Written: the outbox is at its bound, the visitors' deliveries having passed it.
	if h := reach(outboxMax, 30*time.Second); h != outboxMax {
		t.Errorf("outbox holds %d after the flood, want its bound %d", h, outboxMax)
	}
	flood := time.Since(start)

	m := gathered(t, reg)
	for _, reason := range []string{"queue_full", "outbox_full"} {
		if n := m["gateway_notifications_dropped_total{limit=assistant_per_ip,reason="+reason+"}"]; n == 0 {
			t.Errorf("no visitor's notification dropped for %s: %v", reason, n)
		}
	}
	for k, v := range m {
		if strings.HasPrefix(k, "gateway_notifications_dropped_total") && !strings.Contains(k, "limit=assistant_per_ip,") && v != 0 {
			t.Errorf("%s = %v: a tenant's notification dropped", k, v)
		}
	}
	lines := logs.FilterMessageSnippet("dropped").Len()
	if lines == 0 || float64(lines) > flood.Seconds()+2 {
		t.Errorf("%d log lines about drops in %v, want one a second at most", lines, flood)
	}

	recv.open.Store(true)
	want := map[string]int{
		"quota.threshold_crossed assistant_per_org acme 0.8":   1,
		"quota.threshold_crossed assistant_per_org acme 1":     1,
		"quota.exhausted agent_job_per_project p1":             1,
		"quota.threshold_crossed assistant_per_org globex 0.8": 1,
		"quota.exhausted assistant_per_org globex":             1,
	}
	// The pending ones are retried after their backoff, which grew while the endpoint
	// answered 503 (doubling from 1 s; at most the time they have waited).
	recv.waitTenantEvents(t, want, time.Now().Add(2*time.Since(start)+30*time.Second))
	t.Logf("%s: flood of %d addresses written in %v", store, visitors, flood.Round(time.Millisecond))
}
