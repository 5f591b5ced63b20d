package validate

import "bytes"

// Schema helpers shared by agent.go and assistant.go.

// The known structure of an assistant body nests five levels (body, messages,
// message, parts, part); this fails to compile if MaxDepth is ever set below
// that, since the schema code opens those containers without a depth check.
const _ = uint(MaxDepth - 5)

// begin checks that the body is a JSON object and consumes its '{'. For any
// other body, a syntax error anywhere in it is reported in preference to
// "must be a JSON object", since that is the more fundamental problem.
func (s *scanner) begin() *Error {
	if len(s.data) > maxBody {
		return &Error{Reason: "is larger than the 2 GiB the validators read"}
	}
	s.skipWS()
	if s.peek() == '{' {
		s.pos++
		s.openObject()
		return nil
	}
	if s.pos >= len(s.data) {
		return &Error{Reason: "is empty: expected a JSON object"}
	}
	if err := s.skipValue(0); err != nil {
		return err
	}
	if err := s.end(); err != nil {
		return err
	}
	return fieldError("", reasonBodyObject)
}

// mismatch reports that the value at s.pos has the wrong type for field.
// The value is scanned first so that malformed JSON (e.g. `"messages": tru`)
// is reported as such rather than as a type error. This is the failure path
// only, so its cost does not matter.
func (s *scanner) mismatch(field, reason string, level int) *Error {
	if err := s.skipValue(level); err != nil && !isTooDeep(err) {
		return within(err, field)
	}
	return fieldError(field, reason)
}

// isTooDeep tells a depth error from skipValue apart from a syntax error, so
// that the caller can attach the field it happened in.
func isTooDeep(err *Error) bool { return err.Reason == reasonTooDeep }

// skipIn checks a value the schema does not constrain (an unknown field, the
// contents of filter). A depth error or a duplicate member is attributed to
// field, the innermost known field enclosing the value ("" for the body as a
// whole).
func (s *scanner) skipIn(field string, level int) *Error {
	return within(s.skipValue(level), field)
}

// skipInElem is skipIn for a value inside an array element, e.g. an unknown
// field of messages[3]; the field name is built only if needed so that valid
// input allocates nothing (parent must therefore be a constant, not built).
func (s *scanner) skipInElem(parent string, i int, level int) *Error {
	err := s.skipValue(level)
	if err != nil && (isTooDeep(err) || err.Duplicate != "") {
		err = within(err, elem(parent, i, ""))
	}
	return err
}

// memberIn is member for an object the schema knows, which a duplicate names: field
// is built on failure only (see skipInElem).
func (s *scanner) memberIn(raw []byte, escaped bool, parent string, i int) *Error {
	if err := s.member(raw, escaped); err != nil {
		return within(err, elem(parent, i, ""))
	}
	return nil
}

// freeInElem checks a member of parent[i] (an object the schema knows at
// levelItem: a message, a context item) whose name the schema leaves free (k,
// unescaped): refused when k spells a known name of the object (names) another
// way, else recorded and its value checked.
func (s *scanner) freeInElem(key []byte, escaped bool, k []byte, names []string, parent string, i int) *Error {
	if known := foldedName(k, names); known != "" {
		return foldedError(elem(parent, i, known), k)
	}
	if err := s.memberIn(key, escaped, parent, i); err != nil {
		return err
	}
	return s.skipInElem(parent, i, levelItem)
}

// closeIn is closeObject for messages[i], context[k] and the like.
func (s *scanner) closeIn(parent string, i int) *Error {
	if err := s.closeObject(); err != nil {
		return within(err, elem(parent, i, ""))
	}
	return nil
}

// The known field names of each object, for foldedName.
var (
	agentNames     = [...]string{"prompt"}
	assistantNames = [...]string{"fp", "messages", "threadId", "retrievalPageSize", "filter", "context", "currentPath"}
	messageNames   = [...]string{"id", "role", "content", "parts"}
	messageNamesV2 = [...]string{"id", "role", "parts"} // content is free on v2
	partNames      = [...]string{"type"}
	contextNames   = [...]string{"value", "type"}
)

// foldedName returns the known name (of names) that key, an unescaped object key that is
// none of them exactly, stands for to a decoder matching field names case-insensitively, or
// "" when it stands for none. encoding/json, and with it any Go upstream, decodes an object
// key into the struct field of that exact name, else into one whose name equals it under
// bytes.EqualFold (Unicode simple folding: "PROMPT", "Prompt", "meſſages" with U+017F), the
// last such key winning: a body whose "MESSAGES" follows a valid "messages" would be read as
// its unvalidated "MESSAGES". A key too long for the unescape buffer (nil) stands for no
// known name: no spelling of one is that long (TestFoldedSpellingsFitTheKeyBuffer).
func foldedName(key []byte, names []string) string {
	for _, n := range names {
		// Every spelling of an ASCII name is at least as long as the name.
		if len(key) >= len(n) && bytes.EqualFold(key, []byte(n)) {
			return n
		}
	}
	return ""
}
