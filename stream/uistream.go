package stream

import (
	"strconv"
	"time"
)

// UIMessageStream reads the UI message stream of AI SDK 5 and later: server-sent events, each
// "data: {JSON chunk}" and a blank line, ending with "data: [DONE]". It reads the events
// as a client's SSE parser does (lines ending in LF, CRLF or CR; several data lines joined
// by LF; comments and other fields ignored; a leading byte-order mark dropped; an event
// counts once its blank line has passed) and, of the chunks:
//   - text-delta: the length of its delta (the answer text, for the estimate);
//   - start, message-metadata, finish: messageMetadata.usage, {"inputTokens": N,
//     "outputTokens": M} (the platform's contract; other fields ignored); the last one seen
//     is the answer's usage;
//   - finish: its finishReason ("unknown" when it has none);
//   - error: that an error passed.
//
// An event's data is kept until its blank line, up to maxEventData bytes; of a longer
// event only the members wholly within that prefix are read (a text-delta cut there counts
// its whole length as text).
type UIMessageStream struct {
	out Outcome

	// The line being read.
	field    [8]byte // its field name so far (room for a byte-order mark and "data")
	fieldLen int
	inValue  bool // past the field's colon (of a data field, unless skip)
	trimmed  bool // the value's one optional leading space has been dealt with
	skip     bool // the rest of the line does not matter (another field, a comment)
	afterCR  bool // the last line ended in CR: an LF right after it ends nothing
	started  bool // a line has ended: no byte-order mark any more

	// The event being read.
	hasData bool   // a data field was seen
	data    []byte // its data lines joined, up to maxEventData (backed by buf at first)
	size    int    // its whole length
	buf     [256]byte

	// check, when set, runs after each event (see Checker): mark is where the current read
	// may be cut before the event that just ended, saved the outcome there.
	check Checker
	mark  int
	saved Outcome
}

var _ Tap = (*UIMessageStream)(nil)

// maxEventData bounds the data kept of one event.
const maxEventData = 64 << 10

// Reset makes the tap watch a new stream from its first byte; check, when not nil, runs after
// each event (see Checker).
func (t *UIMessageStream) Reset(check Checker) {
	*t = UIMessageStream{check: check}
	t.data = t.buf[:0]
}

// Outcome is what the stream reported up to now.
func (t *UIMessageStream) Outcome() *Outcome { return &t.out }

// Feed reads the next bytes of the stream (see Tap).
func (t *UIMessageStream) Feed(b []byte) int {
	n := len(b)
	t.markRead()
	for len(b) > 0 {
		if t.afterCR {
			t.afterCR = false
			if b[0] == '\n' {
				b = b[1:]
				continue
			}
		}
		var ok bool
		switch {
		case t.inValue && !t.skip:
			if b, ok = t.value(b); !ok {
				return n
			}
		case t.skip:
			if b, ok = t.skipLine(b); !ok {
				return n
			}
		default:
			c := b[0]
			b = b[1:]
			if t.fieldByte(c) && t.check != nil {
				if end, cut := cutAt(t.check, &t.mark, &t.out, &t.saved, n-len(b)); cut {
					return end
				}
			}
		}
	}
	return n
}

// markRead notes, for a check, where the read at hand may be cut before an event: at its start
// when no event is under way, else nowhere (an event begun in an earlier read is out already).
func (t *UIMessageStream) markRead() {
	if t.check == nil {
		return
	}
	t.mark = -1
	if t.fieldLen == 0 && !t.inValue && !t.skip && !t.hasData {
		t.mark, t.saved = 0, t.out
	}
}

// value takes a data field's value up to its line's end; it returns what follows the line, and
// false when the line goes on past b.
func (t *UIMessageStream) value(b []byte) ([]byte, bool) {
	i := lineEnd(b)
	seg := b
	if i >= 0 {
		seg = b[:i]
	}
	if !t.trimmed && len(seg) > 0 {
		t.trimmed = true
		if seg[0] == ' ' {
			seg = seg[1:]
		}
	}
	t.appendData(seg)
	if i < 0 {
		return nil, false
	}
	t.endLine(b[i])
	return b[i+1:], true
}

// skipLine passes over the rest of a line that does not matter; it returns what follows the
// line, and false when the line goes on past b.
func (t *UIMessageStream) skipLine(b []byte) ([]byte, bool) {
	i := lineEnd(b)
	if i < 0 {
		return nil, false
	}
	t.endLine(b[i])
	return b[i+1:], true
}

// fieldByte takes one byte of a line's field name (or the line's end, or the colon after the
// name); it reports whether a blank line just ended an event.
func (t *UIMessageStream) fieldByte(c byte) bool {
	switch c {
	case '\r', '\n':
		blank := t.fieldLen == 0
		if blank {
			t.dispatch() // a blank line ends the event
		} else if t.isData() {
			t.beginData() // "data" alone: an empty data line
		}
		t.endLine(c)
		return blank
	case ':':
		t.inValue = true
		if t.isData() {
			t.beginData()
		} else {
			t.skip = true // a comment (empty name) or a field the tap does not need
		}
	default:
		if t.fieldLen == len(t.field) {
			t.skip = true // no field the tap reads is that long
			return false
		}
		t.field[t.fieldLen] = c
		t.fieldLen++
	}
	return false
}

// lineEnd is the index of the first CR or LF in b, or -1.
func lineEnd(b []byte) int {
	for i, c := range b {
		if c == '\n' || c == '\r' {
			return i
		}
	}
	return -1
}

// isData: the line's field is data (after the byte-order mark a stream may start with).
func (t *UIMessageStream) isData() bool {
	f := t.field[:t.fieldLen]
	if !t.started && len(f) >= 3 && f[0] == 0xEF && f[1] == 0xBB && f[2] == 0xBF {
		f = f[3:]
	}
	return string(f) == "data"
}

// beginData starts a data line: joined to the event's earlier ones by an LF.
func (t *UIMessageStream) beginData() {
	if t.hasData {
		t.appendData([]byte{'\n'})
	}
	t.hasData = true
}

func (t *UIMessageStream) appendData(seg []byte) {
	if len(seg) == 0 {
		return
	}
	t.size += len(seg)
	if room := maxEventData - len(t.data); room > 0 {
		t.data = append(t.data, seg[:min(len(seg), room)]...)
	}
}

func (t *UIMessageStream) endLine(c byte) {
	t.fieldLen, t.inValue, t.trimmed, t.skip = 0, false, false, false
	t.afterCR = c == '\r'
	t.started = true
}

// dispatch takes in the event whose blank line just passed.
func (t *UIMessageStream) dispatch() {
	if t.hasData {
		t.event(t.data, t.size > len(t.data))
	}
	t.hasData, t.size = false, 0
	if cap(t.data) > len(t.buf) {
		t.data = t.buf[:0] // a long event's buffer is not kept for the rest of the stream
	} else {
		t.data = t.data[:0]
	}
}

// Chunk types the tap reads.
const (
	chunkOther = iota
	chunkStart
	chunkTextDelta
	chunkMetadata
	chunkFinish
	chunkError
)

func chunkType(raw []byte) int {
	switch string(raw) {
	case "text-delta":
		return chunkTextDelta
	case "start":
		return chunkStart
	case "message-metadata":
		return chunkMetadata
	case "finish":
		return chunkFinish
	case "error":
		return chunkError
	}
	return chunkOther
}

// event reads one chunk; cut says data is only the event's first maxEventData bytes.
func (t *UIMessageStream) event(data []byte, cut bool) {
	if string(data) == "[DONE]" {
		return
	}
	typ := chunkOther
	var delta, reason, meta []byte
	haveDelta, haveReason := false, false
	whole := eachMember(data, func(key []byte, escaped bool, val []byte) {
		switch {
		case keyIs(key, escaped, "type"):
			typ = chunkOther
			if s, ok := stringContents(val); ok {
				typ = chunkType(s)
			}
		case keyIs(key, escaped, "delta"):
			delta, haveDelta = val, true
		case keyIs(key, escaped, "finishReason"):
			reason, haveReason = val, true
		case keyIs(key, escaped, "messageMetadata"):
			meta = val
		}
	})
	if !whole && !cut {
		return // not JSON: a client fails on it too
	}
	switch typ {
	case chunkTextDelta:
		if n, ok := textLen(delta); haveDelta && ok {
			t.out.TextBytes += n
		} else if cut {
			t.out.TextBytes += int64(t.size) // its delta ran past what was kept
		}
	case chunkError:
		t.out.Errored = true
	case chunkFinish:
		t.out.FinishAt = time.Now()
		t.out.Reason = "unknown" // the finish chunk's finishReason is optional (absent in SDK 5)
		if s, ok := stringContents(reason); haveReason && ok {
			t.out.Reason = reasonLabel(s)
		}
		t.usage(meta)
	case chunkStart, chunkMetadata:
		t.usage(meta)
	}
}

// usage takes messageMetadata.usage when it is one the gateway can trust: an object whose
// inputTokens and outputTokens, where present (not null), are whole numbers of tokens, at
// least one of them present. Anything else leaves the usage seen before.
func (t *UIMessageStream) usage(meta []byte) {
	if meta == nil {
		return
	}
	var usage []byte
	eachMember(meta, func(key []byte, escaped bool, val []byte) {
		if keyIs(key, escaped, "usage") {
			usage = val
		}
	})
	if usage == nil {
		return
	}
	prompt, completion, present, ok := tokenPair(usage, "inputTokens", "outputTokens")
	if !ok || !present {
		return
	}
	t.out.Usage, t.out.Prompt, t.out.Completion = true, prompt, completion
}

// tokenPair reads the token counts named in and out of the JSON object usage (the last
// member of each name): ok when usage is an object and each count is absent, null or a whole
// number of tokens (absent and null count 0); present when at least one count is there.
func tokenPair(usage []byte, in, out string) (nIn, nOut int64, present, ok bool) {
	var vin, vout []byte
	if !eachMember(usage, func(key []byte, escaped bool, val []byte) {
		switch {
		case keyIs(key, escaped, in):
			vin = val
		case keyIs(key, escaped, out):
			vout = val
		}
	}) {
		return 0, 0, false, false
	}
	nIn, ok1, has1 := tokenValue(vin)
	nOut, ok2, has2 := tokenValue(vout)
	return nIn, nOut, has1 || has2, ok1 && ok2
}

// tokenValue reads a token count: absent or null is 0 and not there; a number must be a
// whole count.
func tokenValue(val []byte) (n int64, ok, present bool) {
	if val == nil || string(val) == "null" {
		return 0, true, false
	}
	f, err := strconv.ParseFloat(string(val), 64)
	if err != nil {
		return 0, false, true
	}
	n, ok = tokenCount(f)
	return n, ok, true
}
