// Package validate checks the JSON request bodies of the built-in routes before they are forwarded.
//
// Validate checks the JSON request bodies of the gateway's built-in
// upstream operations (agent jobs, assistant messages v1 and v2) before they
// are forwarded byte for byte.
//
// The validators never decode into maps or use reflection: each is a single
// pass over the body by a small JSON scanner (scanner.go) driven by the
// operation's schema (agent.go, assistant.go), which also refuses a member
// named twice in any object (members.go). Valid input allocates nothing
// unless more than 32 member names are open at once (the scanner keeps that
// many itself); errors are built only on the failure path. JSON applies the
// grammar and the duplicate rule to any body.
package validate

import "strconv"

// MaxDepth is the deepest nesting accepted anywhere in a body (objects and
// arrays, the top-level object counting as 1). It is enforced before
// descending, so hostile bodies of 100,000 '[' are rejected in O(MaxDepth).
const MaxDepth = 64

// Error names the offending field, for a 400 answer.
//
// Field uses JSON-path-like notation: "prompt", "messages[2].role",
// "context[0].type", or "" for the body as a whole (syntax errors, a
// non-object body). Reason is short and human-readable.
type Error struct {
	Field  string
	Reason string
	// CaseFolded: the body names the known field Field in another spelling that a
	// case-insensitive decoder takes for it ("PROMPT", or "meſſages" with U+017F: Go's
	// encoding/json matches field names so, Unicode folding included, and the last match
	// wins). The validator cannot vouch for what such an upstream would read.
	CaseFolded bool
	// Duplicate is the name of a member an object of the body holds twice (decoded, and cut
	// to 64 bytes), which Field names the object of (or the innermost known field holding
	// it); "" for any other problem.
	Duplicate string
}

// Error renders the problem for an end user, e.g. "messages[2].role must be
// a string" or "body is not valid JSON: unexpected end of input".
func (e *Error) Error() string {
	if e.Field == "" {
		return "body " + e.Reason
	}
	return e.Field + " " + e.Reason
}

// Reasons shared by both operations. They are phrased to follow the field
// name in Error().
const (
	reasonRequired               = "is required"
	reasonDuplicated             = "is duplicated"
	reasonString                 = "must be a string"
	reasonNonEmptyString         = "must be a non-empty string"
	reasonStringOrNull           = "must be a string or null"
	reasonObject                 = "must be an object"
	reasonObjectOrNull           = "must be an object or null"
	reasonArray                  = "must be an array"
	reasonArrayOfObjects         = "must be an array of objects"
	reasonNonEmptyArrayOfObjects = "must be a non-empty array of objects"
	reasonPositive               = "must be a positive number"
	reasonBodyObject             = "must be a JSON object"
	reasonTooDeep                = "is nested too deeply (at most 64 levels of objects and arrays are allowed)" // 64 == MaxDepth, checked by a test
)

func fieldError(field, reason string) *Error {
	return &Error{Field: field, Reason: reason}
}

// foldedError reports key, a spelling of the known field that a case-insensitive decoder
// reads as it. The key is quoted in ASCII: whatever it holds reaches the client's screen as
// escapes, never raw.
func foldedError(field string, key []byte) *Error {
	return &Error{
		Field:      field,
		Reason:     "must be spelled exactly: " + strconv.QuoteToASCII(string(key)) + " would be read as this field by a case-insensitive JSON decoder",
		CaseFolded: true,
	}
}

// syntaxError reports a JSON grammar violation at byte offset pos. Syntax
// errors always concern the body as a whole.
func syntaxError(pos int, msg string) *Error {
	return &Error{Reason: "is not valid JSON: " + msg + " at byte " + strconv.Itoa(pos)}
}

// eofError reports a body that ends in the middle of a value.
func eofError() *Error {
	return &Error{Reason: "is not valid JSON: unexpected end of input"}
}

// describeByte renders an offending byte safely for display in a browser:
// printable ASCII is quoted, anything else is shown in hex so that control
// characters or broken UTF-8 never reach the end user's screen raw.
func describeByte(c byte) string {
	if c >= 0x20 && c < 0x7f {
		return "character " + strconv.QuoteRune(rune(c))
	}
	const hex = "0123456789ABCDEF"
	return "byte 0x" + string([]byte{hex[c>>4], hex[c&0xf]})
}

// elem builds "parent[i]" or "parent[i].child" for error messages; only
// called on the failure path so that valid input allocates nothing.
func elem(parent string, i int, child string) string {
	p := parent + "[" + strconv.Itoa(i) + "]"
	if child == "" {
		return p
	}
	return p + "." + child
}
