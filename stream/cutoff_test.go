package stream

import (
	"strings"
	"testing"
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
		newTap func() Tap
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
				check := CheckFunc(func(w bool) Action {
					calls++
					switch {
					case calls < c.calls:
						return GoOn
					case mode == "before" && w:
						whole = true
						return CutBefore
					}
					return CutAfter
				})
				switch tt := tap.(type) {
				case *DataStream:
					tt.Reset(check)
				case *UIMessageStream:
					tt.Reset(check)
				}
				took, cut := 0, false
				for took < len(body) && !cut {
					chunk := body[took:min(took+size, len(body))]
					n := tap.Feed([]byte(chunk))
					cut = n < len(chunk) || calls == c.calls
					took += n
				}
				got := tap.Outcome().TextBytes
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
