package proxy

import (
	"bytes"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/docsgate/gateway/internal/codingtest"
)

func TestAnswerCodings(t *testing.T) {
	for _, tc := range []struct {
		values []string
		want   []contentCoding
		label  string
		ok     bool
	}{
		{nil, nil, "", true},
		{[]string{"identity"}, nil, "", true},
		{[]string{"gzip"}, []contentCoding{codingGzip}, "gzip", true},
		{[]string{"X-GZIP"}, []contentCoding{codingGzip}, "gzip", true},
		{[]string{" deflate "}, []contentCoding{codingDeflate}, "deflate", true},
		{[]string{"gzip, br"}, []contentCoding{codingGzip, codingBrotli}, "br", true},
		{[]string{"gzip", "zstd"}, []contentCoding{codingGzip, codingZstd}, "zstd", true},
		{[]string{"identity, br,"}, []contentCoding{codingBrotli}, "br", true},
		{[]string{"compress"}, nil, "other", false},
		{[]string{"gzip, x-custom"}, nil, "other", false},
		{[]string{"gzip, gzip, gzip"}, nil, "other", false}, // past maxCodings
	} {
		cs, label, ok := answerCodings(tc.values)
		if !slices.Equal(cs, tc.want) || label.String() != tc.label || ok != tc.ok {
			t.Errorf("%q: %v %q %v, want %v %q %v", tc.values, cs, label, ok, tc.want, tc.label, tc.ok)
		}
	}
}

// Every coding the gateway reads decodes to the answer as it was, whatever the sizes of the
// upstream's reads; an empty answer is empty, a truncated or corrupt one an error (never a
// clean end), and deflate is read with or without its zlib wrapper.
func TestDecodingBody(t *testing.T) {
	answer := []byte(strings.Repeat("data: {\"type\":\"text-delta\",\"id\":\"t1\",\"delta\":\"hello\"}\n\n", 200))
	for name, ce := range codingtest.Codings() {
		if name == "xor" {
			continue
		}
		t.Run(name, func(t *testing.T) {
			cs, _, ok := answerCodings([]string{ce})
			if !ok {
				t.Fatalf("%q is not read", ce)
			}
			coded := codingtest.Encode(name, answer)
			for _, raw := range []io.Reader{bytes.NewReader(coded), iotest.OneByteReader(bytes.NewReader(coded)), iotest.HalfReader(bytes.NewReader(coded))} {
				d := &decodingBody{raw: io.NopCloser(raw), codings: cs}
				got, err := io.ReadAll(d)
				if err != nil || !bytes.Equal(got, answer) {
					t.Fatalf("decoded %d bytes (%v), want %d", len(got), err, len(answer))
				}
				if err := d.Close(); err != nil || d.Close() != nil {
					t.Fatalf("close: %v", err)
				}
			}
			d := &decodingBody{raw: io.NopCloser(bytes.NewReader(coded[:len(coded)*2/3])), codings: cs}
			if _, err := io.ReadAll(d); err == nil {
				t.Fatal("a truncated answer read as whole")
			}
			if got, err := io.ReadAll(&decodingBody{raw: io.NopCloser(strings.NewReader("")), codings: cs}); err != nil || len(got) != 0 {
				t.Fatalf("an empty answer: %q %v", got, err)
			}
		})
	}
	d := &decodingBody{raw: io.NopCloser(strings.NewReader("this is no gzip at all")), codings: []contentCoding{codingGzip}}
	if _, err := io.ReadAll(d); err == nil || !strings.Contains(err.Error(), "decoding the answer's gzip") {
		t.Fatalf("corrupt gzip: %v", err)
	}
}

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
	want := float64(ceilQuarter(int64(len(stream))))
	if got := g.counter(t, "gateway_stream_tokens_estimated_total", "route", "assistant_message", "kind", "completion"); got != want {
		t.Fatalf("completion tokens by estimate: %v, want %v (every byte as text)", got, want)
	}
}

// The opaque tap counts every byte as text in reads of any size, and with a check drops a
// read that would take the answer past its budget, whole.
func TestOpaqueTap(t *testing.T) {
	var tap opaqueTap
	for _, n := range []int{1, 100, 7} {
		if got := tap.feed(make([]byte, n)); got != n {
			t.Fatalf("took %d of %d", got, n)
		}
	}
	if tap.outcome().textBytes != 108 || tap.outcome().result() != "incomplete" {
		t.Fatalf("outcome %+v", *tap.outcome())
	}
	budget := int64(50)
	tap = opaqueTap{check: func(whole bool) cutAction {
		if !whole {
			t.Fatal("an opaque read is always whole")
		}
		if tap.out.textBytes > budget {
			return cutBefore
		}
		return goOn
	}}
	if tap.feed(make([]byte, 40)) != 40 || tap.feed(make([]byte, 20)) != 0 || tap.outcome().textBytes != 40 {
		t.Fatalf("the read past the budget was not dropped: %+v", *tap.outcome())
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
