package proxy

import (
	"io"
	"net/http"
	"strings"
	"time"
)

// streamTap watches a streamed answer's bytes on their way to the client, for the finish
// reason and the token usage the upstream reports in it. There is one per protocol: the AI
// SDK v4 data stream (dataStreamTap, tap.go) and the UI message stream of AI SDK 5 and later
// (uiStreamTap, uistream.go); the response's headers choose (newTap). A tap never holds a
// byte back: it sees each read after the upstream's body returned it and before the reverse
// proxy writes it, and keeps no more than the part or event it is in.
type streamTap interface {
	// feed looks at the next bytes of the answer, exactly as the upstream sent them, in
	// reads of any size: any split of the same bytes gives the same outcome.
	feed(p []byte)
	// outcome is what the stream reported up to now.
	outcome() *streamOutcome
}

// streamOutcome is what a tap learned of a stream.
type streamOutcome struct {
	// reason is the finish part's finish reason, bounded by reasonLabel ("other" for
	// another, "unknown" when it had none or could not be read); "" until one passed.
	reason   string
	finishAt time.Time // when the finish part passed (the span's finish event)
	errored  bool      // an error part passed (v4 3:, UI stream error)
	// usage: the stream reported token usage, prompt and completion.
	usage              bool
	prompt, completion int64
	// textBytes is the UTF-8 length of the answer text that passed (v4 0: parts, UI stream
	// text-delta chunks), for the estimate of a stream that reports no usage.
	textBytes int64
}

// result is the stream's label for gateway_stream_finished_total and the logs: "error" when
// an error part passed (whatever finish followed), else the finish reason, else
// "incomplete".
func (o *streamOutcome) result() string {
	switch {
	case o.errored:
		return "error"
	case o.reason != "":
		return o.reason
	}
	return "incomplete"
}

// tokens is what a stream is charged: the usage it reported, or else an estimate, because
// a client that closes early (before the usage, which comes last) must not be charged 0:
// the prompt is a token per 4 bytes of the request body, the completion a token per 4
// bytes of the answer text that passed, both rounded up.
func (o *streamOutcome) tokens(bodyBytes int) (prompt, completion int64, estimated bool) {
	if o.usage {
		return o.prompt, o.completion, false
	}
	return ceilQuarter(int64(bodyBytes)), ceilQuarter(o.textBytes), true
}

func ceilQuarter(n int64) int64 { return (n + 3) / 4 }

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

// tappedBody is the upstream's response body with a tap looking at every read.
type tappedBody struct {
	io.ReadCloser
	tap streamTap
	rw  *responseWriter
}

func (b *tappedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.tap.feed(p[:n])
		if err == io.EOF {
			// The last part came with the end of the body: the answer ends right after it
			// is written, and its end flushes it (responseWriter.ended).
			b.rw.ended.Store(true)
		}
	}
	return n, err
}

// uiStreamHeader marks the UI message stream (AI SDK 5 and later), in canonical form.
const uiStreamHeader = "X-Vercel-Ai-Ui-Message-Stream"

// isUIMessageStream: the response is the UI message stream when it says so in its header or
// is server-sent events; anything else is read as the v4 data stream. The response decides,
// not the route, so a route serves whichever protocol its upstream speaks.
func isUIMessageStream(h http.Header) bool {
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

// startTap puts the tap the response's protocol calls for on body (the scope holds both
// taps, so a stream allocates none).
func (s *scope) startTap(h http.Header, body io.ReadCloser) io.ReadCloser {
	if isUIMessageStream(h) {
		s.uiTap.reset()
		s.tap = &s.uiTap
	} else {
		s.dataTap.reset()
		s.tap = &s.dataTap
	}
	s.tapBody = tappedBody{ReadCloser: body, tap: s.tap, rw: &s.rw}
	return &s.tapBody
}
