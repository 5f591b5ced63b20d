package admin

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/docsgate/gateway/internal/redistest"
	"github.com/docsgate/gateway/limits"
	"github.com/docsgate/gateway/notify"
)

// outboxes runs f against each outbox the gateway runs on: in process, and in a real
// redis-server.
func outboxes(t *testing.T, f func(t *testing.T, box notify.Outbox)) {
	t.Run("memory", func(t *testing.T) { f(t, notify.NewMemory(1000)) })
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Start(t)
		f(t, notify.NewRedis(srv.Client(t), "gw", 1000))
	})
}

const hookBody = `{"type":"quota.exhausted","id":"%s","time":"2026-11-27T09:00:00Z","data":{"limit":"per_project","tenant":"%s","by":"project","used":100,"quota":100}}`

// seedOutbox holds three deliveries: two dead letters (one per endpoint) and one pending.
func seedOutbox(t *testing.T, box notify.Outbox) (dead1, dead2, pending string) {
	t.Helper()
	ctx := context.Background()
	now := time.Now().Add(-time.Hour).Truncate(time.Millisecond)
	mk := func(id, endpoint, tenant string, at time.Time) notify.Delivery {
		return notify.Delivery{Key: notify.DeliveryKey(id, endpoint), ID: id, Endpoint: endpoint, Type: "quota.exhausted",
			Body: []byte(fmt.Sprintf(hookBody, id, tenant)), Created: at, Next: at}
	}
	a := mk("evt_aaaa", "billing", "proj-a", now)
	b := mk("evt_bbbb", "ops_relay", "proj-<b>", now.Add(time.Second))
	c := mk("evt_cccc", "billing", "proj-c", now.Add(24*time.Hour)) // due tomorrow: stays pending
	if _, err := box.Add(ctx, []notify.Delivery{a, b, c}); err != nil {
		t.Fatal(err)
	}
	claimed, err := box.Claim(ctx, now.Add(time.Second), 10, time.Minute)
	if err != nil || len(claimed) != 2 {
		t.Fatalf("claim: %v %v", claimed, err)
	}
	for i, d := range claimed {
		d.Attempts = 7
		d.LastError = "answered 500"
		if d.Endpoint == "ops_relay" {
			d.LastError = `dial tcp 10.0.0.9:443: connect: connection refused <script>alert(1)</script>`
		}
		if ok, err := box.Kill(ctx, d, now.Add(time.Duration(i+2)*time.Minute)); !ok || err != nil {
			t.Fatalf("kill %s: %v %v", d.Key, ok, err)
		}
	}
	return a.Key, b.Key, c.Key
}

func notificationsServer(t *testing.T, box NotificationOutbox, token string) (*httptest.Server, *observer.ObservedLogs) {
	t.Helper()
	core, logs := observer.New(zap.InfoLevel)
	srv := httptest.NewServer(Handler(Options{
		Ready:         func() (bool, string) { return true, "ready" },
		Metrics:       http.NotFoundHandler(),
		Top:           noTop{},
		TopTimeout:    5 * time.Second,
		Notifications: box,
		Token:         token,
		UsageTimeout:  5 * time.Second,
		Logger:        zap.New(core),
	}))
	t.Cleanup(srv.Close)
	return srv, logs
}

// noTop is a limit store without use.
type noTop struct{}

func (noTop) Top(context.Context, string, int) ([]limits.TopList, error) { return nil, nil }

type listAnswer struct {
	Pending, Dead int
	Deliveries    []map[string]any
}

func TestNotificationsList(t *testing.T) {
	outboxes(t, func(t *testing.T, box notify.Outbox) {
		dead1, dead2, pending := seedOutbox(t, box)
		srv, _ := notificationsServer(t, box, protectToken)
		bearer := map[string]string{"Authorization": "Bearer " + protectToken}
		get := func(target string) (answer, listAnswer) {
			t.Helper()
			a := do(t, srv, "GET", target, bearer, "")
			var l listAnswer
			if a.status == 200 {
				if err := json.Unmarshal([]byte(a.body), &l); err != nil {
					t.Fatalf("GET %s: %v: %s", target, err, a.body)
				}
			}
			return a, l
		}
		a, l := get("/notifications")
		if a.status != 200 || l.Pending != 1 || l.Dead != 2 || len(l.Deliveries) != 2 {
			t.Fatalf("GET /notifications: %d %s", a.status, a.body)
		}
		d := l.Deliveries[0]
		want := map[string]any{"key": dead1, "id": "evt_aaaa", "endpoint": "billing", "type": "quota.exhausted",
			"attempts": float64(7), "last_error": "answered 500", "dead": true}
		for k, v := range want {
			if d[k] != v {
				t.Errorf("dead letter %s = %v, want %v", k, d[k], v)
			}
		}
		body, _ := d["body"].(map[string]any)
		if data, _ := body["data"].(map[string]any); data["tenant"] != "proj-a" || body["id"] != "evt_aaaa" {
			t.Errorf("dead letter body: %v", d["body"])
		}
		for _, k := range []string{"created", "next"} {
			if _, err := time.Parse(time.RFC3339, fmt.Sprint(d[k])); err != nil {
				t.Errorf("dead letter %s: %v", k, d[k])
			}
		}
		if len(d) != 10 {
			t.Errorf("dead letter fields: %v", d)
		}
		if l.Deliveries[1]["key"] != dead2 {
			t.Errorf("second dead letter: %v", l.Deliveries[1])
		}
		if _, l := get("/notifications?state=dead&n=1"); len(l.Deliveries) != 1 || l.Deliveries[0]["key"] != dead1 || l.Dead != 2 {
			t.Errorf("n=1: %+v", l)
		}
		_, l = get("/notifications?state=pending")
		if len(l.Deliveries) != 1 || l.Deliveries[0]["key"] != pending || l.Deliveries[0]["dead"] != false || l.Deliveries[0]["last_error"] != "" {
			t.Errorf("pending: %+v", l)
		}
		for _, target := range []string{"/notifications?state=gone", "/notifications?state=dead&state=pending",
			"/notifications?n=0", "/notifications?n=1001", "/notifications?n=x", "/notifications?n=1&n=2"} {
			a, _ := get(target)
			var e struct{ Code, Field string }
			_ = json.Unmarshal([]byte(a.body), &e)
			field := "n"
			if strings.Contains(target, "state") {
				field = "state"
			}
			if a.status != 400 || e.Code != "invalid_request" || e.Field != field {
				t.Errorf("GET %s: %d %s, want 400 invalid_request naming %s", target, a.status, a.body, field)
			}
		}
		if a := do(t, srv, "GET", "/notifications", nil, ""); a.status != 401 {
			t.Errorf("without the token: %d", a.status)
		}
	})
}

func TestNotificationsRetryDrop(t *testing.T) {
	outboxes(t, func(t *testing.T, box notify.Outbox) {
		ctx := context.Background()
		dead1, dead2, pending := seedOutbox(t, box)
		srv, logs := notificationsServer(t, box, protectToken)
		h := map[string]string{"Authorization": "Bearer " + protectToken, "Content-Type": "application/json"}
		post := func(path string, keys ...string) map[string][]string {
			t.Helper()
			body, _ := json.Marshal(map[string][]string{"keys": keys})
			a := do(t, srv, "POST", path, h, string(body))
			var out map[string][]string
			if a.status != 200 || json.Unmarshal([]byte(a.body), &out) != nil {
				t.Fatalf("POST %s: %d %s", path, a.status, a.body)
			}
			return out
		}
		// A pending delivery is no dead letter; an unknown key names nothing; a key repeated
		// is acted on once.
		got := post("/notifications/retry", dead1, pending, "evt_nope/billing", dead1)
		if fmt.Sprint(got) != fmt.Sprint(map[string][]string{"retried": {dead1}, "missing": {pending, "evt_nope/billing"}}) {
			t.Fatalf("retry: %v", got)
		}
		if p, d, _ := box.Count(ctx); p != 2 || d != 1 {
			t.Fatalf("after the retry: %d pending, %d dead", p, d)
		}
		// Requeued: due now, its attempts counted anew.
		ds, _ := box.Claim(ctx, time.Now(), 10, time.Minute)
		if len(ds) != 1 || ds[0].Key != dead1 || ds[0].Attempts != 0 {
			t.Fatalf("the retried delivery is not due: %+v", ds)
		}
		got = post("/notifications/drop", dead2, pending, "evt_nope/billing")
		if fmt.Sprint(got) != fmt.Sprint(map[string][]string{"dropped": {dead2, pending}, "missing": {"evt_nope/billing"}}) {
			t.Fatalf("drop: %v", got)
		}
		if p, d, _ := box.Count(ctx); p != 1 || d != 0 {
			t.Fatalf("after the drop: %d pending, %d dead", p, d)
		}
		got = post("/notifications/retry", dead2)
		if len(got["retried"]) != 0 || fmt.Sprint(got["missing"]) != "["+dead2+"]" {
			t.Fatalf("retry of a dropped key: %v", got)
		}

		// Bad bodies: 400 naming the field, nothing done.
		for body, field := range map[string]string{
			`{}`:                                "keys",
			`{"keys":[]}`:                       "keys",
			`{"keys":"` + dead1 + `"}`:          "keys",
			`{"keys":[1]}`:                      "keys",
			`{"keys":["no-slash"]}`:             "keys",
			`{"keys":["evt_a/"]}`:               "keys",
			`{"keys":["evt a/billing"]}`:        "keys",
			`{"keys":["evt_\u00e9/billing"]}`:   "keys",
			`{"keys":["evt_a/billing\n"]}`:      "keys",
			`{"keys":["` + long(201) + `"]}`:    "keys",
			`{"keys":[` + manyKeys(101) + `]}`:  "keys",
			`{"keys":["evt_a/b"],"reason":"x"}`: "reason",
			`{"keys":["evt_a/b"]} {}`:           "body",
			`[`:                                 "body",
		} {
			for _, path := range []string{"/notifications/retry", "/notifications/drop"} {
				a := do(t, srv, "POST", path, h, body)
				var e struct{ Code, Field string }
				_ = json.Unmarshal([]byte(a.body), &e)
				if a.status != 400 || e.Code != "invalid_request" || e.Field != field {
					t.Errorf("POST %s %.80s: %d %s, want 400 naming %s", path, body, a.status, a.body, field)
				}
			}
		}
		if a := do(t, srv, "POST", "/notifications/drop", h, `{"keys":[`+manyKeys(100)+`]}`); a.status != 200 {
			t.Errorf("100 keys: %d %s", a.status, a.body)
		}
		if p, d, _ := box.Count(ctx); p != 1 || d != 0 {
			t.Fatalf("refused requests changed the outbox: %d pending, %d dead", p, d)
		}

		// The write rules: another origin, a body of another type, the token.
		for _, c := range []struct {
			hdr  map[string]string
			want int
			code string
		}{
			{map[string]string{"Authorization": "Bearer " + protectToken, "Content-Type": "application/json", "Sec-Fetch-Site": "cross-site"}, 403, "cross_origin_refused"},
			{map[string]string{"Authorization": "Bearer " + protectToken, "Content-Type": "text/plain"}, 415, "unsupported_media_type"},
			{map[string]string{"Content-Type": "application/json"}, 401, "invalid_credentials"},
		} {
			a := do(t, srv, "POST", "/notifications/drop", c.hdr, `{"keys":["`+dead1+`"]}`)
			if a.status != c.want || a.code != c.code {
				t.Errorf("drop with %v: %d %s, want %d %s", c.hdr, a.status, a.body, c.want, c.code)
			}
		}
		if p, _, _ := box.Count(ctx); p != 1 {
			t.Fatal("a refused drop dropped")
		}

		// One audit line per write, naming the keys asked for.
		type line struct{ action, target, result string }
		var lines []line
		for _, e := range logs.FilterMessage("admin write").All() {
			f := e.ContextMap()
			lines = append(lines, line{f["action"].(string), f["target"].(string), f["result"].(string)})
		}
		if len(lines) < 4 {
			t.Fatalf("audit lines: %v", lines)
		}
		for i, want := range []line{
			{"notifications.retry", dead1 + " " + pending + " evt_nope/billing", "ok"},
			{"notifications.drop", dead2 + " " + pending + " evt_nope/billing", "ok"},
			{"notifications.retry", dead2, "ok"},
			{"notifications.retry", "/notifications/retry", "invalid_request"},
		} {
			if lines[i] != want {
				t.Errorf("audit line %d: %+v, want %+v", i, lines[i], want)
			}
		}
		last := lines[len(lines)-3:]
		if last[0].result != "cross_origin_refused" || last[1].result != "unsupported_media_type" || last[2].result != "invalid_credentials" {
			t.Errorf("audit lines of the refused writes: %+v", last)
		}
	})
}

func long(n int) string { return "evt_" + strings.Repeat("a", n-len("evt_/b")) + "/b" }

func manyKeys(n int) string {
	var ks []string
	for i := range n {
		ks = append(ks, fmt.Sprintf(`"evt_%d/billing"`, i))
	}
	return strings.Join(ks, ",")
}

// Without a configured token the list is open and the writes are refused; without
// notifications the endpoints are not there.
func TestNotificationsNoTokenAndOff(t *testing.T) {
	box := notify.NewMemory(10)
	dead1, _, _ := seedOutbox(t, box)
	open, _ := notificationsServer(t, box, "")
	if a := do(t, open, "GET", "/notifications", nil, ""); a.status != 200 {
		t.Errorf("GET without a configured token: %d", a.status)
	}
	for _, path := range []string{"/notifications/retry", "/notifications/drop"} {
		a := do(t, open, "POST", path, map[string]string{"Content-Type": "application/json"}, `{"keys":["`+dead1+`"]}`)
		if a.status != 403 || a.code != "admin_token_required" {
			t.Errorf("POST %s without a configured token: %d %s", path, a.status, a.body)
		}
	}
	if _, d, _ := box.Count(context.Background()); d != 2 {
		t.Fatal("a refused write changed the outbox")
	}
	off, _ := notificationsServer(t, nil, protectToken)
	h := map[string]string{"Authorization": "Bearer " + protectToken, "Content-Type": "application/json"}
	for _, c := range []struct{ method, path, body string }{{"GET", "/notifications", ""}, {"POST", "/notifications/retry", `{"keys":["a/b"]}`}, {"POST", "/notifications/drop", `{"keys":["a/b"]}`}} {
		if a := do(t, off, c.method, c.path, h, c.body); a.status != 404 || a.code != "not_found" {
			t.Errorf("%s %s with notifications off: %d %s", c.method, c.path, a.status, a.body)
		}
	}
	page := do(t, off, "GET", "/ui/", h, "")
	if page.status != 200 || strings.Contains(page.body, "Notifications") {
		t.Errorf("the page with notifications off: %d, mentions notifications: %t", page.status, strings.Contains(page.body, "Notifications"))
	}
}

// downOutbox is an outbox whose store fails.
type downOutbox struct{}

func (downOutbox) List(context.Context, bool, int) ([]notify.Delivery, error) { return nil, errDown }
func (downOutbox) Requeue(context.Context, string, time.Time) (bool, error)   { return false, errDown }
func (downOutbox) Drop(context.Context, string) (bool, error)                 { return false, errDown }
func (downOutbox) Count(context.Context) (int, int, error)                    { return 0, 0, errDown }

func TestNotificationsOutboxDown(t *testing.T) {
	srv, _ := notificationsServer(t, downOutbox{}, protectToken)
	h := map[string]string{"Authorization": "Bearer " + protectToken, "Content-Type": "application/json"}
	for _, c := range []struct{ method, path, body string }{{"GET", "/notifications", ""}, {"POST", "/notifications/retry", `{"keys":["a/b"]}`}, {"POST", "/notifications/drop", `{"keys":["a/b"]}`}} {
		a := do(t, srv, c.method, c.path, h, c.body)
		if a.status != 503 || a.code != "outbox_unavailable" || a.header.Get("Retry-After") != "1" {
			t.Errorf("%s %s on a failing outbox: %d %s", c.method, c.path, a.status, a.body)
		}
	}
	page := do(t, srv, "GET", "/ui/", h, "")
	if page.status != 200 || !strings.Contains(page.body, "The notification outbox could not be read just now") {
		t.Errorf("the page on a failing outbox: %d %s", page.status, page.body)
	}
}

// The usage page shows the outbox's counts and its dead letters, as text: the last error
// escaped, nothing of the endpoints' URLs or secrets (the outbox holds neither).
func TestNotificationsPage(t *testing.T) {
	outboxes(t, func(t *testing.T, box notify.Outbox) {
		dead1, dead2, _ := seedOutbox(t, box)
		srv, _ := notificationsServer(t, box, protectToken)
		a := do(t, srv, "GET", "/ui/", map[string]string{"Authorization": "Bearer " + protectToken}, "")
		if a.status != 200 {
			t.Fatalf("GET /ui/: %d %s", a.status, a.body)
		}
		i := strings.Index(a.body, `<section class="notifications"`)
		if i < 0 {
			t.Fatalf("no notifications section: %s", a.body)
		}
		section := a.body[i:]
		section = section[:strings.Index(section, "</section>")]
		for _, want := range []string{
			`<h2 id="notifications">Notifications`,
			`Pending: <strong data-pending="1">1</strong>`,
			`Dead letters: <strong class="bad" data-dead="2">2</strong>`,
			`<tr data-delivery="` + dead1 + `">`,
			`<tr data-delivery="` + dead2 + `">`,
			`<td>quota.exhausted</td>`,
			`<td>billing</td>`, `<td>ops_relay</td>`,
			`<td class="num">7</td>`,
			`answered 500`,
			`connect: connection refused &lt;script&gt;alert(1)&lt;/script&gt;`,
			`per_project <code title="proj-&lt;b&gt;">proj-&lt;b&gt;</code>`,
			`min ago</td><td>quota.exhausted</td>`,
		} {
			if !strings.Contains(section, want) {
				t.Errorf("the section lacks %q:\n%s", want, section)
			}
		}
		if strings.Contains(a.body, "<script>alert") || strings.Contains(section, "whsec_") {
			t.Error("the section carries unescaped or secret text")
		}
		if strings.Contains(section, "more: GET /notifications") {
			t.Error("the section says more dead letters are left out")
		}
		// The refresh swaps the same section in.
		p := do(t, srv, "GET", "/ui/?partial=1", map[string]string{"Authorization": "Bearer " + protectToken}, "")
		if !strings.Contains(p.body, `<tr data-delivery="`+dead1+`">`) {
			t.Errorf("the partial page lacks the dead letters: %s", p.body)
		}
	})
}

// The page lists uiDeadLetters dead letters and says how many more there are.
func TestNotificationsPageMore(t *testing.T) {
	box := notify.NewMemory(100)
	ctx := context.Background()
	now := time.Now().Add(-time.Hour)
	var ds []notify.Delivery
	for i := range uiDeadLetters + 5 {
		id := fmt.Sprintf("evt_%02d", i)
		ds = append(ds, notify.Delivery{Key: notify.DeliveryKey(id, "billing"), ID: id, Endpoint: "billing", Type: "key.revoked", Body: []byte(`{"type":"key.revoked"}`), Created: now, Next: now})
	}
	if _, err := box.Add(ctx, ds); err != nil {
		t.Fatal(err)
	}
	claimed, _ := box.Claim(ctx, now, 100, time.Minute)
	for _, d := range claimed {
		d.Attempts, d.LastError = 1, "answered 410"
		_, _ = box.Kill(ctx, d, now)
	}
	srv, _ := notificationsServer(t, box, protectToken)
	a := do(t, srv, "GET", "/ui/", map[string]string{"Authorization": "Bearer " + protectToken}, "")
	if n := strings.Count(a.body, "<tr data-delivery="); n != uiDeadLetters {
		t.Errorf("%d dead letters listed, want %d", n, uiDeadLetters)
	}
	if !strings.Contains(a.body, "5 more: GET /notifications?n=1000 lists them.") {
		t.Errorf("the page does not say 5 more: %s", a.body)
	}
}
