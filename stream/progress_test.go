package stream

import (
	"io"
	"strings"
	"testing"
)

// A Body tracked by a Progress publishes what passed after each read, across a Reset: nothing
// before any answer text, then the estimate of the conversation's and the answer's text (as a
// settle of an answer whose client went away charges it), then a usage report larger than the
// estimate; the caps of each tokens limit apply as Charge.Of's.
func TestProgressPublishesWhatPassed(t *testing.T) {
	var p Progress
	p.Start(40) // 40 bytes of conversation text: 10 tokens
	var b Body
	b.Track(&p)
	pr, pw := io.Pipe()
	var tap DataStream
	tap.Reset(nil)
	b.Reset(pr, &tap, nil, 40, nil)
	buf := make([]byte, 256)
	send := func(s string) {
		t.Helper()
		go func() { _, _ = io.WriteString(pw, s) }()
		if n, err := b.Read(buf); err != nil || n != len(s) {
			t.Fatalf("read %d %v", n, err)
		}
	}
	send("f:{\"messageId\":\"m\"}\n")
	if got := p.Passed(1000, 100); got != 0 {
		t.Fatalf("nothing passed yet: %d", got)
	}
	send("0:" + `"` + strings.Repeat("x", 30) + `"` + "\n") // 30 bytes: 8 tokens
	if got := p.Passed(1000, 100); got != 18 {
		t.Fatalf("after the first text: %d, want 10 + 8", got)
	}
	if got := p.Passed(4, 100); got != 12 {
		t.Fatalf("estimate_max 4 caps the prompt: %d, want 4 + 8", got)
	}
	send(`e:{"finishReason":"stop","usage":{"promptTokens":20,"completionTokens":30},"isContinued":false}` + "\n")
	if got := p.Passed(1000, 100); got != 50 {
		t.Fatalf("after a usage report: %d, want 50", got)
	}
	pw.Close()
}
