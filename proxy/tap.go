package proxy

import (
	"bytes"
	"encoding/json"
	"io"
)

// finishTap watches an AI SDK v4 data stream as it passes and remembers the finish reason of
// its d: part (finish message). It never buffers or delays: every Read returns exactly what
// the upstream body returned, and the tap only looks at the bytes on their way through.
type finishTap struct {
	io.ReadCloser
	atLineStart bool
	pendingD    bool   // a line started with "d" at the end of the previous read
	inFinish    bool   // inside a d: line
	line        []byte // the d: line so far, capped
	reason      string // "" until a d: part was seen
}

// maxFinishLine caps what is kept of a d: line; the finish reason comes first in practice.
const maxFinishLine = 1024

func newFinishTap(body io.ReadCloser) *finishTap {
	t := new(finishTap)
	t.start(body)
	return t
}

// start (re)sets the tap to watch body from its first byte.
func (t *finishTap) start(body io.ReadCloser) {
	*t = finishTap{ReadCloser: body, atLineStart: true}
}

func (t *finishTap) Read(p []byte) (int, error) {
	n, err := t.ReadCloser.Read(p)
	t.scan(p[:n])
	return n, err
}

func (t *finishTap) scan(b []byte) {
	for len(b) > 0 {
		if t.inFinish {
			i := bytes.IndexByte(b, '\n')
			end := len(b)
			if i >= 0 {
				end = i
			}
			if room := maxFinishLine - len(t.line); room > 0 {
				t.line = append(t.line, b[:min(end, room)]...)
			}
			if i < 0 {
				return
			}
			t.reason = finishReason(t.line)
			t.inFinish, t.line, t.atLineStart = false, t.line[:0], true
			b = b[i+1:]
			continue
		}
		if t.pendingD {
			t.pendingD = false
			if b[0] == ':' {
				t.inFinish = true
				b = b[1:]
				continue
			}
			t.atLineStart = false
		}
		if t.atLineStart && b[0] == 'd' {
			if len(b) == 1 { // "d" and ":" may arrive in different reads
				t.pendingD = true
				return
			}
			if b[1] == ':' {
				t.inFinish = true
				b = b[2:]
				continue
			}
		}
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			t.atLineStart = false
			return
		}
		t.atLineStart = true
		b = b[i+1:]
	}
}

// knownReasons bounds the metric label to the AI SDK's finish reasons.
var knownReasons = map[string]bool{
	"stop": true, "length": true, "content-filter": true, "tool-calls": true,
	"error": true, "other": true, "unknown": true,
}

func finishReason(line []byte) string {
	var part struct {
		FinishReason string `json:"finishReason"`
	}
	if json.Unmarshal(line, &part) != nil {
		return "unknown"
	}
	if knownReasons[part.FinishReason] {
		return part.FinishReason
	}
	return "other"
}

// result is the finish reason, or "incomplete" when the stream ended without a d: part.
func (t *finishTap) result() string {
	if t.reason == "" {
		return "incomplete"
	}
	return t.reason
}
