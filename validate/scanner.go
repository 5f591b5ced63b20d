package validate

import (
	"encoding/binary"
	"unicode/utf16"
	"unicode/utf8"
)

// scanner walks a body once, checking the RFC 8259 grammar as it goes. The
// schema code (agent.go, assistant.go) drives it value by value; anything the
// schema does not care about is checked by skipValue. It never copies or
// rewrites the body: the gateway forwards the original bytes.
type scanner struct {
	data []byte
	pos  int
	text int // the conversation text's bytes seen so far (assistant bodies)
	// bounds caps an assistant body's messages and parts (zero: none).
	bounds Bounds
	// members are the names of the open objects' members, to refuse a duplicate (members.go).
	members memberStack
}

// skipWS skips the four whitespace bytes JSON allows between tokens.
func (s *scanner) skipWS() {
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

// peek returns the byte at s.pos, or 0 at the end of input. A literal NUL is
// never valid outside a string, so callers may treat 0 as "unexpected" and
// let unexpected() tell the two cases apart.
func (s *scanner) peek() byte {
	if s.pos < len(s.data) {
		return s.data[s.pos]
	}
	return 0
}

// unexpected reports the byte at s.pos (or the end of input) as the error.
func (s *scanner) unexpected() *Error {
	if s.pos >= len(s.data) {
		return eofError()
	}
	return syntaxError(s.pos, "unexpected "+describeByte(s.data[s.pos]))
}

// end checks that nothing but whitespace follows the top-level value.
func (s *scanner) end() *Error {
	s.skipWS()
	if s.pos != len(s.data) {
		return syntaxError(s.pos, "unexpected "+describeByte(s.data[s.pos])+" after the top-level value")
	}
	return nil
}

// SWAR constants: a uint64 seen as 8 bytes.
const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// str scans the string whose opening quote is at s.pos and returns its raw
// contents (between the quotes, still escaped) and whether it contains any
// escape. It rejects unescaped control characters, bad escapes and invalid
// UTF-8 (including UTF-8-encoded surrogates, which utf8.DecodeRune refuses).
func (s *scanner) str() (raw []byte, escaped bool, err *Error) {
	data := s.data
	start := s.pos + 1
	i := start
	for {
		// Fast path, 8 bytes at a time: stop at the first word holding a
		// byte < 0x20, '"', '\\' or >= 0x80. Each term is the classic exact
		// "has a byte less than n / equal to v" test; the final "| w" catches
		// non-ASCII. Chat text is mostly plain ASCII, so this is where the
		// throughput comes from.
		for i+8 <= len(data) {
			w := binary.LittleEndian.Uint64(data[i:])
			q := w ^ ('"' * lsb)
			b := w ^ ('\\' * lsb)
			if ((w-0x20*lsb)&^w|(q-lsb)&^q|(b-lsb)&^b|w)&msb != 0 {
				break
			}
			i += 8
		}
		// Then byte by byte up to the special byte.
		for i < len(data) {
			c := data[i]
			if c < 0x20 || c == '"' || c == '\\' || c >= 0x80 {
				break
			}
			i++
		}
		if i >= len(data) {
			return nil, false, eofError()
		}
		switch c := data[i]; {
		case c == '"':
			s.pos = i + 1
			return data[start:i], escaped, nil
		case c == '\\':
			n, err := escapeLen(data, i)
			if err != nil {
				return nil, false, err
			}
			escaped = true
			i += n
		case c < 0x20:
			return nil, false, syntaxError(i, "control character "+describeByte(c)+" in a string must be escaped")
		default:
			r, size := utf8.DecodeRune(data[i:])
			if r == utf8.RuneError && size == 1 {
				return nil, false, syntaxError(i, "invalid UTF-8")
			}
			i += size
		}
	}
}

// escapeLen checks the escape sequence starting with the backslash at
// data[i] and returns its length. Escaped lone surrogates (\ud800) are
// grammatical JSON and are accepted.
func escapeLen(data []byte, i int) (int, *Error) {
	if i+1 >= len(data) {
		return 0, eofError()
	}
	switch data[i+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return 2, nil
	case 'u':
		for k := i + 2; k < i+6; k++ {
			if k >= len(data) {
				return 0, eofError()
			}
			if hexVal(data[k]) < 0 {
				return 0, syntaxError(k, "invalid \\u escape in a string")
			}
		}
		return 6, nil
	}
	return 0, syntaxError(i, "invalid escape sequence in a string")
}

func hexVal(c byte) rune {
	switch {
	case c >= '0' && c <= '9':
		return rune(c - '0')
	case c >= 'a' && c <= 'f':
		return rune(c - 'a' + 10)
	case c >= 'A' && c <= 'F':
		return rune(c - 'A' + 10)
	}
	return -1
}

// hex4 decodes the four hex digits of an already validated \u escape.
func hex4(b []byte) rune {
	return hexVal(b[0])<<12 | hexVal(b[1])<<8 | hexVal(b[2])<<4 | hexVal(b[3])
}

// number scans a number at s.pos: -? (0 | [1-9][0-9]*) (.[0-9]+)? ([eE][+-]?[0-9]+)?
// and returns its bytes.
func (s *scanner) number() ([]byte, *Error) {
	data := s.data
	start := s.pos
	i := start
	if i < len(data) && data[i] == '-' {
		i++
	}
	switch {
	case i >= len(data):
		return nil, eofError()
	case data[i] == '0':
		i++
	case data[i] >= '1' && data[i] <= '9':
		i = digits(data, i+1)
	default:
		return nil, syntaxError(i, "unexpected "+describeByte(data[i])+" in a number")
	}
	if i < len(data) && data[i] == '.' {
		if i+1 >= len(data) {
			return nil, eofError()
		}
		if !isDigit(data[i+1]) {
			return nil, syntaxError(i+1, "expected a digit after the decimal point")
		}
		i = digits(data, i+1)
	}
	if i < len(data) && (data[i] == 'e' || data[i] == 'E') {
		i++
		if i < len(data) && (data[i] == '+' || data[i] == '-') {
			i++
		}
		if i >= len(data) {
			return nil, eofError()
		}
		if !isDigit(data[i]) {
			return nil, syntaxError(i, "expected a digit in the exponent")
		}
		i = digits(data, i)
	}
	s.pos = i
	return data[start:i], nil
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func digits(data []byte, i int) int {
	for i < len(data) && isDigit(data[i]) {
		i++
	}
	return i
}

// literal scans true, false or null at s.pos.
func (s *scanner) literal(lit string) *Error {
	for k := 0; k < len(lit); k++ {
		p := s.pos + k
		if p >= len(s.data) {
			return eofError()
		}
		if s.data[p] != lit[k] {
			return syntaxError(p, "unexpected "+describeByte(s.data[p]))
		}
	}
	s.pos += len(lit)
	return nil
}

// literalOf is the literal a value starting with c ('t', 'f' or 'n') must be.
func literalOf(c byte) string {
	switch c {
	case 't':
		return "true"
	case 'f':
		return "false"
	}
	return "null"
}

// key reads `"name" :` at s.pos, leaving s.pos at the member's value with
// whitespace skipped. It returns the raw (still escaped) name.
func (s *scanner) key() (raw []byte, escaped bool, err *Error) {
	if s.peek() != '"' {
		return nil, false, s.unexpected()
	}
	raw, escaped, err = s.str()
	if err != nil {
		return nil, false, err
	}
	s.skipWS()
	if s.peek() != ':' {
		return nil, false, s.unexpected()
	}
	s.pos++
	s.skipWS()
	return raw, escaped, nil
}

// nextMember moves to the next member of an object whose '{' has been
// consumed; first is true on the first call. It returns more=false once the
// closing '}' is consumed; otherwise s.pos is at the member's value.
func (s *scanner) nextMember(first bool) (key []byte, escaped, more bool, err *Error) {
	s.skipWS()
	c := s.peek()
	if c == '}' {
		s.pos++
		return nil, false, false, nil
	}
	if !first {
		if c != ',' {
			return nil, false, false, s.unexpected()
		}
		s.pos++
		s.skipWS()
	}
	key, escaped, err = s.key()
	return key, escaped, err == nil, err
}

// nextElement moves to the next element of an array whose '[' has been
// consumed; first is true on the first call. It returns more=false once the
// closing ']' is consumed; otherwise s.pos is at the element (not at EOF).
func (s *scanner) nextElement(first bool) (more bool, err *Error) {
	s.skipWS()
	c := s.peek()
	if c == ']' {
		s.pos++
		return false, nil
	}
	if !first {
		if c != ',' {
			return false, s.unexpected()
		}
		s.pos++
		s.skipWS()
	}
	if s.pos >= len(s.data) {
		return false, eofError()
	}
	return true, nil
}

// skipValue checks one JSON value of any type at s.pos. level is the nesting
// level of the container holding the value (0 for the top level, 1 inside the
// top-level object); a container opened inside takes the next level.
//
// It is iterative, with the kinds of the open containers kept in one uint64
// bit stack (MaxDepth <= 64 makes that enough), and refuses to open a
// container deeper than MaxDepth before opening it: hostile nesting costs
// O(MaxDepth) and no recursion. It is one loop whose helpers are inlined, on
// purpose: it skips every value the schema leaves free, so a call more per
// member or per container would be paid many times per body. A member's name
// is read where its value is (named), after a '{' or a ',' alike.
func (s *scanner) skipValue(level int) *Error {
	var objects uint64 // bit d set: the d-th open container is an object
	depth := 0         // containers currently open in this call
	named := false     // the value is an object member's: its name comes first
	var err *Error
	for {
		// A value is expected at s.pos (peek's 0 at the end of input is unexpected).
		s.skipWS()
		if named {
			if err = s.named(s.key()); err != nil {
				return err
			}
		}
		switch c := s.peek(); c {
		case '{', '[':
			if level+depth+1 > MaxDepth {
				return &Error{Reason: reasonTooDeep}
			}
			if !s.opens(c) {
				break // an empty container: a complete value
			}
			objects = withKind(objects, depth, c == '{')
			depth++
			if named = c == '{'; named {
				s.openObject()
			}
			continue
		case '"':
			_, _, err = s.str()
		case 't', 'f', 'n':
			err = s.literal(literalOf(c))
		default:
			if c != '-' && !isDigit(c) {
				return s.unexpected()
			}
			_, err = s.number()
		}
		// A value is complete (or failed): close the containers it ends, or go on.
		for ; depth > 0 && err == nil; depth-- {
			s.skipWS()
			inObject := objects>>(depth-1)&1 == 1
			c := s.peek()
			if c == ',' {
				s.pos++
				named = inObject
				break
			}
			if c != closer(inObject) {
				return s.unexpected()
			}
			s.pos++
			if inObject {
				err = s.closeObject()
			}
		}
		if depth == 0 || err != nil {
			return err
		}
	}
}

// named records the member name key read (raw, escaped), unless key failed
// (err): s.named(s.key()).
func (s *scanner) named(raw []byte, escaped bool, err *Error) *Error {
	if err != nil {
		return err
	}
	return s.member(raw, escaped)
}

// opens consumes the '{' or '[' (c) at s.pos, and when the container is empty
// its closer too (then false: a complete value).
func (s *scanner) opens(c byte) bool {
	s.pos++
	s.skipWS()
	if s.peek() == closer(c == '{') {
		s.pos++
		return false
	}
	return true
}

// closer is the byte that closes an object (object) or an array.
func closer(object bool) byte {
	if object {
		return '}'
	}
	return ']'
}

// withKind is objects with bit depth saying whether the container opened at
// that depth is an object.
func withKind(objects uint64, depth int, object bool) uint64 {
	if object {
		return objects | 1<<depth
	}
	return objects &^ (1 << depth)
}

// keyBufLen bounds the unescaped length of the names and enum values compared
// against the schema. Every known name is shorter, so anything longer is
// simply "unknown" and never needs the full unescaped text.
const keyBufLen = 32

// unescape returns the unescaped form of a raw string for comparison with a
// schema name, decoding into buf so nothing is allocated. It returns nil when
// the result would not fit in buf (no known name is that long). raw must
// already have passed str().
func unescape(raw []byte, escaped bool, buf *[keyBufLen]byte) []byte {
	if !escaped {
		return raw
	}
	n := 0
	for i := 0; i < len(raw); {
		c := raw[i]
		if c != '\\' {
			if n == len(buf) {
				return nil
			}
			buf[n] = c
			n++
			i++
			continue
		}
		var r rune
		switch raw[i+1] {
		case 'u':
			r, i = decodeU(raw, i)
		case 'b':
			r, i = '\b', i+2
		case 'f':
			r, i = '\f', i+2
		case 'n':
			r, i = '\n', i+2
		case 'r':
			r, i = '\r', i+2
		case 't':
			r, i = '\t', i+2
		default: // '"', '\\', '/'
			r, i = rune(raw[i+1]), i+2
		}
		if n+utf8.RuneLen(r) > len(buf) {
			return nil
		}
		n += utf8.EncodeRune(buf[n:], r)
	}
	return buf[:n]
}

// decodeU decodes the \u escape at raw[i] the way encoding/json does: a high
// surrogate followed by a low surrogate escape is one code point, any other
// surrogate becomes U+FFFD. It returns the rune and the index after it.
func decodeU(raw []byte, i int) (rune, int) {
	r := hex4(raw[i+2 : i+6])
	i += 6
	if !utf16.IsSurrogate(r) {
		return r, i
	}
	if i+6 <= len(raw) && raw[i] == '\\' && raw[i+1] == 'u' {
		if d := utf16.DecodeRune(r, hex4(raw[i+2:i+6])); d != utf8.RuneError {
			return d, i + 6
		}
	}
	return utf8.RuneError, i
}

// runeCount returns how many code points a raw string holds once unescaped,
// counting like decodeU, and stops early once the count exceeds limit.
func runeCount(raw []byte, escaped bool, limit int) int {
	if !escaped {
		return utf8.RuneCount(raw)
	}
	n := 0
	for i := 0; i < len(raw) && n <= limit; n++ {
		switch c := raw[i]; {
		case c == '\\' && raw[i+1] == 'u':
			_, i = decodeU(raw, i)
		case c == '\\':
			i += 2
		default:
			_, size := utf8.DecodeRune(raw[i:])
			i += size
		}
	}
	return n
}
