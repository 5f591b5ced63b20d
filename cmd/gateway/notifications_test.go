package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/notify"
)

// hookReceiver is a webhook endpoint on 127.0.0.1 that verifies every delivery and keeps
// the events by id.
type hookReceiver struct {
	url    string
	mu     sync.Mutex
	events map[string][]notify.Event // by id: each delivery
}

func newHookReceiver(t *testing.T, secret string) *hookReceiver {
	keys, err := config.ParseSecrets(secret)
	if err != nil {
		t.Fatal(err)
	}
	h := &hookReceiver{events: map[string][]notify.Event{}}
	h.url = serveHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var ev notify.Event
		if err := notify.Verify(keys, r.Header, body, time.Now(), 5*time.Minute); err != nil || json.Unmarshal(body, &ev) != nil || ev.ID != r.Header.Get(notify.HeaderID) {
			t.Errorf("a delivery that does not verify: %v %s", err, body)
			w.WriteHeader(400)
			return
		}
		h.mu.Lock()
		h.events[ev.ID] = append(h.events[ev.ID], ev)
		h.mu.Unlock()
		w.WriteHeader(204)
	}))
	return h
}

// byType counts the events received, each id once, by type, and says whether any id came twice.
func (h *hookReceiver) byType() (map[string]int, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := map[string]int{}
	twice := false
	for _, evs := range h.events {
		n[evs[0].Type]++
		twice = twice || len(evs) > 1
	}
	return n, twice
}

// Two replicas on one Redis (and on a Cluster), 40 concurrent requests crossing 80% of a limit of 20 and running
// it out: one quota.threshold_crossed per threshold and one quota.exhausted, signed, each
// delivered once, with what the event says.
func TestNotificationsAcrossReplicas(t *testing.T) {
	t.Parallel()
	for _, st := range holdStores()[1:] { // Redis and Cluster
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			testNotificationsAcrossReplicas(t, st)
		})
	}
}

func testNotificationsAcrossReplicas(t *testing.T, st holdStore) {
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	upURL, _ := recordingUpstream(t)
	recv := newHookReceiver(t, secret)
	cfg := "limits:\n  assistant_per_org: {limit: 20, thresholds: [0.5, 0.8, 1.0]}\n" +
		fmt.Sprintf("notifications:\n  webhooks:\n    - {name: billing, url: %q, secret: %q, limits: [assistant_per_org], allow_private_addresses: true}\n", recv.url+"/hooks", secret)
	gws := startReplicas(t, upURL, st, cfg)
	if c := burst(t, gws, 40, "/discovery/v1/assistant/acme/message", "svc_dsc_n", `{"fp":"a","messages":[]}`, nil); c[201] != 20 || c[429] != 20 {
		t.Fatalf("burst: %v", c)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, _ := recv.byType()
		if n[config.EventThresholdCrossed] >= 3 && n[config.EventExhausted] >= 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(300 * time.Millisecond) // a second delivery of any event would show by now
	n, twice := recv.byType()
	if n[config.EventThresholdCrossed] != 3 || n[config.EventExhausted] != 1 || len(n) != 2 || twice {
		t.Fatalf("events: %v (an id twice: %v)", n, twice)
	}
	recv.mu.Lock()
	defer recv.mu.Unlock()
	seen := map[float64]bool{}
	for _, evs := range recv.events {
		ev := evs[0]
		d, _ := ev.Data.(map[string]any)
		if d["limit"] != "assistant_per_org" || d["tenant"] != "acme" || d["by"] != "org" || d["quota"] != 20.0 || d["window_start"] == nil {
			t.Errorf("%s: %v", ev.Type, d)
		}
		if ev.Type == config.EventThresholdCrossed {
			th, _ := d["threshold"].(float64)
			seen[th] = true
			if used, _ := d["used"].(float64); used < th*20 {
				t.Errorf("threshold %v reported at %v used", th, used)
			}
		}
	}
	if !seen[0.5] || !seen[0.8] || !seen[1] {
		t.Errorf("thresholds reported: %v", seen)
	}
}
