package stream

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// feedCut feeds body to tap in pieces ending at the positions cuts chooses (each byte of
// cuts is a piece's length, 0 meaning an empty read), then the rest in one piece.
func feedCut(tap Tap, body, cuts []byte) {
	for _, c := range cuts {
		n := min(int(c), len(body))
		tap.Feed(body[:n])
		body = body[n:]
	}
	tap.Feed(body)
}

// sameOutcome: the counts agree (finishAt is a time, not a count).
func sameOutcome(a, b *Outcome) bool {
	x, y := *a, *b
	x.FinishAt = y.FinishAt
	return x == y
}

// FuzzUIStreamTap: any split of the same bytes into reads gives the same counts, and on
// streams whose events are all valid JSON the tap agrees with a plain reference reader
// (line splitting by the SSE rules, encoding/json for the chunks).
func FuzzUIStreamTap(f *testing.F) {
	u := `{"usage":{"inputTokens":12,"outputTokens":34}}`
	for _, s := range []string{
		sse(`{"type":"start","messageId":"m"}`, `{"type":"text-delta","id":"t","delta":"Hi \u00e9\ud83d\ude00"}`, `{"type":"finish","finishReason":"stop","messageMetadata":`+u+`}`, `[DONE]`),
		strings.ReplaceAll(sse(`{"type":"message-metadata","messageMetadata":`+u+`}`, `{"type":"error","errorText":"x"}`), "\n", "\r\n"),
		"\xef\xbb\xbfdata:{\"type\":\"text-delta\",\r\ndata: \"delta\":\"a\\nb\"}\r\r: c\n\n",
		sse(`{"typ\u0065":"finish","finishReason":"length","finishReason":"tool-calls","messageMetadata":{"usage":{"outputTokens":null,"inputTokens":3}}}`),
		sse(`{"type":"finish","messageMetadata":{"usage":{"inputTokens":1.5}}}`, `{"type":"text-delta","delta":5}`),
	} {
		f.Add([]byte(s), []byte{1, 7, 0, 3})
		f.Add([]byte(s), []byte{})
	}
	f.Fuzz(func(t *testing.T, body, cuts []byte) {
		whole := newUITap()
		whole.Feed(body)
		split := newUITap()
		feedCut(split, body, cuts)
		if !sameOutcome(whole.Outcome(), split.Outcome()) {
			t.Fatalf("%q in pieces %v: %+v, in one read %+v", body, cuts, *split.Outcome(), *whole.Outcome())
		}
		if ref, ok := refUIStream(body); ok && !sameOutcome(&ref, whole.Outcome()) {
			t.Fatalf("%q: tap %+v, reference %+v", body, *whole.Outcome(), ref)
		}
	})
}

// FuzzDataStreamTap: any split of the same bytes into reads gives the same counts.
func FuzzDataStreamTap(f *testing.F) {
	for _, s := range []string{
		"f:{\"messageId\":\"m\"}\n0:\"a\\u00e9\\ud83d\"\n3:\"x\"\ne:{\"finishReason\":\"stop\",\"usage\":{\"promptTokens\":2,\"completionTokens\":3}}\nd:{\"finishReason\":\"stop\",\"usage\":{\"promptTokens\":5,\"completionTokens\":6}}\n",
		"0:\"cut",
		"d:{\"finishReason\":\"banana\"}\n0:\"\\\"\"\n",
	} {
		f.Add([]byte(s), []byte{1, 2, 0, 5})
	}
	f.Fuzz(func(t *testing.T, body, cuts []byte) {
		whole := newDataTap()
		whole.Feed(body)
		split := newDataTap()
		feedCut(split, body, cuts)
		if !sameOutcome(whole.Outcome(), split.Outcome()) {
			t.Fatalf("%q in pieces %v: %+v, in one read %+v", body, cuts, *split.Outcome(), *whole.Outcome())
		}
	})
}

// refUIStream reads a UI message stream the plain way. ok is false when some event is not
// valid JSON (or not UTF-8, or past maxEventData), where the tap's lenient reader may
// differ and only the chunking property is checked.
func refUIStream(body []byte) (Outcome, bool) {
	var o Outcome
	s := strings.TrimPrefix(string(body), "\ufeff")
	var lines []string
	for {
		i := strings.IndexAny(s, "\r\n")
		if i < 0 {
			break // a line without its end is no line yet
		}
		lines = append(lines, s[:i])
		if s[i] == '\r' && i+1 < len(s) && s[i+1] == '\n' {
			i++
		}
		s = s[i+1:]
	}
	var data []string
	ok := true
	dispatch := func(d string) {
		if d == "[DONE]" || d == "" { // an empty event is no event
			return
		}
		if !json.Valid([]byte(d)) || !utf8.ValidString(d) || len(d) > maxEventData {
			ok = false
			return
		}
		var m map[string]json.RawMessage
		if json.Unmarshal([]byte(d), &m) != nil {
			return // valid JSON but no object: no chunk
		}
		var typ string
		_ = json.Unmarshal(m["type"], &typ)
		switch typ {
		case "text-delta":
			var delta string
			if raw, has := m["delta"]; has && raw[0] == '"' && json.Unmarshal(raw, &delta) == nil {
				o.TextBytes += int64(len(delta))
			}
		case "error":
			o.Errored = true
		case "finish":
			o.Reason = "unknown"
			var r string
			if raw, has := m["finishReason"]; has && raw[0] == '"' && json.Unmarshal(raw, &r) == nil {
				o.Reason = reasonLabel([]byte(r))
			}
			refUsage(&o, m["messageMetadata"])
		case "start", "message-metadata":
			refUsage(&o, m["messageMetadata"])
		}
	}
	has := false
	for _, l := range lines {
		if l == "" {
			if has {
				dispatch(strings.Join(data, "\n"))
			}
			data, has = nil, false
			continue
		}
		name, value, found := strings.Cut(l, ":")
		if found {
			value = strings.TrimPrefix(value, " ")
		}
		if name == "data" {
			data, has = append(data, value), true
		}
	}
	return o, ok
}

func refUsage(o *Outcome, meta json.RawMessage) {
	var m map[string]json.RawMessage
	if json.Unmarshal(meta, &m) != nil || m == nil {
		return
	}
	var u map[string]json.RawMessage
	if json.Unmarshal(m["usage"], &u) != nil || u == nil {
		return
	}
	count := func(raw json.RawMessage) (int64, bool, bool) {
		if raw == nil || string(raw) == "null" {
			return 0, true, false
		}
		var f float64
		if json.Unmarshal(raw, &f) != nil {
			return 0, false, true
		}
		n, ok := tokenCount(f)
		return n, ok, true
	}
	p, ok1, has1 := count(u["inputTokens"])
	c, ok2, has2 := count(u["outputTokens"])
	if ok1 && ok2 && (has1 || has2) {
		o.Usage, o.Prompt, o.Completion = true, p, c
	}
}

// TestUIStreamTapAgreesWithReference runs the fuzz seeds and the table streams through the
// reference comparison without the fuzzer.
func TestUIStreamTapAgreesWithReference(t *testing.T) {
	for _, body := range []string{
		sse(`{"type":"start","messageMetadata":{"usage":{"inputTokens":1,"outputTokens":2}}}`, `{"type":"text-delta","delta":"\ud800\u0041é"}`, `{"type":"finish","finishReason":null}`),
		"data: {\"type\":\"error\"}\r\n\r\ndata: {\"type\":\"finish\",\"finishReason\":\"content-filter\"}\r\rdata: [DONE]\n\n",
	} {
		ref, ok := refUIStream([]byte(body))
		tap := newUITap()
		tap.Feed([]byte(body))
		if !ok || !sameOutcome(&ref, tap.Outcome()) {
			t.Fatalf("%q: tap %+v, reference %+v (%v)", body, *tap.Outcome(), ref, ok)
		}
	}
}
