package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"strings"
	"testing"
	"time"
)

// assistantBodyV2 is what an AI SDK 5+ client (DefaultChatTransport with body {fp}) posts:
// the same conversation as assistantBodyJSON, as UI messages.
const assistantBodyV2 = `{"fp":"anonymous","retrievalPageSize":5,"id":"chat-1","trigger":"submit-message","messages":[` +
	`{"id":"m1","role":"user","parts":[{"type":"text","text":"What is an API key?"}]},` +
	`{"id":"m2","role":"assistant","parts":[{"type":"step-start"},{"type":"text","text":"An API key is...","state":"done"}]},` +
	`{"id":"m3","role":"user","parts":[{"type":"text","text":"How do I\ncreate an \"agent job\"?"}]}]}`

// readEvents reads server-sent events: each "data: ..." line and the blank line after it,
// stamped with its arrival.
func readEvents(t *testing.T, r io.Reader) []streamLine {
	t.Helper()
	br := bufio.NewReader(r)
	var out []streamLine
	for {
		s, err := br.ReadString('\n')
		if err == io.EOF {
			if s != "" {
				t.Fatalf("unterminated event %q", s)
			}
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		data, ok := strings.CutPrefix(s, "data: ")
		if !ok {
			t.Fatalf("line %q, want data: <chunk>", s)
		}
		if blank, err := br.ReadString('\n'); err != nil || blank != "\n" {
			t.Fatalf("event %q not followed by a blank line (%q, %v)", s, blank, err)
		}
		out = append(out, streamLine{time.Now(), strings.TrimSuffix(data, "\n")})
	}
}

type uiChunk struct {
	Type            string `json:"type"`
	ID              string `json:"id"`
	MessageID       string `json:"messageId"`
	Delta           string `json:"delta"`
	FinishReason    string `json:"finishReason"`
	MessageMetadata *struct {
		ThreadID string `json:"threadId"`
		Usage    struct {
			InputTokens  *int `json:"inputTokens"`
			OutputTokens *int `json:"outputTokens"`
			TotalTokens  *int `json:"totalTokens"`
		} `json:"usage"`
	} `json:"messageMetadata"`
}

// checkUIStream checks the UI message stream's layout and returns the text deltas and the
// finish chunk.
func checkUIStream(t *testing.T, events []streamLine, parts int) ([]string, uiChunk) {
	t.Helper()
	if len(events) != parts+7 {
		for _, e := range events {
			t.Log(e.text)
		}
		t.Fatalf("got %d events, want %d (start, start-step, text-start, %d×text-delta, text-end, finish-step, finish, [DONE])", len(events), parts+7, parts)
	}
	chunks := make([]uiChunk, len(events)-1)
	for i, e := range events[:len(events)-1] {
		if err := json.Unmarshal([]byte(e.text), &chunks[i]); err != nil {
			t.Fatalf("event %q: %v", e.text, err)
		}
	}
	if events[len(events)-1].text != "[DONE]" {
		t.Fatalf("last event %q, want [DONE]", events[len(events)-1].text)
	}
	want := []string{"start", "start-step", "text-start"}
	for range parts {
		want = append(want, "text-delta")
	}
	want = append(want, "text-end", "finish-step", "finish")
	var texts []string
	for i, c := range chunks {
		if c.Type != want[i] {
			t.Fatalf("chunk %d is %q, want %q", i, c.Type, want[i])
		}
		if c.Type == "text-delta" {
			if c.ID != "text-1" || c.Delta == "" {
				t.Fatalf("text-delta %q", events[i].text)
			}
			texts = append(texts, c.Delta)
		}
	}
	if !strings.HasPrefix(chunks[0].MessageID, "msg-") {
		t.Errorf("start %q has no messageId", events[0].text)
	}
	f := chunks[len(chunks)-1]
	m := f.MessageMetadata
	if f.FinishReason != "stop" || m == nil || m.ThreadID == "" || m.Usage.InputTokens == nil || m.Usage.OutputTokens == nil ||
		*m.Usage.OutputTokens <= 0 || *m.Usage.TotalTokens != *m.Usage.InputTokens+*m.Usage.OutputTokens {
		t.Errorf("finish %q incomplete", events[len(events)-2].text)
	}
	return texts, f
}

// v2 answers in the UI message stream with the headers of AI SDK 5+, the same text and the
// same usage as v1 for the same conversation, threadId and usage in the finish chunk.
func TestAssistantV2StreamFormat(t *testing.T) {
	srv := newTestServer(t, simConfig{AnswerParts: 5})
	resp := postStream(t, context.Background(), srv.URL+"/discovery/v2/assistant/acme-docs/message", assistantKey, assistantBodyV2)
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d body %s", resp.StatusCode, b)
	}
	for k, v := range map[string]string{
		"Content-Type": "text/event-stream", "X-Vercel-AI-UI-Message-Stream": "v1",
		"Cache-Control": "no-cache", "X-Accel-Buffering": "no", "X-Vercel-AI-Data-Stream": "",
	} {
		if got := resp.Header.Get(k); got != v {
			t.Errorf("%s = %q, want %q", k, got, v)
		}
	}
	if len(resp.TransferEncoding) == 0 || resp.TransferEncoding[0] != "chunked" {
		t.Errorf("Transfer-Encoding = %v, want chunked", resp.TransferEncoding)
	}
	tid := resp.Header.Get("X-Thread-Id")
	texts, f := checkUIStream(t, readEvents(t, resp.Body), 5)
	if tid == "" || f.MessageMetadata.ThreadID != tid {
		t.Errorf("finish threadId %q, X-Thread-Id %q", f.MessageMetadata.ThreadID, tid)
	}

	resp1 := postStream(t, context.Background(), srv.URL+"/discovery/v1/assistant/acme-docs/message", assistantKey, assistantBodyJSON)
	defer resp1.Body.Close()
	texts1, d := checkStream(t, readLines(t, resp1.Body), 5)
	if strings.Join(texts, "|") != strings.Join(texts1, "|") {
		t.Errorf("v2 text %q, v1 text %q", texts, texts1)
	}
	if *f.MessageMetadata.Usage.OutputTokens != *d.Usage.CompletionTokens || *f.MessageMetadata.Usage.InputTokens <= 0 {
		t.Errorf("v2 usage %+v, v1 %+v", f.MessageMetadata.Usage, *d.Usage)
	}

	// A thread sent back is kept, and gets no new thread headers.
	resp2 := postStream(t, context.Background(), srv.URL+"/discovery/v2/assistant/acme-docs/message", assistantKey,
		strings.Replace(assistantBodyV2, `"fp":"anonymous"`, `"fp":"anonymous","threadId":"`+tid+`"`, 1))
	defer resp2.Body.Close()
	if _, f2 := checkUIStream(t, readEvents(t, resp2.Body), 5); f2.MessageMetadata.ThreadID != tid || resp2.Header.Get("X-Thread-Id") != "" {
		t.Errorf("continued thread: %q, header %q", f2.MessageMetadata.ThreadID, resp2.Header.Get("X-Thread-Id"))
	}
}

// v2 is paced like v1: the chunks before the text at once, each text-delta after the part
// delay, the finish right after the last one.
func TestAssistantV2Pacing(t *testing.T) {
	const delay, parts = 30 * time.Millisecond, 6
	srv := newTestServer(t, simConfig{PartDelay: delay, AnswerParts: parts})
	start := time.Now()
	resp := postStream(t, context.Background(), srv.URL+"/discovery/v2/assistant/d/message", assistantKey, assistantBodyV2)
	defer resp.Body.Close()
	events := readEvents(t, resp.Body)
	checkUIStream(t, events, parts)
	if events[2].at.Sub(start) > (parts/2)*delay {
		t.Errorf("text-start arrived after %v, want it at once", events[2].at.Sub(start))
	}
	if total := events[len(events)-1].at.Sub(start); total < parts*delay {
		t.Errorf("stream took %v, want >= %v with pacing", total, parts*delay)
	}
	paced := 0
	for i := 4; i < 3+parts; i++ {
		if events[i].at.Sub(events[i-1].at) >= delay/2 {
			paced++
		}
	}
	if paced < (parts-1)/2 {
		t.Errorf("only %d of %d gaps between text-deltas are >= %v", paced, parts-1, delay/2)
	}
}
