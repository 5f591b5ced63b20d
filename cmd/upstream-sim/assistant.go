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

// assistantService streams answers in the AI SDK v4 data stream format:
//
//	f:{"messageId":"msg-..."}
//	0:"text"            (AnswerParts times, paced by PartDelay)
//	e:{"finishReason":"stop","usage":{...},"isContinued":false}
//	d:{"finishReason":"stop","usage":{...},"threadId":"..."}
//
// The same format is served on /discovery/v1 and /discovery/v2.
type assistantService struct {
	cfg simConfig
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

// message handles POST /discovery/v{1,2}/assistant/{domain}/message.
func (s *assistantService) message(w http.ResponseWriter, r *http.Request) {
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
	h["Content-Type"] = textPlain
	h["X-Vercel-Ai-Data-Stream"] = []string{"v1"}
	h["Cache-Control"] = []string{"no-cache"}
	threadID := ""
	if body.ThreadID != nil && *body.ThreadID != "" {
		threadID = *body.ThreadID
	} else {
		threadID = "thread_" + randomHex(24)
		h["X-Thread-Id"] = []string{threadID}
		h["X-Thread-Key"] = []string{"tk_" + randomHex(32)}
	}
	w.WriteHeader(http.StatusOK)

	parts, err := s.stream(r.Context(), w, lastUserText(*body.Messages), threadID, promptBytes/4+1)
	if s.cfg.streamDone != nil {
		s.cfg.streamDone(parts, err)
	}
}

// stream writes the data stream parts, flushing after each one. It returns
// the number of text parts written and nil, or the reason it stopped early.
func (s *assistantService) stream(ctx context.Context, w http.ResponseWriter, echo, threadID string, promptTokens int) (int, error) {
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

	b = append(b, `f:{"messageId":"msg-`...)
	b = append(b, randomHex(24)...)
	b = append(b, "\"}\n"...)
	if err := send(); err != nil {
		return 0, err
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
		b = append(b, '0', ':')
		if s.cfg.Stamp {
			// text is a JSON string literal: splice "<nanos> " after its
			// opening quote.
			b = append(b, '"')
			b = strconv.AppendInt(b, time.Now().UnixNano(), 10)
			b = append(b, ' ')
			b = append(b, text[1:]...)
			words++
		} else {
			b = append(b, text...)
		}
		b = append(b, '\n')
		if err := send(); err != nil {
			return i, err
		}
	}

	usage := func(b []byte) []byte {
		b = append(b, `{"finishReason":"stop","usage":{"promptTokens":`...)
		b = strconv.AppendInt(b, int64(promptTokens), 10)
		b = append(b, `,"completionTokens":`...)
		b = strconv.AppendInt(b, int64(words), 10)
		return append(b, '}')
	}
	// e: and d: go out as separate chunks, like every other part.
	b = append(b, 'e', ':')
	b = usage(b)
	b = append(b, ",\"isContinued\":false}\n"...)
	if err := send(); err != nil {
		return s.cfg.AnswerParts, err
	}
	b = append(b, 'd', ':')
	b = usage(b)
	b = append(b, `,"threadId":`...)
	b = appendJSONString(b, threadID)
	b = append(b, "}\n"...)
	if err := send(); err != nil {
		return s.cfg.AnswerParts, err
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
