package proxy

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/internal/redistest"
	"github.com/docsgate/gateway/limits"
)

// Token holds and stream slots are settled by how the answer ended, on the UI message stream
// (v2): charged the reported usage after a finish, released after an upstream 5xx or 4xx or a
// stream that broke before any text; the slot comes back every time. The org (its domain)
// picks what the upstream does.
func TestHoldsSettledByHowTheAnswerEnded(t *testing.T) {
	stores(t, func(t *testing.T, withStore gatewayOpt, _ *redistest.Server) {
		up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
			mode := strings.Split(r.URL.Path, "/")[4] // the org's domain
			switch mode {
			case "fail":
				w.WriteHeader(http.StatusInternalServerError)
				return
			case "refuse":
				w.WriteHeader(http.StatusForbidden)
				return
			}
			w.Header().Set("Content-Type", "text/event-stream")
			w.Header().Set("X-Vercel-Ai-Ui-Message-Stream", "v1")
			w.WriteHeader(200)
			w.(http.Flusher).Flush()
			if mode == "cut" {
				panic(http.ErrAbortHandler) // broken before any text
			}
			fmt.Fprint(w, sse(`{"type":"start","messageId":"m"}`, `{"type":"text-delta","id":"t","delta":"Hello"}`,
				`{"type":"finish","finishReason":"stop","messageMetadata":{"usage":{"inputTokens":52,"outputTokens":61,"totalTokens":113}}}`, `[DONE]`))
		})
		reserve, tokens, slots := int64(200), int64(1000), int64(2)
		g := newGateway(t, up, withStore, func(c *cfgT) {
			c.Limits = map[string]config.Limit{
				"tok":   {Limit: &tokens, Window: "month", By: "org", Unit: "tokens", Reserve: &reserve},
				"slots": {Limit: &slots, By: "org", Unit: "streams"},
			}
			c.Routes[1].Limits = &[]string{"assistant_per_key", "tok", "slots"}
		})
		for _, c := range []struct {
			org    string
			status int
			used   int64
		}{{"ok", 200, 113}, {"fail", 500, 0}, {"refuse", 403, 0}, {"cut", 200, 0}} {
			res, data := g.do(t, "POST", "/discovery/v2/assistant/"+c.org+"/message", jsonHdr(assistantKey), assistantBody)
			if res.StatusCode != c.status {
				t.Fatalf("%s: %d %s", c.org, res.StatusCode, data)
			}
			if c.org == "ok" && !strings.Contains(res.Header.Get("RateLimit"), `"tok";r=800;`) {
				t.Fatalf("%s: RateLimit %q, want the hold of 200 counted", c.org, res.Header.Get("RateLimit"))
			}
			// The settle runs once the request has ended, after the client has its answer.
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				us, err := g.eng.Usage(context.Background(), "org", c.org)
				if err != nil {
					t.Fatal(err)
				}
				if settled(us, c.used) {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s: %+v, want %d tokens used, nothing held and the slot back", c.org, us, c.used)
				}
			}
		}
		g.assertNoSecrets(t)
	})
}

// settled says whether us shows used tokens of tok, nothing held, and every slot back.
func settled(us []limits.Usage, used int64) bool {
	found := 0
	for _, u := range us {
		switch {
		case u.Name == "tok" && u.Used == used && u.Reserved == 0:
			found++
		case u.Name == "slots" && u.Used == 0:
			found++
		}
	}
	return found == 2
}
