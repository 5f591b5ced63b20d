package validate

// Schema helpers shared by agent.go and assistant.go.

// The known structure of an assistant body nests five levels (body, messages,
// message, parts, part); this fails to compile if MaxDepth is ever set below
// that, since the schema code opens those containers without a depth check.
const _ = uint(MaxDepth - 5)

// begin checks that the body is a JSON object and consumes its '{'. For any
// other body, a syntax error anywhere in it is reported in preference to
// "must be a JSON object", since that is the more fundamental problem.
func (s *scanner) begin() *Error {
	s.skipWS()
	if s.peek() == '{' {
		s.pos++
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
		return err
	}
	return fieldError(field, reason)
}

// isTooDeep tells a depth error from skipValue apart from a syntax error, so
// that the caller can attach the field it happened in.
func isTooDeep(err *Error) bool { return err.Reason == reasonTooDeep }

// skipIn checks a value the schema does not constrain (an unknown field, the
// contents of filter). A depth error is attributed to field, the innermost
// known field enclosing the value ("" for the body as a whole).
func (s *scanner) skipIn(field string, level int) *Error {
	err := s.skipValue(level)
	if err != nil && isTooDeep(err) {
		err.Field = field
	}
	return err
}

// skipInElem is skipIn for a value inside an array element, e.g. an unknown
// field of messages[3]; the field name is built only if needed so that valid
// input allocates nothing (parent must therefore be a constant, not built).
func (s *scanner) skipInElem(parent string, i int, level int) *Error {
	err := s.skipValue(level)
	if err != nil && isTooDeep(err) {
		err.Field = elem(parent, i, "")
	}
	return err
}
