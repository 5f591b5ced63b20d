package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/docsgate/gateway/internal/browsertest"
)

// Real Chromium on another origin reads a v2 stream through the gateway: the browser sends
// its preflight (the key in Authorization, a JSON body), the gateway answers it, the script
// reads the exposed headers (the stream's protocol among them) and each event as it comes:
// the upstream sends the next event only once the page has acked the one before (lockstep,
// through the page's own origin), so an event the gateway held back would stall the stream.
func TestBrowserReadsV2StreamCrossOrigin(t *testing.T) {
	t.Parallel()
	browser := browsertest.Start(t)
	up := newScenarioUpstream(t)
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Fatal(err)
	}
	origin := "http://" + ln.Addr().String()
	p := startGateway(t, up.url, fmt.Sprintf("cors: {allowed_origins: [%q]}\n", origin))
	raw := runStreamPage(t, browser, ln, streamPage("http://"+p.public+"/discovery/v2/assistant/acme-docs/message", "full",
		[]string{"x-vercel-ai-ui-message-stream", "x-request-id", "ratelimit", "content-type", "x-accel-buffering"}, true),
		func() {
			select {
			case up.ack <- struct{}{}:
			case <-time.After(10 * time.Second):
			}
		})
	var got struct {
		Status int
		Error  string
		Events []string
		Rest   string
		Proto  string `json:"x-vercel-ai-ui-message-stream"`
		ReqID  string `json:"x-request-id"`
		RL     string `json:"ratelimit"`
		CT     string `json:"content-type"`
	}
	if err := json.Unmarshal([]byte(raw), &got); err != nil {
		t.Fatalf("%v: %s", err, raw)
	}
	if got.Error != "" || got.Status != 200 {
		t.Fatalf("the page's fetch: %s", raw)
	}
	// Exposed to the script on another origin: the protocol, the request id, the limits.
	if got.Proto != "v1" || got.ReqID == "" || !strings.Contains(got.RL, "assistant_per_org") || got.CT != "text/event-stream" {
		t.Fatalf("headers the script could read: %s", raw)
	}
	f := frames{v2: true}
	want := append(append(f.head(), f.text(scenarioTexts[0]), f.text(scenarioTexts[1]), f.text(scenarioTexts[2])), f.finish()...)
	if strings.Join(got.Events, "") != strings.Join(want, "") || len(got.Events) != len(want) || got.Rest != "" {
		t.Fatalf("events the page read one by one:\n%q\nwant\n%q", got.Events, want)
	}
	// The browser's preflight was answered by the gateway (and never forwarded).
	preflights := 0
	for _, l := range accessLines(p) {
		if l["route"] == "cors_preflight" && l["status"] == float64(204) {
			preflights++
		}
	}
	if preflights != 1 {
		t.Fatalf("%d preflights answered, want 1:\n%s", preflights, p.out.String())
	}
}

// streamPage is a page that posts a v2 request of fp to url from its own origin and reads the
// stream event by event (acking each on its own origin's /ack when ack is set), then puts in
// window.result the status, the headers named, the events, what followed the last one, and
// the error the reader threw if any, and sets its title to "done".
func streamPage(url, fp string, headers []string, ack bool) string {
	names, _ := json.Marshal(append([]string{}, headers...))
	ackJS := ""
	if ack {
		ackJS = `await fetch("/ack");`
	}
	return `<!doctype html><html><body><script>
(async () => {
  const out = {events: []};
  try {
    const res = await fetch("` + url + `", {
      method: "POST",
      headers: {"Authorization": "Bearer svc_dsc_browser", "Content-Type": "application/json"},
      body: JSON.stringify({fp: "` + fp + `", id: "chat-1", trigger: "submit-message",
        messages: [{id: "u1", role: "user", parts: [{type: "text", text: "How do I rotate a key?"}]}]}),
    });
    out.status = res.status;
    for (const h of ` + string(names) + `) out[h] = res.headers.get(h);
    const reader = res.body.getReader();
    const dec = new TextDecoder();
    let buf = "";
    for (;;) {
      const {done, value} = await reader.read();
      if (done) break;
      buf += dec.decode(value, {stream: true});
      for (let i; (i = buf.indexOf("\n\n")) >= 0; ) {
        out.events.push(buf.slice(0, i + 2));
        buf = buf.slice(i + 2);
        ` + ackJS + `
      }
    }
    out.rest = buf;
  } catch (e) {
    out.error = String(e);
  }
  window.result = out;
  document.title = "done";
})();
</script></body></html>`
}

// runStreamPage serves page on ln (the page's own origin; ack, when set, answers its /ack),
// opens it in the browser, waits for it to be done and returns window.result as JSON,
// failing on console errors.
func runStreamPage(t *testing.T, browser *browsertest.Browser, ln net.Listener, page string, ack func()) string {
	t.Helper()
	pages := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/ack" && ack != nil {
			ack()
			return
		}
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		fmt.Fprint(w, page)
	})}
	go pages.Serve(ln)
	t.Cleanup(func() { pages.Close() })
	tab := browser.Open(t, "http://"+ln.Addr().String()+"/", nil)
	tab.WaitFor(t, `document.title === "done"`, 30*time.Second)
	var raw string
	tab.Eval(t, `JSON.stringify(window.result)`, &raw)
	if errs := tab.Errors(); len(errs) > 0 {
		t.Fatalf("console errors: %v", errs)
	}
	return raw
}
