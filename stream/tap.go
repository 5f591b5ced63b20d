// Package stream reads assistant answers as they stream past: the protocol taps, what an answer costs in tokens, when a budget cuts it and how a cut answer ends.
package stream

import (
	"io"
	"strings"
	"sync/atomic"
	"time"
)

// Tap watches a streamed answer's bytes on their way to the client, for the finish reason and
// the token usage the upstream reports in it. There is one per protocol: the data stream
// protocol of AI SDK 4 (DataStream) and the UI message stream of AI SDK 5 and later
// (UIMessageStream), and Opaque for an answer in a content coding the gateway cannot read; the
// response's headers choose (IsUIMessageStream). A tap never holds a byte back: it sees each
// read after the upstream's body returned it and before it is written to the client, and keeps
// no more than the part or event it is in.
type Tap interface {
	// Feed looks at the next bytes of the answer, exactly as the upstream sent them, in
	// reads of any size: any split of the same bytes gives the same outcome. It returns how
	// many bytes it took: all of p, unless the tap's check stopped it at a part (Check).
	Feed(p []byte) int
	// Outcome is what the stream reported up to now.
	Outcome() *Outcome
}

// Outcome is what a tap learned of a stream.
type Outcome struct {
	// Reason is the finish part's finish reason, bounded by reasonLabel ("other" for another,
	// "unknown" when it had none or could not be read); "" until one passed.
	Reason   string
	FinishAt time.Time // when the finish part passed (the span's finish event)
	Errored  bool      // an error part passed (data stream 3:, UI message stream error)
	// Usage: the stream reported token usage, Prompt and Completion.
	Usage              bool
	Prompt, Completion int64
	// TextBytes is the UTF-8 length of the answer text that passed (data stream 0: parts,
	// UI message stream text-delta chunks), for the estimate of a stream that reports no usage.
	TextBytes int64
}

// Result is the stream's label for gateway_stream_finished_total and the logs: "error" when
// an error part passed (whatever finish followed), else the finish reason, else "incomplete".
func (o *Outcome) Result() string {
	switch {
	case o.Errored:
		return "error"
	case o.Reason != "":
		return o.Reason
	}
	return "incomplete"
}

// Results are every label Result gives: reasonLabel's and "incomplete".
func Results() []string {
	return []string{"stop", "length", "content-filter", "tool-calls", "error", "other", "unknown", "incomplete"}
}

// reasonLabel maps a finish reason to the AI SDK's finish reasons (stop, length,
// content-filter, tool-calls, error, other, unknown), any other to "other": the metric label
// stays bounded, and the string is not kept.
func reasonLabel(r []byte) string {
	switch string(r) {
	case "stop":
		return "stop"
	case "length":
		return "length"
	case "content-filter":
		return "content-filter"
	case "tool-calls":
		return "tool-calls"
	case "error":
		return "error"
	case "unknown":
		return "unknown"
	}
	return "other"
}

// uiStreamHeader marks the UI message stream (AI SDK 5 and later), in canonical form.
const uiStreamHeader = "X-Vercel-Ai-Ui-Message-Stream"

// IsUIMessageStream: the response whose headers are h (an http.Header) is the UI message
// stream when it says so in its header or is server-sent events; anything else is read as the
// data stream. The response decides, not the route, so a route serves whichever protocol its
// upstream speaks.
func IsUIMessageStream(h map[string][]string) bool {
	if v := h[uiStreamHeader]; len(v) > 0 && strings.TrimSpace(v[0]) == "v1" {
		return true
	}
	ct := h["Content-Type"]
	if len(ct) == 0 {
		return false
	}
	const sse = "text/event-stream"
	v := strings.TrimLeft(ct[0], " \t")
	if len(v) < len(sse) || !strings.EqualFold(v[:len(sse)], sse) {
		return false
	}
	rest := v[len(sse):]
	return rest == "" || rest[0] == ';' || rest[0] == ' ' || rest[0] == '\t'
}

// Body is the upstream's answer with a tap looking at every read on its way to the client.
// With a Cutoff, the read at which the budget ends the answer is cut there, the upstream's body
// closed (which ends the upstream request), and the end of the protocol follows (Ending).
type Body struct {
	io.ReadCloser
	tap Tap
	// cut, when not nil, is the answer's cutoff; promptBytes its conversation text, what the
	// cut answer's end reports it charged.
	cut         *Cutoff
	promptBytes int
	// ended is set when the answer's last bytes are handed out: the end of the response
	// follows at once, and sends them (the writer skips its own flush).
	ended *atomic.Bool
	// ending is what is still to be handed out of a cut answer's end: nil until it is built,
	// never after.
	ending []byte
	// progress, when not nil (Track), is told what passed after each read.
	progress *Progress
}

// Reset makes b read body through tap; cut (nil: none) ends it at its budget, promptBytes is
// the request's conversation text and ended is set when the answer's last bytes are handed out.
// It keeps the Progress that Track gave b.
func (b *Body) Reset(body io.ReadCloser, tap Tap, cut *Cutoff, promptBytes int, ended *atomic.Bool) {
	*b = Body{ReadCloser: body, tap: tap, cut: cut, promptBytes: promptBytes, ended: ended, progress: b.progress}
}

// Track makes b publish to p what the answer has passed after each read (nil: nowhere), from
// the next Reset on as well.
func (b *Body) Track(p *Progress) { b.progress = p }

// feed hands a read to the tap and publishes what passed; it returns what the tap took.
func (b *Body) feed(p []byte) int {
	k := b.tap.Feed(p)
	if b.progress != nil {
		b.progress.note(b.tap.Outcome())
	}
	return k
}

func (b *Body) Read(p []byte) (int, error) {
	if b.cut != nil {
		return b.readCut(p)
	}
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.feed(p[:n])
		if err == io.EOF {
			// The last part came with the end of the body: the answer ends right after it
			// is written, and its end flushes it.
			b.markEnded()
		}
	}
	return n, err
}

func (b *Body) markEnded() {
	if b.ended != nil {
		b.ended.Store(true)
	}
}
