package main

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// assistantService streams answers: on /discovery/v1 in the data stream protocol of AI SDK 4
// (dataStream), on /discovery/v2 in the UI message stream of AI SDK 5 and later (uiStream,
// uistream.go). Both carry the same text, paced the same way: the parts before the text at
// once, each text part after PartDelay, the finish at once after the last one.
type assistantService struct {
	cfg simConfig
}

// wireFormat is one stream protocol: what goes before the text, around each text part and
// after it. Each part is sent (written and flushed) on its own.
type wireFormat interface {
	// head appends the i-th part before the text; false when there is none.
	head(b []byte, i int, messageID string) ([]byte, bool)
	// text appends a text part holding text, a JSON string literal.
	text(b []byte, text []byte) []byte
	// tail appends the i-th part after the text; false when there is none.
	tail(b []byte, i int, a answerEnd) ([]byte, bool)
	// headers sets the answer's headers.
	headers(h http.Header)
}

// answerEnd is what the finish parts report.
type answerEnd struct {
	promptTokens, completionTokens int
	threadID                       string
}

// dataStream is the data stream protocol of AI SDK 4 (v1):
//
//	f:{"messageId":"msg-..."}
//	0:"text"            (AnswerParts times, paced by PartDelay)
//	e:{"finishReason":"stop","usage":{...},"isContinued":false}
//	d:{"finishReason":"stop","usage":{...},"threadId":"..."}
type dataStream struct{}

func (dataStream) headers(h http.Header) {
	h["Content-Type"] = textPlain
	h["X-Vercel-Ai-Data-Stream"] = []string{"v1"}
	h["Cache-Control"] = []string{"no-cache"}
}

func (dataStream) head(b []byte, i int, messageID string) ([]byte, bool) {
	if i > 0 {
		return b, false
	}
	b = append(b, `f:{"messageId":"`...)
	b = append(b, messageID...)
	return append(b, "\"}\n"...), true
}

func (dataStream) text(b, text []byte) []byte {
	b = append(b, '0', ':')
	b = append(b, text...)
	return append(b, '\n')
}

func (dataStream) tail(b []byte, i int, a answerEnd) ([]byte, bool) {
	usage := func(b []byte) []byte {
		b = append(b, `{"finishReason":"stop","usage":{"promptTokens":`...)
		b = strconv.AppendInt(b, int64(a.promptTokens), 10)
		b = append(b, `,"completionTokens":`...)
		b = strconv.AppendInt(b, int64(a.completionTokens), 10)
		return append(b, '}')
	}
	switch i {
	case 0: // e: and d: go out as separate chunks, like every other part.
		b = append(b, 'e', ':')
		b = usage(b)
		return append(b, ",\"isContinued\":false}\n"...), true
	case 1:
		b = append(b, 'd', ':')
		b = usage(b)
		b = append(b, `,"threadId":`...)
		b = appendJSONString(b, a.threadID)
		return append(b, "}\n"...), true
	}
	return b, false
}

// assistantBody is the part of the request body (spec 2.3) the simulator
// looks at. Messages stay raw: only the last user message is decoded.
type assistantBody struct {
	Fp                *string            `json:"fp"`
	Messages          *[]json.RawMessage `json:"messages"`
	ThreadID          *string            `json:"threadId"`
	RetrievalPageSize *float64           `json:"retrievalPageSize"`
	CurrentPath       *string            `json:"currentPath"`
}

type assistantMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	Parts   []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	} `json:"parts"`
}

// answerPhrases are the filler sentences of an answer, JSON-encoded once.
var answerPhrases = func() [][]byte {
	texts := []string{
		"Here is what the documentation says. ",
		"Start by creating an API key on the dashboard's API keys page. ",
		"Send it as a Bearer token in the Authorization header. ",
		"Requests and responses use JSON bodies. ",
		"Background agent jobs run asynchronously; poll the job until it completes. ",
		"A pull request link appears once the agent has changed files. ",
		"Keep the threadId from the finish event to continue the conversation. ",
		"See the API reference for limits and error handling. ",
	}
	out := make([][]byte, len(texts))
	for i, t := range texts {
		out[i] = appendJSONString(nil, t)
	}
	return out
}()

const echoMaxRunes = 60

// errClientGone reports a stream stopped because the client went away.
var errClientGone = errors.New("client went away")

// messageV1 handles POST /discovery/v1/assistant/{domain}/message.
func (s *assistantService) messageV1(w http.ResponseWriter, r *http.Request) {
	s.message(w, r, dataStream{})
}

// messageV2 handles POST /discovery/v2/assistant/{domain}/message.
func (s *assistantService) messageV2(w http.ResponseWriter, r *http.Request) {
	s.message(w, r, uiStream{})
}

// message answers an assistant request in format f.
func (s *assistantService) message(w http.ResponseWriter, r *http.Request, f wireFormat) {
	if !strings.HasPrefix(bearerToken(r), "svc_dsc_") {
		writeRaw(w, http.StatusUnauthorized, errAssistAuthBody)
		return
	}
	buf := readBody(w, r)
	if buf == nil {
		return
	}
	var body assistantBody
	err := json.Unmarshal(buf.Bytes(), &body)
	promptBytes := buf.Len()
	putBuf(buf)
	if err != nil {
		writeError(w, http.StatusBadRequest, "request body must be a JSON object with fp (string) and messages (array)")
		return
	}
	switch {
	case body.Fp == nil:
		writeError(w, http.StatusBadRequest, "fp is required (a string; use \"anonymous\" for anonymous users)")
		return
	case body.Messages == nil:
		writeError(w, http.StatusBadRequest, "messages is required (an array of message objects)")
		return
	case body.CurrentPath != nil && utf8.RuneCountInString(*body.CurrentPath) > 200:
		writeError(w, http.StatusBadRequest, "currentPath must be at most 200 characters")
		return
	}
	for _, m := range *body.Messages {
		if len(m) == 0 || m[0] != '{' {
			writeError(w, http.StatusBadRequest, "every element of messages must be an object")
			return
		}
	}

	h := w.Header()
	f.headers(h)
	threadID := ""
	if body.ThreadID != nil && *body.ThreadID != "" {
		threadID = *body.ThreadID
	} else {
		threadID = "thread_" + randomHex(24)
		h["X-Thread-Id"] = []string{threadID}
		h["X-Thread-Key"] = []string{"tk_" + randomHex(32)}
	}
	w.WriteHeader(http.StatusOK)

	parts, err := s.stream(r.Context(), w, f, lastUserText(*body.Messages), threadID, promptBytes/4+1)
	if s.cfg.streamDone != nil {
		s.cfg.streamDone(parts, err)
	}
}

// stream writes the answer's parts in format f, flushing after each one. It returns the
// number of text parts written and nil, or the reason it stopped early.
func (s *assistantService) stream(ctx context.Context, w http.ResponseWriter, f wireFormat, echo, threadID string, promptTokens int) (int, error) {
	rc := http.NewResponseController(w)
	bp := outPool.Get().(*[]byte)
	defer outPool.Put(bp)
	b := (*bp)[:0]
	send := func() error {
		_, err := w.Write(b)
		if err == nil {
			err = rc.Flush()
		}
		*bp = b
		b = b[:0]
		if err != nil {
			return errClientGone
		}
		return nil
	}

	messageID := "msg-" + randomHex(24)
	for i := 0; ; i++ {
		var more bool
		if b, more = f.head(b, i, messageID); !more {
			break
		}
		if err := send(); err != nil {
			return 0, err
		}
	}

	var echoJSON []byte
	if echo != "" {
		echoJSON = appendJSONString(nil, "You asked about \""+echo+"\". ")
	}
	var timer *time.Timer
	if s.cfg.PartDelay > 0 {
		timer = time.NewTimer(s.cfg.PartDelay)
		defer timer.Stop()
	}
	var stamped []byte
	words := 0
	for i := 0; i < s.cfg.AnswerParts; i++ {
		if timer != nil {
			if i > 0 {
				timer.Reset(s.cfg.PartDelay)
			}
			select {
			case <-ctx.Done():
				return i, context.Cause(ctx)
			case <-timer.C:
			}
		} else if err := ctx.Err(); err != nil {
			return i, err
		}
		text := answerPhrases[i%len(answerPhrases)]
		if i == 0 && echoJSON != nil {
			text = echoJSON
		}
		words += countWords(text)
		if s.cfg.Stamp {
			// text is a JSON string literal: splice "<nanos> " after its opening quote.
			stamped = append(stamped[:0], '"')
			stamped = strconv.AppendInt(stamped, time.Now().UnixNano(), 10)
			stamped = append(stamped, ' ')
			stamped = append(stamped, text[1:]...)
			text = stamped
			words++
		}
		b = f.text(b, text)
		if err := send(); err != nil {
			return i, err
		}
	}

	end := answerEnd{promptTokens: promptTokens, completionTokens: words, threadID: threadID}
	for i := 0; ; i++ {
		var more bool
		if b, more = f.tail(b, i, end); !more {
			break
		}
		if err := send(); err != nil {
			return s.cfg.AnswerParts, err
		}
	}
	return s.cfg.AnswerParts, nil
}

// countWords counts space-separated words of a JSON-encoded phrase.
func countWords(b []byte) int {
	n, in := 0, false
	for _, c := range b {
		if c == ' ' || c == '"' {
			in = false
			continue
		}
		if !in {
			n++
			in = true
		}
	}
	return n
}

// lastUserText returns a short, single-line excerpt of the last user
// message (its content, else its text parts), or "" if there is none.
func lastUserText(msgs []json.RawMessage) string {
	for i := len(msgs) - 1; i >= 0; i-- {
		var m assistantMessage
		if json.Unmarshal(msgs[i], &m) != nil || m.Role != "user" {
			continue
		}
		var text string
		if len(m.Content) > 0 && m.Content[0] == '"' {
			_ = json.Unmarshal(m.Content, &text)
		}
		if strings.TrimSpace(text) == "" {
			var sb strings.Builder
			for _, p := range m.Parts {
				if p.Type == "text" {
					sb.WriteString(p.Text)
					sb.WriteByte(' ')
				}
			}
			text = sb.String()
		}
		return excerpt(text, echoMaxRunes)
	}
	return ""
}

// excerpt collapses whitespace and cuts s to at most max runes (adding "...").
func excerpt(s string, max int) string {
	s = strings.Join(strings.FieldsFunc(s, unicode.IsSpace), " ")
	if utf8.RuneCountInString(s) <= max {
		return s
	}
	n := 0
	for i := range s {
		if n == max {
			return strings.TrimSpace(s[:i]) + "..."
		}
		n++
	}
	return s
}
