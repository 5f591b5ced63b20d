package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/limits"
	"github.com/docsgate/gateway/metrics"
)

// failingGrow is the in-process store whose holds cannot grow: Redis out of reach.
type failingGrow struct{ *limits.Memory }

func (failingGrow) Grow(context.Context, string, limits.Hit, int64) (int64, error) {
	return 0, errors.New("redis: connection refused")
}

// When the store cannot grow the hold of an answer that ran past its reserve, redis.on_error
// decides as for admissions: deny ends the answer there, saying its budget could not be
// checked; allow lets it run to its end. The warning names the limit.
func TestCutoffWhenTheStoreFails(t *testing.T) {
	for _, onError := range []string{"deny", "allow"} {
		t.Run(onError, func(t *testing.T) {
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", "text/plain; charset=utf-8")
				for range 20 {
					fmt.Fprint(w, "0:\""+strings.Repeat("a", 40)+"\"\n")
					w.(http.Flusher).Flush()
				}
				fmt.Fprint(w, "d:{\"finishReason\":\"stop\"}\n")
			})
			cfg := config.Defaults()
			cfg.Upstream.URL = up.URL
			cfg.Redis.OnError = onError
			cfg.Limits = map[string]config.Limit{"tok": {Limit: ptr[int64](100000), Window: "month", By: "org", Unit: "tokens", Reserve: ptr[int64](50), Cutoff: ptr(true)}}
			cfg.Routes = []config.Route{{Name: "assistant_message_v2", Method: "POST", Path: "/discovery/v2/assistant/{domain}/message", Key: "assistant", Stream: ptr(true), Limits: &[]string{"tok"}}}
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			core, logs := observer.New(zap.DebugLevel)
			gw, err := newTestGateway(&cfg, failingGrow{limits.NewMemory()}, metrics.New(prometheus.NewRegistry()), zap.New(core), nil)
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(gw)
			defer srv.Close()
			req, _ := http.NewRequest("POST", srv.URL+"/discovery/v2/assistant/acme/message", strings.NewReader(`{"fp":"x","messages":[{"id":"u1","role":"user","parts":[{"type":"text","text":"hi"}]}]}`))
			req.Header = jsonHdr(assistantKey)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			var lines []string
			sc := bufio.NewScanner(res.Body)
			for sc.Scan() {
				lines = append(lines, sc.Text())
			}
			if err := sc.Err(); err != nil || res.StatusCode != 200 {
				t.Fatalf("status %d, end %v", res.StatusCode, err)
			}
			texts := 0
			for _, l := range lines {
				if strings.HasPrefix(l, "0:") {
					texts++
				}
			}
			// 1 prompt token, then 10 a part: the 5th part (51) runs past the reserve of 50, and
			// is dropped (it came whole in its read).
			switch last := lines[len(lines)-3]; {
			case onError == "deny" && (texts != 4 || last != `3:"The answer was cut off: its token budget could not be checked."`):
				t.Fatalf("deny: %d text parts, then %q", texts, last)
			case onError == "allow" && (texts != 20 || lines[len(lines)-1] != `d:{"finishReason":"stop"}`):
				t.Fatalf("allow: %d text parts, ending %q", texts, lines[len(lines)-1])
			}
			warned := logs.FilterMessage("growing the token hold of an answer in flight failed").All()
			if len(warned) == 0 || warned[0].ContextMap()["limit"] != "tok" {
				t.Fatalf("no warning naming the limit: %v", warned)
			}
		})
	}
}
