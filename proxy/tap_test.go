package proxy

import (
	"io"
	"testing"
)

func TestFinishTap(t *testing.T) {
	stream := "f:{\"messageId\":\"m\"}\n0:\"d: not a finish\"\n0:\"x\"\ne:{\"finishReason\":\"stop\"}\nd:{\"finishReason\":\"length\",\"threadId\":\"t\"}\n"
	cases := []struct {
		name, body string
		want       string
	}{
		{"whole", stream, "length"},
		{"no finish part", "0:\"a\"\n0:\"b\"\n", "incomplete"},
		{"cut inside d:", "0:\"a\"\nd:{\"finishRea", "incomplete"},
		{"unknown reason", "d:{\"finishReason\":\"banana\"}\n", "other"},
		{"not json", "d:nonsense\n", "unknown"},
		{"d at start of body", "d:{\"finishReason\":\"stop\"}\n", "stop"},
		{"e part only", "e:{\"finishReason\":\"stop\"}\n", "incomplete"},
	}
	for _, c := range cases {
		// Every split into reads of every size must give the same answer and the same bytes.
		for size := 1; size <= len(c.body); size++ {
			tap := newFinishTap(io.NopCloser(&chunked{s: c.body, size: size}))
			got, err := io.ReadAll(tap)
			if err != nil || string(got) != c.body {
				t.Fatalf("%s: bytes changed: %q %v", c.name, got, err)
			}
			if r := tap.result(); r != c.want {
				t.Fatalf("%s, reads of %d bytes: reason %q, want %q", c.name, size, r, c.want)
			}
		}
	}
}

// chunked returns at most size bytes per Read.
type chunked struct {
	s    string
	size int
}

func (c *chunked) Read(p []byte) (int, error) {
	if c.s == "" {
		return 0, io.EOF
	}
	n := copy(p, c.s[:min(c.size, len(c.s))])
	c.s = c.s[n:]
	return n, nil
}

func TestFinishTapTokens(t *testing.T) {
	e := func(p, c string) string {
		return "e:{\"finishReason\":\"stop\",\"usage\":{\"promptTokens\":" + p + ",\"completionTokens\":" + c + "},\"isContinued\":false}\n"
	}
	cases := []struct {
		name, body   string
		prompt, comp int64
		ok           bool
	}{
		{"d total wins", "0:\"a\"\n" + e("3", "4") + e("5", "6") + "d:{\"finishReason\":\"stop\",\"usage\":{\"promptTokens\":8,\"completionTokens\":10}}\n", 8, 10, true},
		{"d total differs from steps", e("1", "1") + "d:{\"finishReason\":\"stop\",\"usage\":{\"promptTokens\":100,\"completionTokens\":200}}\n", 100, 200, true},
		{"cut after e parts", "0:\"a\"\n" + e("3", "4") + e("5", "6") + "0:\"more", 8, 10, true},
		{"cut inside an e part", e("3", "4") + "e:{\"finishReason\":\"stop\",\"usage\":{\"promptT", 3, 4, true},
		{"d without usage uses steps", e("2", "9") + "d:{\"finishReason\":\"stop\"}\n", 2, 9, true},
		{"no usage at all", "0:\"a\"\ne:{\"finishReason\":\"stop\"}\nd:{\"finishReason\":\"stop\"}\n", 0, 0, false},
		{"negative is ignored", e("-3", "4"), 0, 0, false},
		{"fraction is ignored", e("1.5", "4"), 0, 0, false},
		{"huge is ignored", e("1e300", "4"), 0, 0, false},
		{"text that looks like a part", "0:\"e:{\\\"usage\\\":{\\\"promptTokens\\\":9}}\"\n", 0, 0, false},
		{"e at start, no newline at end", e("7", "0")[:len(e("7", "0"))-1], 0, 0, false},
	}
	for _, c := range cases {
		for size := 1; size <= len(c.body); size++ {
			tap := newFinishTap(io.NopCloser(&chunked{s: c.body, size: size}))
			got, err := io.ReadAll(tap)
			if err != nil || string(got) != c.body {
				t.Fatalf("%s: bytes changed: %q %v", c.name, got, err)
			}
			p, comp, ok := tap.tokens()
			if p != c.prompt || comp != c.comp || ok != c.ok {
				t.Fatalf("%s, reads of %d bytes: tokens %d/%d/%v, want %d/%d/%v", c.name, size, p, comp, ok, c.prompt, c.comp, c.ok)
			}
		}
	}
}
