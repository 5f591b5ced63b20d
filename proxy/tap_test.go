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
