package stream

import (
	"bytes"
	"math"
	"time"
)

// DataStream reads the data stream protocol of AI SDK 4 (lines "<code>:<JSON>\n"): the finish reason
// and usage of its d: part (finish message), the usage of its e: parts (finish step), the
// text of its 0: parts and whether a 3: part (error) passed. d: and e: lines are kept (up to
// maxPartLine) until they end; 0: text is counted as it passes, without being kept.
type DataStream struct {
	dataCounts
	atLineStart bool
	pending     byte   // a part's code began a line at the end of the previous read
	inPart      byte   // inside a part this tap reads: its code
	line        []byte // a d: or e: line so far, capped (backed by buf at first)
	text        jsonTextLen
	// buf holds the usual d: and e: lines (about 100 bytes), so a stream allocates none for
	// them; a longer line grows line on the heap for itself only (see endPart).
	buf [256]byte

	// check, when set, runs after each part it counts (see Checker): mark is where the
	// current read may be cut before the part that just ended, saved the counts there.
	check Checker
	mark  int
	saved dataCounts
}

// dataCounts is what a DataStream has counted.
type dataCounts struct {
	out Outcome
	// Usage: the d: part's (the answer's total) when it had one, else the sum of the e:
	// parts that passed, because those tokens were spent upstream even if the stream broke.
	dUsage, eUsage       bool
	dPrompt, dCompletion int64
	ePrompt, eCompletion int64
}

var _ Tap = (*DataStream)(nil)

// maxPartLine caps what is kept of a d: or e: line; finishReason and usage come first in
// practice, and a longer line is parsed as far as it was kept (it then fails as JSON).
const maxPartLine = 4096

// Reset makes the tap watch a new stream from its first byte; check, when not nil, runs after
// each part it counts (see Checker).
func (t *DataStream) Reset(check Checker) {
	*t = DataStream{atLineStart: true, check: check}
	t.line = t.buf[:0]
}

// isPart: the codes whose lines the tap reads.
func isPart(c byte) bool { return c == 'd' || c == 'e' || c == '0' || c == '3' }

// Feed reads the next bytes of the stream (see Tap).
func (t *DataStream) Feed(b []byte) int {
	n := len(b)
	t.markRead()
	for len(b) > 0 {
		var ok bool
		if t.inPart != 0 {
			if b, ok = t.partBytes(b); !ok {
				return n
			}
			if t.check != nil {
				if end, cut := cutAt(t.check, &t.mark, &t.dataCounts, &t.saved, n-len(b)); cut {
					return end
				}
			}
			continue
		}
		if b, ok = t.lineStart(b); !ok {
			return n
		}
	}
	return n
}

// markRead notes, for a check, where the read at hand may be cut before a part: at its start
// when no part is under way, else nowhere (a part begun in an earlier read is out already).
func (t *DataStream) markRead() {
	if t.check == nil {
		return
	}
	t.mark = -1
	if t.atLineStart && t.inPart == 0 && t.pending == 0 {
		t.mark, t.saved = 0, t.dataCounts
	}
}

// partBytes takes the bytes of the part under way up to its line's end, and the part with it;
// it returns what follows the line, and false when the line goes on past b.
func (t *DataStream) partBytes(b []byte) ([]byte, bool) {
	i := bytes.IndexByte(b, '\n')
	end := len(b)
	if i >= 0 {
		end = i
	}
	switch t.inPart {
	case '0':
		t.text.Feed(b[:end])
	case 'd', 'e':
		if room := maxPartLine - len(t.line); room > 0 {
			t.line = append(t.line, b[:min(end, room)]...)
		}
	}
	if i < 0 {
		return nil, false
	}
	t.endPart()
	return b[i+1:], true
}

// lineStart reads what is not inside a part the tap reads: a part's code at a line's start
// (which begins it), or a line to pass over. It returns what follows, and false when b ends
// first.
func (t *DataStream) lineStart(b []byte) ([]byte, bool) {
	if t.pending != 0 {
		code := t.pending
		t.pending = 0
		if b[0] == ':' {
			t.beginPart(code)
			return b[1:], true
		}
		t.atLineStart = false
	}
	if t.atLineStart && isPart(b[0]) {
		if len(b) == 1 { // "d" and ":" may arrive in different reads
			t.pending = b[0]
			return nil, false
		}
		if b[1] == ':' {
			t.beginPart(b[0])
			return b[2:], true
		}
	}
	i := bytes.IndexByte(b, '\n')
	if i < 0 {
		t.atLineStart = false
		return nil, false
	}
	t.atLineStart = true
	return b[i+1:], true
}

func (t *DataStream) beginPart(code byte) {
	t.inPart = code
	if code == '0' {
		t.text.reset()
	}
}

// endPart takes in a part whose line has ended.
func (t *DataStream) endPart() {
	switch t.inPart {
	case '0':
		// Only a whole string counts: a client's parser drops a broken line.
		if n, ok := t.text.done(); ok {
			t.out.TextBytes += n
		}
	case '3':
		t.out.Errored = true
	case 'd', 'e':
		t.part(t.inPart, t.line)
	}
	t.inPart, t.line, t.atLineStart = 0, t.line[:0], true
	if cap(t.line) > len(t.buf) {
		t.line = t.buf[:0] // a long line's buffer is not kept for the rest of the stream
	}
}

// part takes in one complete d: or e: line: its finishReason (a d: part's is the stream's)
// and its usage, {"promptTokens": N, "completionTokens": M} (absent or null counts 0). It
// reads the members of the exact names, as the AI SDK's parser does, without decoding the
// line into Go values. A line that is no JSON object makes the reason "unknown" and counts no
// usage; a usage the gateway cannot trust (not whole numbers of tokens) is not counted.
func (t *DataStream) part(kind byte, line []byte) {
	var reason, usage []byte
	haveReason := false
	whole := eachMember(line, func(key []byte, escaped bool, val []byte) {
		switch {
		case keyIs(key, escaped, "finishReason"):
			reason, haveReason = val, true
		case keyIs(key, escaped, "usage"):
			usage = val
		}
	})
	if kind == 'd' {
		t.out.FinishAt = time.Now()
		r, isString := stringContents(reason)
		switch {
		case !whole || (haveReason && !isString && string(reason) != "null"):
			t.out.Reason = "unknown"
		default:
			t.out.Reason = reasonLabel(r) // "other" when absent, null or unknown
		}
	}
	if !whole || usage == nil || string(usage) == "null" {
		return
	}
	prompt, completion, _, ok := tokenPair(usage, "promptTokens", "completionTokens")
	if !ok {
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

// Outcome: the usage is the d: part's when it had one, else the sum of the e: parts seen.
func (t *DataStream) Outcome() *Outcome {
	o := &t.out
	switch {
	case t.dUsage:
		o.Usage, o.Prompt, o.Completion = true, t.dPrompt, t.dCompletion
	case t.eUsage:
		o.Usage, o.Prompt, o.Completion = true, t.ePrompt, t.eCompletion
	}
	return o
}

// maxTokens bounds one part's counts: larger values are not a model's usage.
const maxTokens = 1 << 40

func tokenCount(f float64) (int64, bool) {
	if math.IsNaN(f) || f < 0 || f > maxTokens || f != math.Trunc(f) {
		return 0, false
	}
	return int64(f), true
}
