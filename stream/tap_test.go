package stream

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
)

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

// tapEvery feeds body to a fresh tap in reads of every size from 1 to len(body), checks the
// bytes pass unchanged and that every split gives the same outcome, and returns it.
func tapEvery(t *testing.T, name string, newTap func() Tap, body string) Outcome {
	t.Helper()
	var first Outcome
	for size := 1; size <= max(len(body), 1); size++ {
		tap := newTap()
		var tb Body
		tb.Reset(io.NopCloser(&chunked{s: body, size: size}), tap, nil, 0, nil)
		got, err := io.ReadAll(&tb)
		if err != nil || string(got) != body {
			t.Fatalf("%s: bytes changed: %q %v", name, got, err)
		}
		o := *tap.Outcome()
		o.FinishAt = first.FinishAt // a time, not a count
		if size == 1 {
			first = o
			continue
		}
		if o != first {
			t.Fatalf("%s: reads of %d bytes give %+v, reads of 1 byte %+v", name, size, o, first)
		}
	}
	return first
}

func newDataTap() Tap { t := new(DataStream); t.Reset(nil); return t }
func newUITap() Tap   { t := new(UIMessageStream); t.Reset(nil); return t }

func TestDataStreamTapFinish(t *testing.T) {
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
		{"error part, then a finish", "0:\"a\"\n3:\"The model is overloaded.\"\nd:{\"finishReason\":\"stop\"}\n", "error"},
		{"error part, no finish", "0:\"a\"\n3:\"boom\"\n", "error"},
		{"error part cut before its end", "0:\"a\"\n3:\"bo", "incomplete"},
	}
	for _, c := range cases {
		o := tapEvery(t, c.name, newDataTap, c.body)
		if r := o.Result(); r != c.want {
			t.Fatalf("%s: reason %q, want %q", c.name, r, c.want)
		}
	}
}

func TestDataStreamTapTokens(t *testing.T) {
	e := func(p, c string) string {
		return "e:{\"finishReason\":\"stop\",\"usage\":{\"promptTokens\":" + p + ",\"completionTokens\":" + c + "},\"isContinued\":false}\n"
	}
	cases := []struct {
		name, body   string
		prompt, comp int64
		ok           bool
		text         int64
	}{
		{"d total wins", "0:\"a\"\n" + e("3", "4") + e("5", "6") + "d:{\"finishReason\":\"stop\",\"usage\":{\"promptTokens\":8,\"completionTokens\":10}}\n", 8, 10, true, 1},
		{"d total differs from steps", e("1", "1") + "d:{\"finishReason\":\"stop\",\"usage\":{\"promptTokens\":100,\"completionTokens\":200}}\n", 100, 200, true, 0},
		{"cut after e parts", "0:\"a\"\n" + e("3", "4") + e("5", "6") + "0:\"more", 8, 10, true, 1},
		{"cut inside an e part", e("3", "4") + "e:{\"finishReason\":\"stop\",\"usage\":{\"promptT", 3, 4, true, 0},
		{"d without usage uses steps", e("2", "9") + "d:{\"finishReason\":\"stop\"}\n", 2, 9, true, 0},
		{"no usage at all", "0:\"a\"\ne:{\"finishReason\":\"stop\"}\nd:{\"finishReason\":\"stop\"}\n", 0, 0, false, 1},
		{"negative is ignored", e("-3", "4"), 0, 0, false, 0},
		{"fraction is ignored", e("1.5", "4"), 0, 0, false, 0},
		{"huge is ignored", e("1e300", "4"), 0, 0, false, 0},
		{"text that looks like a part", "0:\"e:{\\\"usage\\\":{\\\"promptTokens\\\":9}}\"\n", 0, 0, false, 30},
		{"e at start, no newline at end", e("7", "0")[:len(e("7", "0"))-1], 0, 0, false, 0},
		// The text's UTF-8 length: escapes as what they stand for, a surrogate pair 4 bytes,
		// a lone surrogate 3 (U+FFFD), raw UTF-8 as it is; a line cut short counts nothing.
		{"text lengths", "0:\"héllo\"\n0:\"a\\nb\\\"c\\u00e9\\ud83d\\ude00\\ud800x\"\n0:\"🚀 日本\"\n0:\"never ends", 0, 0, false, 6 + 15 + 11},
	}
	for _, c := range cases {
		o := tapEvery(t, c.name, newDataTap, c.body)
		if o.Usage != c.ok || o.Prompt != c.prompt || o.Completion != c.comp || o.TextBytes != c.text {
			t.Fatalf("%s: usage %v %d/%d text %d, want %v %d/%d text %d", c.name, o.Usage, o.Prompt, o.Completion, o.TextBytes, c.ok, c.prompt, c.comp, c.text)
		}
	}
}

// sse renders chunks as UI message stream events.
func sse(chunks ...string) string {
	var b strings.Builder
	for _, c := range chunks {
		b.WriteString("data: " + c + "\n\n")
	}
	return b.String()
}

func TestUIStreamTap(t *testing.T) {
	usage := func(in, out string) string {
		return `{"usage":{"inputTokens":` + in + `,"outputTokens":` + out + `,"totalTokens":1}}`
	}
	whole := sse(`{"type":"start","messageId":"msg-1"}`, `{"type":"start-step"}`, `{"type":"text-start","id":"t"}`,
		`{"type":"text-delta","id":"t","delta":"Hello, "}`, `{"type":"text-delta","id":"t","delta":"wörld"}`,
		`{"type":"text-end","id":"t"}`, `{"type":"finish-step"}`,
		`{"type":"finish","finishReason":"stop","messageMetadata":{"threadId":"th","usage":{"inputTokens":52,"outputTokens":61,"totalTokens":113}}}`, `[DONE]`)
	cases := []struct {
		name, body   string
		reason       string
		usage        bool
		prompt, comp int64
		text         int64
	}{
		{"whole", whole, "stop", true, 52, 61, 13},
		{"CRLF", strings.ReplaceAll(whole, "\n", "\r\n"), "stop", true, 52, 61, 13},
		{"CR", strings.ReplaceAll(whole, "\n", "\r"), "stop", true, 52, 61, 13},
		{"no space after data:", strings.ReplaceAll(whole, "data: ", "data:"), "stop", true, 52, 61, 13},
		{"byte-order mark", "\xef\xbb\xbf" + whole, "stop", true, 52, 61, 13},
		{"comments, ids and events between", ": keep-alive\nid: 1\nevent: message\n" + strings.ReplaceAll(whole, "\n\n", "\nretry: 10\n\n:x\n"), "stop", true, 52, 61, 13},
		{"data over two lines", "data: {\"type\":\ndata: \"text-delta\",\"delta\":\"ab\"}\n\n", "", false, 0, 0, 2},
		{"SDK 5 finish: no finishReason", sse(`{"type":"text-delta","delta":"x"}`, `{"type":"finish","messageMetadata":`+usage("1", "2")+`}`), "unknown", true, 1, 2, 1},
		{"finish without metadata", sse(`{"type":"finish","finishReason":"length"}`), "length", false, 0, 0, 0},
		{"unknown reason", sse(`{"type":"finish","finishReason":"banana"}`), "other", false, 0, 0, 0},
		{"usage in start only", sse(`{"type":"start","messageMetadata":`+usage("7", "0")+`}`, `{"type":"text-delta","delta":"x"}`), "incomplete", true, 7, 0, 1},
		{"cut after message-metadata", sse(`{"type":"text-delta","delta":"abc"}`, `{"type":"message-metadata","messageMetadata":`+usage("10", "20")+`}`, `{"type":"text-delta","delta":"more"}`) + "data: {\"type\":\"finish\",\"messageMetadata\":" + usage("99", "99"), "incomplete", true, 10, 20, 7},
		{"the last usage wins", sse(`{"type":"start","messageMetadata":`+usage("1", "1")+`}`, `{"type":"message-metadata","messageMetadata":`+usage("5", "6")+`}`, `{"type":"finish","messageMetadata":{"threadId":"t"}}`), "unknown", true, 5, 6, 0},
		{"usage only in start, message-metadata, finish", sse(`{"type":"data-x","messageMetadata":`+usage("1", "1")+`}`, `{"type":"finish-step","messageMetadata":`+usage("2", "2")+`}`), "incomplete", false, 0, 0, 0},
		{"event without its blank line", "data: {\"type\":\"finish\",\"finishReason\":\"stop\",\"messageMetadata\":" + usage("3", "4") + "}\n", "incomplete", false, 0, 0, 0},
		{"error chunk", sse(`{"type":"text-delta","delta":"ab"}`, `{"type":"error","errorText":"overloaded"}`, `{"type":"finish","finishReason":"stop"}`), "error", false, 0, 0, 2},
		{"untrusted usage is skipped", sse(`{"type":"start","messageMetadata":`+usage("4", "5")+`}`, `{"type":"message-metadata","messageMetadata":`+usage("-1", "2")+`}`,
			`{"type":"message-metadata","messageMetadata":`+usage("1.5", "2")+`}`, `{"type":"message-metadata","messageMetadata":`+usage(`"3"`, "2")+`}`,
			`{"type":"message-metadata","messageMetadata":{"usage":{}}}`, `{"type":"message-metadata","messageMetadata":{"usage":null}}`), "incomplete", true, 4, 5, 0},
		{"one side of usage", sse(`{"type":"finish","messageMetadata":{"usage":{"outputTokens":9,"inputTokens":null}}}`), "unknown", true, 0, 9, 0},
		{"escaped names and duplicate keys", sse(`{"typ\u0065":"text-delta","delta":"zz","delta":"\u00e9\ud83d\ude00"}`, `{"type":"finish","type":"start","messageMetadata":`+usage("2", "3")+`}`), "", true, 2, 3, 6},
		{"keys in other cases are not the fields", sse(`{"Type":"finish","finishReason":"stop"}`, `{"type":"text-delta","Delta":"abc"}`), "", false, 0, 0, 0},
		{"text that looks like events", sse(`{"type":"text-delta","delta":"\n\ndata: {\"type\":\"error\"}\n\n"}`), "", false, 0, 0, 26},
		{"not JSON", sse(`{"type":"finish"`, `nonsense`, `{"type":"error"`), "", false, 0, 0, 0},
		{"[DONE] only", sse(`[DONE]`), "", false, 0, 0, 0},
		{"a data field without a colon joins an empty line", "data\ndata: {\"type\":\"text-delta\",\"delta\":\"q\"}\n\n", "", false, 0, 0, 1},
	}
	for _, c := range cases {
		o := tapEvery(t, c.name, newUITap, c.body)
		want := c.reason
		if want == "" {
			want = "incomplete"
		}
		if o.Result() != want || o.Usage != c.usage || o.Prompt != c.prompt || o.Completion != c.comp || o.TextBytes != c.text {
			t.Fatalf("%s: %s usage %v %d/%d text %d, want %s %v %d/%d text %d", c.name, o.Result(), o.Usage, o.Prompt, o.Completion, o.TextBytes,
				want, c.usage, c.prompt, c.comp, c.text)
		}
	}
}

// An event longer than maxEventData is read as far as it was kept: its type still counts, a
// text-delta cut there counts its whole length, and the buffer is let go after it.
func TestUIStreamTapLongEvent(t *testing.T) {
	long := strings.Repeat("a", maxEventData)
	body := sse(`{"type":"text-delta","id":"t","delta":"`+long+`"}`, `{"type":"data-x","data":"`+long+`"}`,
		`{"type":"error","errorText":"`+long+`"}`, `{"type":"text-delta","delta":"ok"}`)
	tap := new(UIMessageStream)
	tap.Reset(nil)
	tap.Feed([]byte(body))
	o := tap.Outcome()
	wantText := int64(len(`{"type":"text-delta","id":"t","delta":"`+long+`"}`)) + 2
	if !o.Errored || o.TextBytes != wantText {
		t.Fatalf("errored %v text %d, want true %d", o.Errored, o.TextBytes, wantText)
	}
	if cap(tap.data) > len(tap.buf) {
		t.Fatalf("the long event's buffer (%d bytes) is still held", cap(tap.data))
	}
}

func TestStreamTokens(t *testing.T) {
	// A stream whose finish passed with its usage costs that usage, whatever passed.
	final := ChargeOf(&Outcome{Usage: true, Reason: "stop", Prompt: 3, Completion: 0, TextBytes: 400}, 1000)
	if p, c, est := final.Split(4096, 0); p != 3 || c != 0 || est {
		t.Fatalf("final usage: %d %d %v", p, c, est)
	}
	// None reported: ⌈text/4⌉ and ⌈answer/4⌉, the prompt capped by estimate_max.
	for _, c := range []struct {
		prompt     int
		text, p, q int64
		max        int64
	}{{1, 1, 1, 1, 4096}, {4, 1, 1, 1, 4096}, {5, 8, 2, 2, 4096}, {200_000, 9, 4096, 3, 4096}, {200_001, 13, 50_001, 4, 100_000}, {400, 4, 0, 1, 0}} {
		o := ChargeOf(&Outcome{TextBytes: c.text}, c.prompt)
		if p, q, est := o.Split(c.max, 0); p != c.p || q != c.q || !est {
			t.Fatalf("prompt %d text %d: %d %d %v, want %d %d", c.prompt, c.text, p, q, est, c.p, c.q)
		}
	}
	// An early report never lowers the charge; a larger one than the estimate stands.
	early := ChargeOf(&Outcome{Usage: true, Prompt: 1, TextBytes: 120_000}, 40)
	if n := early.Of(4096, 0); n != 10+30_000 {
		t.Fatalf("early report of 1: charged %d, want the estimate %d", n, 10+30_000)
	}
	big := ChargeOf(&Outcome{Usage: true, Prompt: 900, Completion: 100, TextBytes: 40}, 40)
	if p, q, est := big.Split(4096, 0); p != 900 || q != 100 || est {
		t.Fatalf("reported 1000 over an estimate of 20: %d %d %v", p, q, est)
	}
	// No answer text: the prompt alone, at most estimate_max, at most the reserve held.
	for _, c := range []struct {
		out          *Outcome
		max, reserve int64
		want         int64
	}{
		{nil, 4096, 0, 4096},                                 // gone before the headers
		{&Outcome{}, 4096, 0, 4096},                          // headers, no text
		{&Outcome{}, 4096, 100, 100},                         // the reserve bounds it
		{&Outcome{}, 50, 100, 50},                            // and estimate_max
		{&Outcome{Usage: true, Prompt: 7}, 4096, 100, 100},   // an early report below it
		{&Outcome{Usage: true, Prompt: 700}, 4096, 100, 700}, // the upstream's word above it
	} {
		if got := ChargeOf(c.out, 1_000_000).Of(c.max, c.reserve); got != c.want {
			t.Errorf("%+v max %d reserve %d: charged %d, want %d", c.out, c.max, c.reserve, got, c.want)
		}
	}
}

func TestTapChosenByResponse(t *testing.T) {
	for _, c := range []struct {
		h  http.Header
		ui bool
	}{
		{http.Header{"X-Vercel-Ai-Ui-Message-Stream": {"v1"}, "Content-Type": {"text/plain"}}, true},
		{http.Header{"Content-Type": {"text/event-stream"}}, true},
		{http.Header{"Content-Type": {"Text/Event-Stream; charset=utf-8"}}, true},
		{http.Header{"Content-Type": {"text/plain; charset=utf-8"}, "X-Vercel-Ai-Data-Stream": {"v1"}}, false},
		{http.Header{"Content-Type": {"text/event-streams"}}, false},
		{http.Header{}, false},
	} {
		if got := IsUIMessageStream(c.h); got != c.ui {
			t.Errorf("%v: UI stream %v, want %v", c.h, got, c.ui)
		}
	}
}

// The taps must allocate nothing for the parts that pass by the thousand.
func TestTapsAllocateNothingPerPart(t *testing.T) {
	ui := []byte(sse(`{"type":"text-delta","id":"t","delta":"Start by creating an API key \u00e9. "}`))
	data := []byte("0:\"Start by creating an API key \\u00e9. \"\n")
	var u UIMessageStream
	u.Reset(nil)
	var d DataStream
	d.Reset(nil)
	if a := testing.AllocsPerRun(100, func() { u.Feed(ui) }); a != 0 {
		t.Errorf("UI stream text-delta: %v allocations", a)
	}
	if a := testing.AllocsPerRun(100, func() { d.Feed(data) }); a != 0 {
		t.Errorf("data stream 0: part: %v allocations", a)
	}
	if !bytes.Contains(ui, []byte("delta")) || u.Outcome().TextBytes == 0 || d.Outcome().TextBytes == 0 {
		t.Fatal("nothing was counted")
	}
	// Whole streams, finish and usage included.
	uiAll := []byte(sse(`{"type":"start","messageId":"m"}`, `{"type":"text-delta","id":"t","delta":"a"}`,
		`{"type":"finish","finishReason":"stop","messageMetadata":{"threadId":"t","usage":{"inputTokens":10,"outputTokens":17,"totalTokens":27}}}`, `[DONE]`))
	dataAll := []byte("f:{\"messageId\":\"m\"}\n0:\"a\"\ne:{\"finishReason\":\"stop\",\"usage\":{\"promptTokens\":10,\"completionTokens\":17},\"isContinued\":false}\n" +
		"d:{\"finishReason\":\"stop\",\"usage\":{\"promptTokens\":10,\"completionTokens\":17}}\n")
	if a := testing.AllocsPerRun(100, func() { u.Reset(nil); u.Feed(uiAll) }); a != 0 {
		t.Errorf("a whole UI message stream: %v allocations", a)
	}
	if a := testing.AllocsPerRun(100, func() { d.Reset(nil); d.Feed(dataAll) }); a != 0 {
		t.Errorf("a whole data stream: %v allocations", a)
	}
	// A request's scope is new, and so is its tap: its d: and e: lines fit the tap's own buffer.
	if a := testing.AllocsPerRun(100, func() { d = DataStream{}; d.Reset(nil); d.Feed(dataAll) }); a != 0 {
		t.Errorf("a whole data stream on a new tap: %v allocations", a)
	}
	if o := u.Outcome(); !o.Usage || o.Prompt != 10 || o.Completion != 17 || o.Reason != "stop" {
		t.Fatalf("UI stream outcome %+v", *o)
	}
	if o := d.Outcome(); !o.Usage || o.Prompt != 10 || o.Completion != 17 || o.Reason != "stop" {
		t.Fatalf("data stream outcome %+v", *o)
	}
}
