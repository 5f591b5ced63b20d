package proxy

import (
	"bytes"
	"encoding/json"
	"io"
	"math"
	"time"
)

// finishTap watches an AI SDK v4 data stream as it passes: it remembers the finish reason of
// its d: part (finish message) and the token usage of its e: parts (finish step) and d: part.
// It never buffers or delays: every Read returns exactly what the upstream body returned, and
// the tap only looks at the bytes on their way through.
type finishTap struct {
	io.ReadCloser
	atLineStart bool
	pending     byte      // 'd' or 'e' began a line at the end of the previous read
	inPart      byte      // inside a d: or e: line: which one
	line        []byte    // that line so far, capped
	reason      string    // "" until a d: part was seen
	finishAt    time.Time // when the d: part went by (for the span's finish event)

	// Usage: the d: part's (the answer's total) when it had one, else the sum of the e:
	// parts that passed, because those tokens were spent upstream even if the stream broke.
	dUsage, eUsage       bool
	dPrompt, dCompletion int64
	ePrompt, eCompletion int64
}

// maxPartLine caps what is kept of a d: or e: line; finishReason and usage come first in
// practice, and a longer line is parsed as far as it was kept (it then fails as JSON).
const maxPartLine = 4096

func newFinishTap(body io.ReadCloser) *finishTap {
	t := new(finishTap)
	t.start(body)
	return t
}

// start (re)sets the tap to watch body from its first byte.
func (t *finishTap) start(body io.ReadCloser) {
	line := t.line[:0]
	*t = finishTap{ReadCloser: body, atLineStart: true, line: line}
}

func (t *finishTap) Read(p []byte) (int, error) {
	n, err := t.ReadCloser.Read(p)
	t.scan(p[:n])
	return n, err
}

func isPart(c byte) bool { return c == 'd' || c == 'e' }

func (t *finishTap) scan(b []byte) {
	for len(b) > 0 {
		if t.inPart != 0 {
			i := bytes.IndexByte(b, '\n')
			end := len(b)
			if i >= 0 {
				end = i
			}
			if room := maxPartLine - len(t.line); room > 0 {
				t.line = append(t.line, b[:min(end, room)]...)
			}
			if i < 0 {
				return
			}
			t.part(t.inPart, t.line)
			t.inPart, t.line, t.atLineStart = 0, t.line[:0], true
			b = b[i+1:]
			continue
		}
		if t.pending != 0 {
			kind := t.pending
			t.pending = 0
			if b[0] == ':' {
				t.inPart = kind
				b = b[1:]
				continue
			}
			t.atLineStart = false
		}
		if t.atLineStart && isPart(b[0]) {
			if len(b) == 1 { // "d" and ":" may arrive in different reads
				t.pending = b[0]
				return
			}
			if b[1] == ':' {
				t.inPart = b[0]
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

// finishPart is what the tap reads of a d: or e: part.
type finishPart struct {
	FinishReason string `json:"finishReason"`
	Usage        *struct {
		PromptTokens     float64 `json:"promptTokens"`
		CompletionTokens float64 `json:"completionTokens"`
	} `json:"usage"`
}

// part takes in one complete d: or e: line.
func (t *finishTap) part(kind byte, line []byte) {
	var p finishPart
	err := json.Unmarshal(line, &p)
	if kind == 'd' {
		t.finishAt = time.Now()
		switch {
		case err != nil:
			t.reason = "unknown"
		case knownReasons[p.FinishReason]:
			t.reason = p.FinishReason
		default:
			t.reason = "other"
		}
	}
	if err != nil || p.Usage == nil {
		return
	}
	prompt, ok1 := tokenCount(p.Usage.PromptTokens)
	completion, ok2 := tokenCount(p.Usage.CompletionTokens)
	if !ok1 || !ok2 {
		return // a usage the gateway cannot trust is not counted
	}
	if kind == 'd' {
		t.dUsage, t.dPrompt, t.dCompletion = true, prompt, completion
		return
	}
	t.eUsage = true
	t.ePrompt += prompt
	t.eCompletion += completion
}

// maxTokens bounds one part's counts: larger values are not a model's usage.
const maxTokens = 1 << 40

func tokenCount(f float64) (int64, bool) {
	if math.IsNaN(f) || f < 0 || f > maxTokens || f != math.Trunc(f) {
		return 0, false
	}
	return int64(f), true
}

// result is the finish reason, or "incomplete" when the stream ended without a d: part.
func (t *finishTap) result() string {
	if t.reason == "" {
		return "incomplete"
	}
	return t.reason
}

// tokens is the answer's usage: the d: part's, else the sum of the e: parts seen; ok is false
// when the stream reported none.
func (t *finishTap) tokens() (prompt, completion int64, ok bool) {
	switch {
	case t.dUsage:
		return t.dPrompt, t.dCompletion, true
	case t.eUsage:
		return t.ePrompt, t.eCompletion, true
	}
	return 0, 0, false
}
