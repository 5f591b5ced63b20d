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

// A tap's check stops a read right after the part it ran for, whatever the split of the
// bytes into reads: what the taps took is the stream up to that part's end, to the byte.
func TestTapCheckStopsAfterPart(t *testing.T) {
	v1 := "f:{\"messageId\":\"m\"}\n0:\"ab\"\n2:[1]\n0:\"cd\"\n0:\"ef\"\nd:{\"finishReason\":\"stop\"}\n"
	v2 := "data: {\"type\":\"start\"}\n\ndata: {\"type\":\"text-delta\",\"id\":\"t\",\"delta\":\"ab\"}\r\n\r\n" +
		": comment\n\ndata: {\"type\":\"text-delta\",\"id\":\"t\",\"delta\":\"cd\"}\n\ndata: [DONE]\n\n"
	cases := []struct {
		name   string
		newTap func() streamTap
		body   string
		stopAt int    // the check returns true on its stopAt-th call
		want   string // what the taps take
		text   int64
	}{
		{"v1 first text", newDataTap, v1, 1, "f:{\"messageId\":\"m\"}\n0:\"ab\"\n", 2},
		{"v1 third text", newDataTap, v1, 3, strings.TrimSuffix(v1, "d:{\"finishReason\":\"stop\"}\n"), 6},
		{"v2 first text", newUITap, v2, 2, "data: {\"type\":\"start\"}\n\ndata: {\"type\":\"text-delta\",\"id\":\"t\",\"delta\":\"ab\"}\r\n\r", 2},
		{"v2 second text", newUITap, v2, 4, strings.TrimSuffix(v2, "data: [DONE]\n\n"), 4},
	}
	for _, c := range cases {
		for size := 1; size <= len(c.body); size++ {
			tap := c.newTap()
			calls := 0
			check := func() bool { calls++; return calls == c.stopAt }
			switch tt := tap.(type) {
			case *dataStreamTap:
				tt.check = check
			case *uiStreamTap:
				tt.check = check
			}
			var took strings.Builder
			for rest := c.body; rest != "" && calls < c.stopAt; {
				chunk := rest[:min(size, len(rest))]
				n := tap.feed([]byte(chunk))
				took.WriteString(chunk[:n])
				rest = rest[len(chunk):]
				if n < len(chunk) && calls != c.stopAt {
					t.Fatalf("%s, reads of %d: stopped without the check", c.name, size)
				}
			}
			if took.String() != c.want || tap.outcome().textBytes != c.text {
				t.Fatalf("%s, reads of %d: took %q (%d text bytes), want %q (%d)", c.name, size, took.String(), tap.outcome().textBytes, c.want, c.text)
			}
		}
	}
}

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
			gw, err := New(Options{Config: &cfg, Logger: zap.New(core), Metrics: metrics.New(prometheus.NewRegistry()), Limiter: failingGrow{limits.NewMemory()}})
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
			// 1 prompt token, then 10 a part: the 5th part (51) runs past the reserve of 50.
			switch last := lines[len(lines)-3]; {
			case onError == "deny" && (texts != 5 || last != `3:"The answer was cut off: its token budget could not be checked."`):
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
