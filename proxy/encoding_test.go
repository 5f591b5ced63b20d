package proxy

import (
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/docsgate/gateway/internal/codingtest"
)

// A coded stream passes part by part like one in clear: each part reaches the client in clear
// while the upstream waits to send the next (a part held back would deadlock the lockstep), and
// the client never sees the coding. The upstream was asked for identity.
func TestCodedStreamIsUnbuffered(t *testing.T) {
	for name := range codingtest.Codings() {
		if name == "xor" {
			continue
		}
		t.Run(name, func(t *testing.T) {
			l, handle := newLockstep("text/plain; charset=utf-8", false, streamParts)
			up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
				cw := codingtest.NewWriter(w, name)
				handle(cw, r)
				cw.Close()
			})
			g := newGateway(t, up)
			req, _ := http.NewRequest("POST", g.URL+"/discovery/v1/assistant/acme/message", strings.NewReader(assistantBody))
			req.Header = jsonHdr(assistantKey)
			req.Header.Set("Accept-Encoding", "gzip, deflate, br, zstd")
			res, err := g.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			if ce, cl := res.Header.Get("Content-Encoding"), res.Header.Get("Content-Length"); ce != "" || cl != "" {
				t.Fatalf("the client got Content-Encoding %q, Content-Length %q", ce, cl)
			}
			readParts(t, l, res.Body)
			if rest, err := io.ReadAll(res.Body); err != nil || len(rest) != 0 {
				t.Fatalf("after the parts: %q %v", rest, err)
			}
			if ae := up.requests()[0].Header.Values("Accept-Encoding"); !slices.Equal(ae, []string{"identity"}) {
				t.Fatalf("the upstream was asked for %q", ae)
			}
		})
	}
}

// An answer in a coding the gateway cannot read reaches the client byte for byte as it came,
// with its coding, and is counted as text by its bytes: never free.
func TestUnreadableStreamPassesAsItCame(t *testing.T) {
	stream := strings.Join(streamParts, "")
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Content-Encoding", "x-xor")
		_, _ = w.Write(codingtest.Xor([]byte(stream)))
	})
	g := newGateway(t, up)
	res, body := g.do(t, "POST", "/discovery/v1/assistant/acme/message", jsonHdr(assistantKey), assistantBody)
	if res.StatusCode != 200 || res.Header.Get("Content-Encoding") != "x-xor" || string(codingtest.Xor(body)) != stream {
		t.Fatalf("status %d, Content-Encoding %q, body %q", res.StatusCode, res.Header.Get("Content-Encoding"), codingtest.Xor(body))
	}
	eventually(t, "the answer counted as other", func() bool {
		return g.counter(t, "gateway_stream_encoded_total", "route", "assistant_message", "encoding", "other") == 1
	})
	// The finish part went by unread: the stream is incomplete and charged its bytes as text.
	if n := g.counter(t, "gateway_stream_finished_total", "route", "assistant_message", "reason", "incomplete"); n != 1 {
		t.Fatalf("finished incomplete: %v", n)
	}
	want := float64((len(stream) + 3) / 4) // a token per 4 bytes, rounded up
	if got := g.counter(t, "gateway_stream_tokens_estimated_total", "route", "assistant_message", "kind", "completion"); got != want {
		t.Fatalf("completion tokens by estimate: %v, want %v (every byte as text)", got, want)
	}
}

// A coded stream that breaks off mid-way (here: its gzip never ends) ends like an upstream
// that broke off: the client keeps every part that was decoded and sees a clean end, and the
// break counts as the upstream's (reset), not as the client's going away.
func TestCodedStreamBrokenEndsCleanly(t *testing.T) {
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		cw := codingtest.NewWriter(w, "gzip")
		for _, p := range streamParts[:3] {
			_, _ = io.WriteString(cw, p)
			cw.Flush()
		}
		// No Close: the gzip stream has no end, while the HTTP answer ends cleanly.
	})
	g := newGateway(t, up)
	res, body := g.do(t, "POST", "/discovery/v1/assistant/acme/message", jsonHdr(assistantKey), assistantBody)
	if res.StatusCode != 200 || string(body) != strings.Join(streamParts[:3], "") {
		t.Fatalf("status %d, body %q", res.StatusCode, body)
	}
	eventually(t, "the break counted as the upstream's", func() bool {
		return g.counter(t, "gateway_upstream_errors_total", "route", "assistant_message", "kind", "reset") == 1
	})
}
