package validate

import (
	"math"
	"strconv"
)

// maxCurrentPath is the longest currentPath accepted, in code points after
// unescaping.
const maxCurrentPath = 200

// AssistantMessage validates the body of
// POST /discovery/v1/assistant/{domain}/message:
//
//	fp                 required, non-empty string
//	messages           required, array of objects {id, role, content: string;
//	                   parts?: array of objects {type: string, ...}, ...}
//	threadId           optional, string or null
//	retrievalPageSize  optional, number > 0
//	filter             optional, object or null (any content)
//	context            optional, array of objects {value: string;
//	                   type?: "code" | "textSelection", ...}
//	currentPath        optional, string of at most 200 characters
//
// Other fields are allowed and forwarded. It returns a *Error for the first
// problem found, or nil when the body is valid. The body is not modified.
func AssistantMessage(body []byte) error {
	_, err := AssistantMessageText(body)
	return err
}

// Bounds caps the size of an assistant body's conversation beyond its length in bytes: the
// messages it holds and the parts of each message. A zero field is no bound. An AssistantMessage
// function of the package applies none; its method of Bounds applies b.
type Bounds struct {
	Messages        int // messages in the body
	PartsPerMessage int // parts of one message
}

// AssistantMessageText is the package's AssistantMessageText that also refuses a body past
// b: "messages must hold at most N messages", "messages[i].parts must hold at most N parts".
func (b Bounds) AssistantMessageText(body []byte) (int, error) {
	s := scanner{data: body, bounds: b}
	if err := s.assistantMessage(&schemaV1); err != nil {
		return 0, err
	}
	return s.text, nil
}

// AssistantMessageV2Text is AssistantMessageText for the v2 body.
func (b Bounds) AssistantMessageV2Text(body []byte) (int, error) {
	s := scanner{data: body, bounds: b}
	if err := s.assistantMessage(&schemaV2); err != nil {
		return 0, err
	}
	return s.text, nil
}

// AssistantMessageText is AssistantMessage that also returns the length of the
// conversation's text: the bytes of the messages' content strings and of the
// context values, as they stand in the body (escapes included). That is what a
// prompt's tokens are estimated from, not the body's length: a filter or any
// other field a client fills at will carries no prompt.
func AssistantMessageText(body []byte) (int, error) {
	return Bounds{}.AssistantMessageText(body) // not a nil *Error: that would be a non-nil error interface
}

// AssistantMessageV2 validates the body of
// POST /discovery/v2/assistant/{domain}/message, what the AI SDK 5+ chat
// transport (DefaultChatTransport) posts plus the platform's fields:
//
//	fp                 required, string
//	messages           required, non-empty array of objects {id, role: string;
//	                   parts: array of objects {type: string, ...}, ...}
//	threadId, retrievalPageSize, filter, context, currentPath: as on v1
//
// An AI SDK 4 message (content and no parts) is refused: parts is required. The
// transport's own fields (id, trigger, messageId) and any other field are
// allowed and forwarded. It returns a *Error for the first problem found, or
// nil when the body is valid. The body is not modified.
func AssistantMessageV2(body []byte) error {
	_, err := AssistantMessageV2Text(body)
	return err
}

// AssistantMessageV2Text is AssistantMessageV2 that also returns the length of
// the conversation's text: the bytes of the string "text" member of the
// messages' parts (text and reasoning parts) and of the context values, as they
// stand in the body (escapes included). See AssistantMessageText.
func AssistantMessageV2Text(body []byte) (int, error) {
	return Bounds{}.AssistantMessageV2Text(body)
}

// assistantSchema is what differs between the two versions of the assistant
// body; the rest (threadId, retrievalPageSize, filter, context, currentPath)
// is the same.
type assistantSchema struct {
	fpReason         string // what fp must be: a non-empty string (v1), a string (v2)
	messagesNonEmpty bool   // v2: at least one message
	content          bool   // v1: every message has a string content
	partsRequired    bool   // v2: every message has parts
	messageNames     []string
}

var (
	schemaV1 = assistantSchema{fpReason: reasonNonEmptyString, content: true, messageNames: messageNames[:]}
	schemaV2 = assistantSchema{fpReason: reasonString, messagesNonEmpty: true, partsRequired: true, messageNames: messageNamesV2[:]}
)

// Bits recording which known top-level fields have been seen, to refuse
// duplicates and find missing required fields.
const (
	seenFp uint8 = 1 << iota
	seenMessages
	seenThreadID
	seenPageSize
	seenFilter
	seenContext
	seenCurrentPath
)

// Levels at which the known containers sit (the body object is level 1).
// They are passed to skipValue so MaxDepth holds across the whole body.
const (
	levelBody    = 1
	levelList    = 2 // messages, context, filter
	levelItem    = 3 // messages[i], context[i]
	levelParts   = 4 // messages[i].parts
	levelPartObj = 5 // messages[i].parts[j]
)

func (s *scanner) assistantMessage(sc *assistantSchema) *Error {
	if err := s.begin(); err != nil {
		return err
	}
	var seen uint8
	for first := true; ; first = false {
		key, escaped, more, err := s.nextMember(first)
		if err != nil {
			return err
		}
		if !more {
			break
		}
		var buf [keyBufLen]byte
		k := unescape(key, escaped, &buf)
		bit, name := topBit(k)
		if bit == 0 {
			if known := foldedName(k, assistantNames[:]); known != "" {
				return foldedError(known, k)
			}
			if err := s.member(key, escaped); err != nil {
				return err
			}
			if err := s.skipIn("", levelBody); err != nil {
				return err
			}
			continue
		}
		if seen&bit != 0 {
			return fieldError(name, reasonDuplicated)
		}
		seen |= bit
		if err := s.topField(sc, bit); err != nil {
			return err
		}
	}
	if err := s.closeObject(); err != nil {
		return err
	}
	// Trailing garbage makes the body not JSON at all, which is the more
	// fundamental complaint, so it is checked before required fields.
	if err := s.end(); err != nil {
		return err
	}
	if seen&seenFp == 0 {
		return fieldError("fp", reasonRequired)
	}
	if seen&seenMessages == 0 {
		return fieldError("messages", reasonRequired)
	}
	return nil
}

// topBit is the bit and the name of k when it is a known top-level field, else
// 0 and "". Small enough to be inlined: it runs for every member of the body.
func topBit(k []byte) (uint8, string) {
	switch string(k) {
	case "fp":
		return seenFp, "fp"
	case "messages":
		return seenMessages, "messages"
	case "threadId":
		return seenThreadID, "threadId"
	case "retrievalPageSize":
		return seenPageSize, "retrievalPageSize"
	case "filter":
		return seenFilter, "filter"
	case "context":
		return seenContext, "context"
	case "currentPath":
		return seenCurrentPath, "currentPath"
	}
	return 0, ""
}

// topField checks the value of the known top-level field identified by bit.
func (s *scanner) topField(sc *assistantSchema, bit uint8) *Error {
	switch bit {
	case seenFp:
		if s.peek() != '"' {
			return s.mismatch("fp", sc.fpReason, levelBody)
		}
		raw, _, err := s.str()
		if err != nil {
			return err
		}
		if len(raw) == 0 && sc.fpReason == reasonNonEmptyString { // escapes never unescape to nothing
			return fieldError("fp", reasonNonEmptyString)
		}
	case seenMessages:
		return s.messages(sc)
	case seenThreadID:
		switch s.peek() {
		case '"':
			_, _, err := s.str()
			return err
		case 'n':
			return s.literal("null")
		}
		return s.mismatch("threadId", reasonStringOrNull, levelBody)
	case seenPageSize:
		return s.pageSize()
	case seenFilter:
		switch s.peek() {
		case '{':
			return s.skipIn("filter", levelBody)
		case 'n':
			return s.literal("null")
		}
		return s.mismatch("filter", reasonObjectOrNull, levelBody)
	case seenContext:
		return s.context()
	case seenCurrentPath:
		if s.peek() != '"' {
			return s.mismatch("currentPath", reasonString, levelBody)
		}
		raw, escaped, err := s.str()
		if err != nil {
			return err
		}
		if runeCount(raw, escaped, maxCurrentPath) > maxCurrentPath {
			return fieldError("currentPath", "must be at most 200 characters")
		}
	}
	return nil
}

// pageSize checks retrievalPageSize: a number strictly greater than zero that
// a float64 can hold, so that an upstream decoding it as a double sees the
// same positive value (1e-400 would round to 0, 1e400 would not decode).
func (s *scanner) pageSize() *Error {
	if c := s.peek(); c != '-' && !isDigit(c) {
		return s.mismatch("retrievalPageSize", reasonPositive, levelBody)
	}
	raw, err := s.number()
	if err != nil {
		return err
	}
	if raw[0] == '-' {
		return fieldError("retrievalPageSize", reasonPositive)
	}
	f, perr := strconv.ParseFloat(string(raw), 64)
	if perr != nil || math.IsInf(f, 0) {
		return fieldError("retrievalPageSize", "is out of range")
	}
	if !(f > 0) {
		return fieldError("retrievalPageSize", reasonPositive)
	}
	return nil
}

// messages checks the messages array and each message in it.
func (s *scanner) messages(sc *assistantSchema) *Error {
	reason := reasonArrayOfObjects
	if sc.messagesNonEmpty {
		reason = reasonNonEmptyArrayOfObjects
	}
	if s.peek() != '[' {
		return s.mismatch("messages", reason, levelBody)
	}
	s.pos++
	for i, first := 0, true; ; i, first = i+1, false {
		more, err := s.nextElement(first)
		if err != nil {
			return err
		}
		if !more {
			if i == 0 && sc.messagesNonEmpty {
				return fieldError("messages", reason)
			}
			return nil
		}
		if max := s.bounds.Messages; max > 0 && i == max {
			return fieldError("messages", "must hold at most "+strconv.Itoa(max)+" messages")
		}
		if s.peek() != '{' {
			return s.mismatch(elem("messages", i, ""), reasonObject, levelList)
		}
		if err := s.message(sc, i); err != nil {
			return err
		}
	}
}

// Bits for the known fields of a message.
const (
	seenID uint8 = 1 << iota
	seenRole
	seenContent
	seenParts
)

// message checks messages[i]; s.pos is at its '{'.
func (s *scanner) message(sc *assistantSchema, i int) *Error {
	s.pos++
	s.openObject()
	var seen uint8
	for first := true; ; first = false {
		key, escaped, more, err := s.nextMember(first)
		if err != nil {
			return err
		}
		if !more {
			break
		}
		var buf [keyBufLen]byte
		k := unescape(key, escaped, &buf)
		bit, name := messageBit(k, sc.content)
		switch {
		case bit == 0: // an unknown field, or content on v2: free
			err = s.freeInElem(key, escaped, k, sc.messageNames, "messages", i)
		case seen&bit != 0:
			return fieldError(elem("messages", i, name), reasonDuplicated)
		case bit == seenParts:
			seen |= bit
			err = s.parts(i, sc.partsRequired)
		default: // id, role, content (v1): strings
			seen |= bit
			if s.peek() != '"' {
				return s.mismatch(elem("messages", i, name), reasonString, levelItem)
			}
			var raw []byte
			raw, _, err = s.str()
			if bit == seenContent {
				s.text += len(raw)
			}
		}
		if err != nil {
			return err
		}
	}
	if err := s.closeIn("messages", i); err != nil {
		return err
	}
	return sc.missing(seen, i)
}

// messageBit is the bit and the name of k when it is a known field of a
// message (content only where the schema has it), else 0 and "". Small enough
// to be inlined: it runs for every member of every message.
func messageBit(k []byte, content bool) (uint8, string) {
	switch string(k) {
	case "id":
		return seenID, "id"
	case "role":
		return seenRole, "role"
	case "content":
		if content {
			return seenContent, "content"
		}
	case "parts":
		return seenParts, "parts"
	}
	return 0, ""
}

// missing reports the first field the schema requires that messages[i] lacks
// (seen: the bits of those it has).
func (sc *assistantSchema) missing(seen uint8, i int) *Error {
	switch {
	case seen&seenID == 0:
		return fieldError(elem("messages", i, "id"), reasonRequired)
	case seen&seenRole == 0:
		return fieldError(elem("messages", i, "role"), reasonRequired)
	case sc.content && seen&seenContent == 0:
		return fieldError(elem("messages", i, "content"), reasonRequired)
	case sc.partsRequired && seen&seenParts == 0:
		return fieldError(elem("messages", i, "parts"), reasonRequired)
	}
	return nil
}

// parts checks messages[i].parts: an array of objects, each with a string
// "type"; other part fields are free. With countText (v2, where the parts are
// the message), a part's string "text" counts as conversation text; a v1
// message's parts repeat its content, which counts instead.
func (s *scanner) parts(i int, countText bool) *Error {
	if s.peek() != '[' {
		return s.mismatch(elem("messages", i, "parts"), reasonArrayOfObjects, levelItem)
	}
	s.pos++
	for j, first := 0, true; ; j, first = j+1, false {
		more, err := s.nextElement(first)
		if err != nil {
			return err
		}
		if !more {
			return nil
		}
		if max := s.bounds.PartsPerMessage; max > 0 && j == max {
			return fieldError(elem("messages", i, "parts"), "must hold at most "+strconv.Itoa(max)+" parts")
		}
		if s.peek() != '{' {
			return s.mismatch(partElem(i, j, ""), reasonObject, levelParts)
		}
		if err := s.part(i, j, countText); err != nil {
			return err
		}
	}
}

// part checks messages[i].parts[j] (see parts); s.pos is at its '{'.
func (s *scanner) part(i, j int, countText bool) *Error {
	s.pos++
	s.openObject()
	seenType := false
	for first := true; ; first = false {
		key, escaped, more, err := s.nextMember(first)
		if err != nil {
			return err
		}
		if !more {
			break
		}
		var buf [keyBufLen]byte
		if k := unescape(key, escaped, &buf); string(k) != "type" {
			if known := foldedName(k, partNames[:]); known != "" {
				return foldedError(partElem(i, j, known), k)
			}
			if err := s.member(key, escaped); err != nil {
				return within(err, partElem(i, j, ""))
			}
			if countText && string(k) == "text" && s.peek() == '"' { // a text or reasoning part's text
				raw, _, err := s.str()
				if err != nil {
					return err
				}
				s.text += len(raw)
				continue
			}
			if err := s.skipValue(levelPartObj); err != nil { // name the part only on failure: no allocation otherwise
				return within(err, partElem(i, j, ""))
			}
			continue
		}
		if seenType {
			return fieldError(partElem(i, j, "type"), reasonDuplicated)
		}
		seenType = true
		if s.peek() != '"' {
			return s.mismatch(partElem(i, j, "type"), reasonString, levelPartObj)
		}
		if _, _, err := s.str(); err != nil {
			return err
		}
	}
	if err := s.closeObject(); err != nil {
		return within(err, partElem(i, j, ""))
	}
	if !seenType {
		return fieldError(partElem(i, j, "type"), reasonRequired)
	}
	return nil
}

// partElem names messages[i].parts[j] (child: one of its fields), for an error
// only: building it allocates.
func partElem(i, j int, child string) string {
	return elem(elem("messages", i, "parts"), j, child)
}

// context checks the context array: objects with a string "value" and an
// optional "type" of "code" or "textSelection"; other fields are free.
func (s *scanner) context() *Error {
	if s.peek() != '[' {
		return s.mismatch("context", reasonArrayOfObjects, levelBody)
	}
	s.pos++
	for k, first := 0, true; ; k, first = k+1, false {
		more, err := s.nextElement(first)
		if err != nil {
			return err
		}
		if !more {
			return nil
		}
		if s.peek() != '{' {
			return s.mismatch(elem("context", k, ""), reasonObject, levelList)
		}
		if err := s.contextItem(k); err != nil {
			return err
		}
	}
}

// reasonContextType is the complaint about context[k].type.
const reasonContextType = `must be "code" or "textSelection"`

// contextItem checks context[k]; s.pos is at its '{'.
func (s *scanner) contextItem(k int) *Error {
	s.pos++
	s.openObject()
	seenValue, seenType := false, false
	for first := true; ; first = false {
		key, escaped, more, err := s.nextMember(first)
		if err != nil {
			return err
		}
		if !more {
			break
		}
		var buf [keyBufLen]byte
		name := unescape(key, escaped, &buf)
		switch string(name) {
		case "value":
			if seenValue {
				return fieldError(elem("context", k, "value"), reasonDuplicated)
			}
			seenValue = true
			if s.peek() != '"' {
				return s.mismatch(elem("context", k, "value"), reasonString, levelItem)
			}
			var raw []byte
			raw, _, err = s.str()
			s.text += len(raw)
		case "type":
			if seenType {
				return fieldError(elem("context", k, "type"), reasonDuplicated)
			}
			seenType = true
			err = s.contextType(k)
		default:
			err = s.freeInElem(key, escaped, name, contextNames[:], "context", k)
		}
		if err != nil {
			return err
		}
	}
	if err := s.closeIn("context", k); err != nil {
		return err
	}
	if !seenValue {
		return fieldError(elem("context", k, "value"), reasonRequired)
	}
	return nil
}

// contextType checks the value of context[k].type at s.pos.
func (s *scanner) contextType(k int) *Error {
	if s.peek() != '"' {
		return s.mismatch(elem("context", k, "type"), reasonContextType, levelItem)
	}
	raw, escaped, err := s.str()
	if err != nil {
		return err
	}
	// Compare after unescaping, like field names: "c\u006fde" is "code".
	var vbuf [keyBufLen]byte
	switch string(unescape(raw, escaped, &vbuf)) {
	case "code", "textSelection":
		return nil
	}
	return fieldError(elem("context", k, "type"), reasonContextType)
}
