package proxy

import (
	"io"
	"net/http"
	"strings"
	"time"
)

// streamTap watches a streamed answer's bytes on their way to the client, for the finish
// reason and the token usage the upstream reports in it. There is one per protocol: the data
// stream protocol of AI SDK 4 (dataStreamTap, tap.go) and the UI message stream of AI SDK 5
// and later (uiStreamTap, uistream.go); the response's headers choose (newTap). A tap never holds a
// byte back: it sees each read after the upstream's body returned it and before the reverse
// proxy writes it, and keeps no more than the part or event it is in.
type streamTap interface {
	// feed looks at the next bytes of the answer, exactly as the upstream sent them, in
	// reads of any size: any split of the same bytes gives the same outcome. It returns how
	// many bytes it took: all of p, unless the tap's check stopped it at a part (partCheck).
	feed(p []byte) int
	// outcome is what the stream reported up to now.
	outcome() *streamOutcome
}

// streamOutcome is what a tap learned of a stream.
type streamOutcome struct {
	// reason is the finish part's finish reason, bounded by reasonLabel ("other" for
	// another, "unknown" when it had none or could not be read); "" until one passed.
	reason   string
	finishAt time.Time // when the finish part passed (the span's finish event)
	errored  bool      // an error part passed (data stream 3:, UI message stream error)
	// usage: the stream reported token usage, prompt and completion.
	usage              bool
	prompt, completion int64
	// textBytes is the UTF-8 length of the answer text that passed (data stream 0: parts,
	// UI message stream text-delta chunks), for the estimate of a stream that reports no usage.
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

// tokenCharge is what an answer costs, before each tokens limit's own caps (see of). A stream
// whose finish passed with a usage report costs that usage. Any other answer (cut, closed by
// its client, or never begun) costs an estimate, because the usage comes last and a client
// that closes early must not be charged 0; and never less than what the stream reported
// before it ended, so an early report cannot lower the charge. The estimate's prompt is a
// token per 4 bytes of the request's conversation text (not of its body: a filter or any other
// field a client fills at will is no prompt), its completion a token per 4 bytes of the answer
// text that passed, both rounded up.
type tokenCharge struct {
	final bool // the finish passed with a usage report: reported is the charge
	// reported is the usage reported so far, prompt and completion.
	reportedPrompt, reportedCompletion int64
	prompt, completion                 int64 // the estimate; prompt not yet capped
	text                               bool  // answer text passed
}

// chargeOf reads what an answer costs: out is nil when no stream began (the client went
// away before the upstream's headers, or the answer is no stream).
func chargeOf(out *streamOutcome, promptBytes int) tokenCharge {
	c := tokenCharge{prompt: ceilQuarter(int64(promptBytes))}
	if out == nil {
		return c
	}
	c.completion, c.text = ceilQuarter(out.textBytes), out.textBytes > 0
	if out.usage {
		c.reportedPrompt, c.reportedCompletion = out.prompt, out.completion
		c.final = out.reason != ""
	}
	return c
}

// of is what one tokens limit is charged: estimateMax caps the estimated prompt, and an
// answer none of whose text passed costs at most that prompt, at most reserve when the limit
// held one (0: it held none).
func (c tokenCharge) of(estimateMax, reserve int64) int64 {
	p, q, _ := c.split(estimateMax, reserve)
	return p + q
}

// split is of as prompt and completion tokens, for the metrics, and whether they are the
// estimate rather than what the stream reported.
func (c tokenCharge) split(estimateMax, reserve int64) (prompt, completion int64, estimated bool) {
	if c.final {
		return c.reportedPrompt, c.reportedCompletion, false
	}
	p, q := min(c.prompt, max(estimateMax, 0)), c.completion
	if !c.text {
		if reserve > 0 {
			p = min(p, reserve)
		}
		q = 0
	}
	if c.reportedPrompt+c.reportedCompletion >= p+q && (c.reportedPrompt > 0 || c.reportedCompletion > 0) {
		return c.reportedPrompt, c.reportedCompletion, false
	}
	return p, q, true
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
	cut bool // the answer has limits with cutoff (see readCut)
}

func (b *tappedBody) Read(p []byte) (int, error) {
	if b.cut {
		return b.readCut(p)
	}
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
// is server-sent events; anything else is read as the data stream. The response decides,
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
// taps, so a stream allocates none; one with cutoff limits allocates its check). An answer
// the gateway cannot read (readable false: a content coding it cannot decode) gets an
// opaqueTap.
func (g *Gateway) startTap(s *scope, h http.Header, body io.ReadCloser, readable bool) io.ReadCloser {
	cut := len(s.cut.limits) > 0
	var check partCheck
	if cut {
		check = func(whole bool) cutAction { return g.cutCheck(s, whole) }
	}
	switch {
	case !readable:
		s.tap = &opaqueTap{check: check}
	case isUIMessageStream(h):
		s.uiTap.reset()
		s.uiTap.check = check
		s.tap = &s.uiTap
	default:
		s.dataTap.reset()
		s.dataTap.check = check
		s.tap = &s.dataTap
	}
	s.tapBody = tappedBody{ReadCloser: body, tap: s.tap, rw: &s.rw, cut: cut}
	return &s.tapBody
}
