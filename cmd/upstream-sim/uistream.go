package main

import (
	"net/http"
	"strconv"
)

// uiStream is the UI message stream of AI SDK 5 and later (v2): server-sent events, each
// "data: <JSON chunk>" and a blank line, ending with "data: [DONE]":
//
//	{"type":"start","messageId":"msg-..."}
//	{"type":"start-step"}
//	{"type":"text-start","id":"text-1"}
//	{"type":"text-delta","id":"text-1","delta":"text"}   (AnswerParts times, paced by PartDelay)
//	{"type":"text-end","id":"text-1"}
//	{"type":"finish-step"}
//	{"type":"finish","finishReason":"stop","messageMetadata":{"threadId":"...",
//	  "usage":{"inputTokens":N,"outputTokens":M,"totalTokens":N+M}}}
//	[DONE]
//
// Usage is no field of the protocol: the platform sends it, and the thread to continue, in
// the finish chunk's messageMetadata, where readUIMessageStream puts it on the message's
// metadata.
type uiStream struct{}

func (uiStream) headers(h http.Header) {
	h["Content-Type"] = textEventStream
	h["X-Vercel-Ai-Ui-Message-Stream"] = []string{"v1"}
	h["Cache-Control"] = []string{"no-cache"}
	h["X-Accel-Buffering"] = []string{"no"}
}

// The chunks without variable parts, as events.
const (
	evStartStep  = "data: {\"type\":\"start-step\"}\n\n"
	evTextStart  = "data: {\"type\":\"text-start\",\"id\":\"text-1\"}\n\n"
	evTextEnd    = "data: {\"type\":\"text-end\",\"id\":\"text-1\"}\n\n"
	evFinishStep = "data: {\"type\":\"finish-step\"}\n\n"
	evDone       = "data: [DONE]\n\n"
)

func (uiStream) head(b []byte, i int, messageID string) ([]byte, bool) {
	switch i {
	case 0:
		b = append(b, `data: {"type":"start","messageId":"`...)
		b = append(b, messageID...)
		return append(b, "\"}\n\n"...), true
	case 1:
		return append(b, evStartStep...), true
	case 2:
		return append(b, evTextStart...), true
	}
	return b, false
}

func (uiStream) text(b, text []byte) []byte {
	b = append(b, `data: {"type":"text-delta","id":"text-1","delta":`...)
	b = append(b, text...)
	return append(b, "}\n\n"...)
}

func (uiStream) tail(b []byte, i int, a answerEnd) ([]byte, bool) {
	switch i {
	case 0:
		return append(b, evTextEnd...), true
	case 1:
		return append(b, evFinishStep...), true
	case 2:
		b = append(b, `data: {"type":"finish","finishReason":"stop","messageMetadata":{"threadId":`...)
		b = appendJSONString(b, a.threadID)
		b = append(b, `,"usage":{"inputTokens":`...)
		b = strconv.AppendInt(b, int64(a.promptTokens), 10)
		b = append(b, `,"outputTokens":`...)
		b = strconv.AppendInt(b, int64(a.completionTokens), 10)
		b = append(b, `,"totalTokens":`...)
		b = strconv.AppendInt(b, int64(a.promptTokens+a.completionTokens), 10)
		return append(b, "}}}\n\n"...), true
	case 3:
		return append(b, evDone...), true
	}
	return b, false
}
