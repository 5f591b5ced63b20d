package notify

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docsgate/gateway/internal/redistest"
)

// receiver is an endpoint on 127.0.0.1 that verifies every delivery's signature as a
// Standard Webhooks receiver does, and answers what answer says for the n-th request of an id.
// A loopback address: the endpoints delivering to it allow private addresses.
type receiver struct {
	t      *testing.T
	srv    *httptest.Server
	keys   [][]byte
	answer func(id string, n int) int

	mu    sync.Mutex
	seen  map[string]int // id -> requests
	bad   int
	order []string
}

func newReceiver(t *testing.T, keys [][]byte, answer func(id string, n int) int) *receiver {
	r := &receiver{t: t, keys: keys, answer: answer, seen: map[string]int{}}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		id := req.Header.Get(HeaderID)
		var ev Event
		err := Verify(r.keys, req.Header, body, time.Now(), 5*time.Minute)
		if err == nil {
			err = json.Unmarshal(body, &ev)
		}
		r.mu.Lock()
		if err != nil || ev.ID != id || req.Method != http.MethodPost || req.Header.Get("Content-Type") != "application/json" {
			r.bad++
			r.mu.Unlock()
			t.Errorf("a delivery that does not verify: %v %s %s", err, req.Method, body)
			w.WriteHeader(400)
			return
		}
		r.seen[id]++
		n := r.seen[id]
		r.order = append(r.order, id)
		r.mu.Unlock()
		code := 200
		if r.answer != nil {
			code = r.answer(id, n)
		}
		w.WriteHeader(code)
		fmt.Fprint(w, "receiver says hello")
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) count(id string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen[id]
}

func (r *receiver) total() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.order)
}

type results struct {
	mu sync.Mutex
	m  map[string][]string // id -> results in order
}

func (rs *results) on(d Delivery, result string, _ time.Duration) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if rs.m == nil {
		rs.m = map[string][]string{}
	}
	rs.m[d.ID] = append(rs.m[d.ID], result)
}

func (rs *results) of(id string) string {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return strings.Join(rs.m[id], ",")
}

func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", within, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func run(t *testing.T, n *Notifier) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { n.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

func fast(o Options) Options {
	o.MaxBackoff, o.Poll = 40*time.Millisecond, 10*time.Millisecond
	if o.Timeout == 0 {
		o.Timeout = 2 * time.Second
	}
	return o
}

// Failed attempts are retried with the same id (and body) until the endpoint accepts one,
// each signed anew; events go only to the endpoints that take their type and limit.
func TestDeliveryRetriesUntilAccepted(t *testing.T) {
	outboxes(t, 100, func(t *testing.T, box Outbox) {
		keys := vectorKeys(t)
		recv := newReceiver(t, keys, func(id string, n int) int {
			switch {
			case id == "evt_1" && n == 1:
				return 500
			case id == "evt_1" && n == 2:
				return 503
			}
			return 204
		})
		other := newReceiver(t, keys, nil)
		var rs results
		n := New(box, []Endpoint{
			{Name: "billing", URL: recv.srv.URL + "/hook?token=abc", Keys: keys, AllowPrivate: true},
			{Name: "ops", URL: other.srv.URL, Keys: keys, AllowPrivate: true, Events: []string{"quota.exhausted"}, Limits: []string{"assistant_per_org"}},
		}, fast(Options{OnResult: rs.on}))
		run(t, n)
		ctx := context.Background()
		ev := Event{Type: "quota.threshold_crossed", ID: "evt_1", Time: t0, Data: map[string]any{"limit": "assistant_per_org", "threshold": 0.8}}
		if _, err := n.Publish(ctx, limited(ev, "assistant_per_org")); err != nil {
			t.Fatal(err)
		}
		if _, err := n.Publish(ctx, limited(Event{Type: "quota.exhausted", ID: "evt_2", Data: map[string]any{}}, "assistant_per_key")); err != nil {
			t.Fatal(err)
		}
		if _, err := n.Publish(ctx, limited(Event{Type: "quota.exhausted", ID: "evt_3", Data: map[string]any{}}, "assistant_per_org")); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 5*time.Second, "evt_1 accepted", func() bool { return rs.of("evt_1") == "failed,failed,delivered" })
		waitFor(t, 5*time.Second, "evt_3 to ops", func() bool { return other.count("evt_3") == 1 })
		waitFor(t, 5*time.Second, "outbox empty", func() bool { p, d, _ := box.Count(ctx); return p == 0 && d == 0 })
		if recv.count("evt_1") != 3 || other.count("evt_1") != 0 || other.count("evt_2") != 0 || recv.count("evt_2") != 1 || recv.count("evt_3") != 1 {
			t.Fatalf("billing %v, ops %v", recv.seen, other.seen)
		}
	})
}

// Retried for retry_for, then a dead letter; 410 Gone is a dead letter at once; a redirect is
// not followed; an answer slower than the timeout is a failed attempt.
func TestDeadLetters(t *testing.T) {
	outboxes(t, 100, func(t *testing.T, box Outbox) {
		keys := vectorKeys(t)
		var redirected int
		var mu sync.Mutex
		target := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { mu.Lock(); redirected++; mu.Unlock() }))
		t.Cleanup(target.Close)
		recv := newReceiver(t, keys, func(id string, _ int) int {
			switch id {
			case "evt_gone":
				return 410
			case "evt_slow":
				time.Sleep(300 * time.Millisecond)
			}
			return 500
		})
		redirect := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, target.URL, http.StatusTemporaryRedirect)
		}))
		t.Cleanup(redirect.Close)
		var rs results
		n := New(box, []Endpoint{{Name: "h", URL: recv.srv.URL, Keys: keys, AllowPrivate: true, Events: []string{"quota.exhausted"}}, {Name: "moved", URL: redirect.URL, Keys: keys, AllowPrivate: true, Events: []string{"ping"}}},
			fast(Options{RetryFor: 400 * time.Millisecond, Timeout: 100 * time.Millisecond, OnResult: rs.on}))
		run(t, n)
		ctx := context.Background()
		for _, id := range []string{"evt_gone", "evt_down", "evt_slow"} {
			if _, err := n.Publish(ctx, limited(Event{Type: "quota.exhausted", ID: id, Data: map[string]any{}}, "l")); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := n.Publish(ctx, limited(Event{Type: "ping", ID: "evt_moved", Data: map[string]any{}}, "")); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 5*time.Second, "four dead letters", func() bool { _, d, _ := box.Count(ctx); return d == 4 })
		// A delivery's result is reported after the outbox took it in: wait for the last ones.
		waitFor(t, 5*time.Second, "the dead letters' results", func() bool {
			return strings.HasSuffix(rs.of("evt_gone"), "dead") && strings.HasSuffix(rs.of("evt_down"), "dead") && strings.HasSuffix(rs.of("evt_slow"), "dead")
		})
		if got := rs.of("evt_gone"); got != "dead" {
			t.Fatalf("410: %s", got)
		}
		for _, id := range []string{"evt_down", "evt_slow"} {
			if got := rs.of(id); !strings.HasPrefix(got, "failed,") || !strings.HasSuffix(got, ",dead") {
				t.Fatalf("%s: %s", id, got)
			}
		}
		dead, err := box.List(ctx, true, 10)
		if err != nil {
			t.Fatal(err)
		}
		why := map[string]string{}
		for _, d := range dead {
			why[d.ID] = d.LastError
			if d.Attempts < 1 || !d.Dead {
				t.Errorf("%+v", d)
			}
		}
		if why["evt_gone"] != "answered 410" || why["evt_down"] != "answered 500" || why["evt_slow"] != "no answer within 100ms" || why["evt_moved"] != "answered 307" {
			t.Fatalf("last errors: %v", why)
		}
		mu.Lock()
		defer mu.Unlock()
		if redirected != 0 {
			t.Fatal("a redirect was followed")
		}
	})
}

func TestBackoff(t *testing.T) {
	for _, j := range []float64{0, 0.5, 0.999} {
		n := New(NewMemory(1), nil, Options{MaxBackoff: 5 * time.Minute, Jitter: func() float64 { return j }})
		prev := time.Duration(0)
		for a := 1; a <= 60; a++ {
			w := n.Backoff(a, 0)
			base := 5 * time.Minute
			if a <= 9 { // 2^8 s > 5 min
				base = min(time.Second<<(a-1), base)
			}
			if w < base/2 || w > base || w < prev {
				t.Fatalf("jitter %v attempt %d: %s (base %s, previous %s)", j, a, w, base, prev)
			}
			prev = w
		}
		if w := n.Backoff(1, 30*time.Second); w != 30*time.Second {
			t.Fatalf("Retry-After: %s", w)
		}
		if w := n.Backoff(1, time.Hour); w != 5*time.Minute {
			t.Fatalf("Retry-After beyond max_backoff: %s", w)
		}
	}
}

// A replica that claimed deliveries and died (SIGKILL: its claims are never settled) leaves
// them to the live one once the lease runs out; two live replicas sharing the outbox deliver
// every event once.
func TestTakeoverAndSharing(t *testing.T) {
	srv := redistest.Start(t)
	keys := vectorKeys(t)
	recv := newReceiver(t, keys, nil)
	eps := []Endpoint{{Name: "h", URL: recv.srv.URL, Keys: keys, AllowPrivate: true}}
	ctx := context.Background()

	dead := NewRedis(srv.Client(t), "gw", 1000)
	gone := New(dead, eps, fast(Options{}))
	for i := range 5 {
		if _, err := gone.Publish(ctx, limited(Event{Type: "ping", ID: fmt.Sprintf("evt_k%d", i), Data: map[string]any{}}, "")); err != nil {
			t.Fatal(err)
		}
	}
	claimed, err := dead.Claim(ctx, time.Now(), 10, 500*time.Millisecond)
	if err != nil || len(claimed) != 5 {
		t.Fatalf("%d claimed: %v", len(claimed), err)
	}
	start := time.Now()
	a := New(NewRedis(srv.Client(t), "gw", 1000), eps, fast(Options{}))
	b := New(NewRedis(srv.Client(t), "gw", 1000), eps, fast(Options{}))
	run(t, a)
	run(t, b)
	waitFor(t, 5*time.Second, "the dead replica's events delivered", func() bool { return recv.total() == 5 })
	if took := time.Since(start); took < 400*time.Millisecond {
		t.Fatalf("delivered after %s, before the lease ran out", took)
	}
	for i := range 200 {
		p := a
		if i%2 == 1 {
			p = b
		}
		if _, err := p.Publish(ctx, limited(Event{Type: "ping", ID: fmt.Sprintf("evt_s%d", i), Data: map[string]any{}}, "")); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 10*time.Second, "205 deliveries", func() bool { return recv.total() >= 205 })
	time.Sleep(100 * time.Millisecond)
	recv.mu.Lock()
	defer recv.mu.Unlock()
	if len(recv.order) != 205 || len(recv.seen) != 205 || recv.bad != 0 {
		t.Fatalf("%d requests for %d ids (%d bad)", len(recv.order), len(recv.seen), recv.bad)
	}
}

// Send is one signed attempt whose answer is returned (the test command prints it).
func TestSend(t *testing.T) {
	keys := vectorKeys(t)
	recv := newReceiver(t, keys, func(string, int) int { return 202 })
	n := New(NewMemory(1), nil, Options{})
	a := n.Send(context.Background(), &Endpoint{Name: "h", URL: recv.srv.URL, Keys: keys, AllowPrivate: true}, "evt_ping", []byte(`{"type":"ping","id":"evt_ping","time":"2026-11-27T09:00:00Z","data":{}}`))
	if !a.OK() || a.Status != 202 || string(a.Body) != "receiver says hello" {
		t.Fatalf("%+v", a)
	}
	a = n.Send(context.Background(), &Endpoint{Name: "h", URL: "http://127.0.0.1:1/", Keys: keys, AllowPrivate: true}, "evt_ping", []byte(`{}`))
	if a.OK() || a.Err == nil || strings.Contains(a.Err.Error(), "http://") {
		t.Fatalf("%+v", a)
	}
}

// limited is ev about limit (its tenants').
func limited(ev Event, limit string) Event {
	ev.Share = Share{Limit: limit}
	return ev
}
