package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/docsgate/gateway/internal/browsertest"
	"github.com/docsgate/gateway/internal/redistest"
)

// A delivery the endpoint refuses with 410 Gone is a dead letter at once: the admin listener
// lists it (with its event, never the endpoint's URL or secret), the usage page shows it, and
// a retry through the admin API delivers it once the endpoint takes it; on the in-process
// outbox and on Redis.
func TestNotificationsDeadLettersOnAdmin(t *testing.T) {
	t.Parallel()
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	for _, store := range []string{"memory", "redis"} {
		t.Run(store, func(t *testing.T) {
			var gone atomic.Bool
			gone.Store(true)
			var delivered atomic.Int32
			hook := serveHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				if gone.Load() {
					w.WriteHeader(http.StatusGone)
					return
				}
				delivered.Add(1)
				w.WriteHeader(http.StatusNoContent)
			}))
			cfg := fmt.Sprintf("admin_token: %q\n"+
				"limits:\n  assistant_per_org: {limit: 2, thresholds: [1.0]}\n"+
				"notifications:\n  webhooks:\n    - {name: billing, url: %q, secret: %q, allow_private_addresses: true}\n", adminToken, hook+"/hooks?token=t0psecret", secret)
			if store == "redis" {
				cfg = fmt.Sprintf("redis:\n  addrs: [%q]\n  timeout: 2s\n", redistest.Start(t).Addr) + cfg
			}
			upURL, _ := recordingUpstream(t)
			gw := startGateway(t, upURL, cfg)
			if c := burst(t, []*proc{gw}, 3, "/discovery/v1/assistant/acme/message", "svc_dsc_n", `{"fp":"a","messages":[]}`, nil); c[201] != 2 || c[429] != 1 {
				t.Fatalf("burst: %v", c)
			}
			type list struct {
				Pending, Dead int
				Deliveries    []struct {
					Key, Endpoint, Type string
					LastError           string `json:"last_error"`
					Dead                bool
					Body                json.RawMessage
				}
			}
			read := func(target string) (list, string) {
				t.Helper()
				body := adminCallOK(t, gw, "GET", target, "", 200)
				var l list
				if err := json.Unmarshal([]byte(body), &l); err != nil {
					t.Fatalf("GET %s: %v: %s", target, err, body)
				}
				return l, body
			}
			var l list
			var raw string
			for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				if l, raw = read("/notifications"); l.Dead == 2 || time.Now().After(deadline) {
					break
				}
			}
			// quota.threshold_crossed at 100% and quota.exhausted.
			if l.Dead != 2 || l.Pending != 0 || len(l.Deliveries) != 2 {
				t.Fatalf("dead letters: %s", raw)
			}
			var keys []string
			for _, d := range l.Deliveries {
				if d.Endpoint != "billing" || !d.Dead || d.LastError != "answered 410" || !strings.Contains(string(d.Body), `"tenant":"acme"`) {
					t.Errorf("dead letter: %+v %s", d, d.Body)
				}
				keys = append(keys, d.Key)
			}
			for _, leak := range []string{"t0psecret", "whsec_", "/hooks"} {
				if strings.Contains(raw, leak) {
					t.Errorf("GET /notifications shows %q: %s", leak, raw)
				}
			}
			page := adminCallOK(t, gw, "GET", "/ui/", "", 200)
			if !strings.Contains(page, `data-dead="2"`) || !strings.Contains(page, `<tr data-delivery="`+keys[0]+`">`) || strings.Contains(page, "t0psecret") {
				t.Errorf("the usage page does not show the dead letters")
			}

			gone.Store(false)
			body, _ := json.Marshal(map[string][]string{"keys": keys})
			var got struct{ Retried, Missing []string }
			_ = json.Unmarshal([]byte(adminCallOK(t, gw, "POST", "/notifications/retry", string(body), 200)), &got)
			if len(got.Retried) != 2 || len(got.Missing) != 0 {
				t.Fatalf("retry: %+v", got)
			}
			for deadline := time.Now().Add(10 * time.Second); delivered.Load() < 2 && time.Now().Before(deadline); {
				time.Sleep(20 * time.Millisecond)
			}
			if n := delivered.Load(); n != 2 {
				t.Fatalf("%d deliveries after the retry, want 2", n)
			}
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				if l, raw = read("/notifications?state=pending"); l.Pending+l.Dead == 0 || time.Now().After(deadline) {
					break
				}
			}
			if l.Pending+l.Dead != 0 {
				t.Fatalf("the outbox after the retried deliveries: %s", raw)
			}
			// Nothing left to drop: both keys are reported missing.
			var dropped struct{ Dropped, Missing []string }
			_ = json.Unmarshal([]byte(adminCallOK(t, gw, "POST", "/notifications/drop", string(body), 200)), &dropped)
			if len(dropped.Dropped) != 0 || len(dropped.Missing) != 2 {
				t.Fatalf("drop: %+v", dropped)
			}
		})
	}
}

// The usage page in headless Chromium shows the outbox's counts and its dead letters, their
// last error as text, with no console error.
func TestNotificationsOnUsagePageInBrowser(t *testing.T) {
	t.Parallel()
	browser := browsertest.Start(t)
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	hook := serveHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusGone) }))
	upURL, _ := recordingUpstream(t)
	gw := startGateway(t, upURL, fmt.Sprintf("admin_token: %q\nadmin_ui_refresh: 1s\n"+
		"limits:\n  assistant_per_org: {limit: 2, thresholds: [0.5, 1.0]}\n"+
		"notifications:\n  webhooks:\n    - {name: billing, url: %q, secret: %q, allow_private_addresses: true}\n", adminToken, hook+"/hooks", secret))
	if c := burst(t, []*proc{gw}, 3, "/discovery/v1/assistant/acme/message", "svc_dsc_n", `{"fp":"a","messages":[]}`, nil); c[201] != 2 {
		t.Fatalf("burst: %v", c)
	}
	page := browser.Open(t, "http://"+gw.admin+"/ui/", &browsertest.Credentials{User: "operator", Password: adminToken})
	// Three events (50%, 100%, exhausted), each answered 410: three dead letters.
	page.WaitFor(t, `document.querySelectorAll('section.notifications tr[data-delivery]').length === 3`, 15*time.Second)
	counts := page.Text(t, `section.notifications p.counts`)
	if !strings.Contains(counts, "Pending: 0") || !strings.Contains(counts, "Dead letters: 3") {
		t.Errorf("counts: %q", counts)
	}
	row := page.Text(t, `section.notifications tr[data-delivery]`)
	for _, want := range []string{"quota.", "assistant_per_org", "acme", "billing", "answered 410", "/billing"} {
		if !strings.Contains(row, want) {
			t.Errorf("a dead letter's row lacks %q: %q", want, row)
		}
	}
	shot := filepath.Join(t.TempDir(), "notifications.png")
	if p := os.Getenv("NOTIFICATIONS_SCREENSHOT"); p != "" {
		shot = p // to look at it
	}
	page.Screenshot(t, shot)
	if errs := page.Errors(); len(errs) > 0 {
		t.Fatalf("console errors: %v", errs)
	}
}
