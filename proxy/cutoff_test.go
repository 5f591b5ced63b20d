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

// A tap's check ends a read at the part it ran for, whatever the split of the bytes into
// reads: after the part, or before it when the part came whole in the read (then the tap
// forgets it), never with a part that is partly out; what the taps took is the stream up to
// there, to the byte.
func TestTapCheckCutsAtPart(t *testing.T) {
	v1 := []string{"f:{\"messageId\":\"m\"}\n", "0:\"ab\"\n", "2:[1]\n", "0:\"cd\"\n", "0:\"ef\"\n", "d:{\"finishReason\":\"stop\"}\n"}
	v2 := []string{"data: {\"type\":\"start\"}\n\n", "data: {\"type\":\"text-delta\",\"id\":\"t\",\"delta\":\"ab\"}\r\n\r\n",
		": comment\n\n", "data: {\"type\":\"text-delta\",\"id\":\"t\",\"delta\":\"cd\"}\n\n", "data: [DONE]\n\n"}
	cases := []struct {
		name   string
		newTap func() streamTap
		parts  []string
		part   int   // the index of the part at whose end the check cuts
		calls  int   // the check's calls up to that part's end
		before int64 // the text bytes counted before the part, and with it
		with   int64
	}{
		{"v1 first text", newDataTap, v1, 1, 1, 0, 2},
		{"v1 third text", newDataTap, v1, 4, 3, 4, 6},
		{"v2 first text", newUITap, v2, 1, 2, 0, 2},
		{"v2 second text", newUITap, v2, 3, 4, 2, 4},
	}
	for _, c := range cases {
		body := strings.Join(c.parts, "")
		start := len(strings.Join(c.parts[:c.part], ""))
		end := start + len(c.parts[c.part])
		prevEnd := len(strings.Join(c.parts[:c.part-1], ""))
		if strings.HasSuffix(c.parts[c.part], "\r\n") {
			end-- // a CR ends the blank line: the LF after it is the next read's
		}
		for size := 1; size <= len(body); size++ {
			for _, mode := range []string{"after", "before"} {
				tap := c.newTap()
				calls, whole := 0, false
				check := func(w bool) cutAction {
					calls++
					switch {
					case calls < c.calls:
						return goOn
					case mode == "before" && w:
						whole = true
						return cutBefore
					}
					return cutAfter
				}
				switch tt := tap.(type) {
				case *dataStreamTap:
					tt.check = check
				case *uiStreamTap:
					tt.check = check
				}
				took, cut := 0, false
				for took < len(body) && !cut {
					chunk := body[took:min(took+size, len(body))]
					n := tap.feed([]byte(chunk))
					cut = n < len(chunk) || calls == c.calls
					took += n
				}
				got := tap.outcome().textBytes
				switch {
				case whole && (took < prevEnd || took > start || got != c.before):
					t.Fatalf("%s, reads of %d: cut before at %d with %d text bytes, want between %d and %d with %d", c.name, size, took, got, prevEnd, start, c.before)
				case !whole && (took != end || got != c.with):
					t.Fatalf("%s, reads of %d, %s: cut after at %d with %d text bytes, want %d with %d", c.name, size, mode, took, got, end, c.with)
				case mode == "before" && size == len(body) && !whole:
					t.Fatalf("%s: a part in one read with the rest must come whole", c.name)
				}
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
