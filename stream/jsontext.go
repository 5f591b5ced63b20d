package stream

import (
	"bytes"
	"encoding/json"
	"unicode/utf8"
)

// Small JSON readers for the stream taps: they look at a few members of the upstream's
// parts and events without decoding them into Go values, so the parts that pass by the
// thousand (text) cost no allocation.

// jsonTextLen counts the UTF-8 bytes of the text a JSON string literal stands for, fed in
// pieces of any size: what a client's JSON decoder makes of it. Escapes count as what they
// stand for (\n one byte, \u00e9 two, a surrogate pair four, a lone surrogate three, as
// U+FFFD); other bytes count as themselves, which is exact for the valid UTF-8 that JSON
// text is.
type jsonTextLen struct {
	st   uint8
	nhex uint8 // hex digits read of a \u escape
	u    rune  // its value so far
	high bool  // a high surrogate waits for its low half
	n    int64
}

// States of jsonTextLen.
const (
	textBefore = iota // before the opening quote (whitespace allowed)
	textIn
	textEscape // after a backslash
	textHex    // inside \uXXXX
	textDone   // after the closing quote
	textBad    // not a string
)

func (c *jsonTextLen) reset() { *c = jsonTextLen{} }

// done reports the count and whether a whole string literal went by.
func (c *jsonTextLen) done() (int64, bool) { return c.n, c.st == textDone }

func (c *jsonTextLen) Feed(b []byte) {
	for len(b) > 0 {
		switch c.st {
		case textBefore:
			switch b[0] {
			case ' ', '\t', '\r', '\n':
			case '"':
				c.st = textIn
			default:
				c.st = textBad
			}
			b = b[1:]
		case textIn:
			i := bytes.IndexAny(b, `"\`)
			if i < 0 {
				c.plain(len(b))
				return
			}
			c.plain(i)
			if b[i] == '"' {
				c.flushHigh()
				c.st = textDone
			} else {
				c.st = textEscape
			}
			b = b[i+1:]
		case textEscape:
			if b[0] == 'u' {
				c.st, c.nhex, c.u = textHex, 0, 0
			} else {
				c.plain(1) // \" \\ \/ \b \f \n \r \t: one byte each
				c.st = textIn
			}
			b = b[1:]
		case textHex:
			c.u = c.u<<4 | hexDigit(b[0])
			c.nhex++
			b = b[1:]
			if c.nhex == 4 {
				c.codeUnit(c.u)
				c.st = textIn
			}
		default: // textDone, textBad: nothing more counts
			return
		}
	}
}

// plain counts n bytes that stand for themselves.
func (c *jsonTextLen) plain(n int) {
	if n == 0 {
		return
	}
	c.flushHigh()
	c.n += int64(n)
}

// flushHigh counts a high surrogate that found no low half: U+FFFD, three bytes.
func (c *jsonTextLen) flushHigh() {
	if c.high {
		c.high = false
		c.n += 3
	}
}

func (c *jsonTextLen) codeUnit(u rune) {
	switch {
	case u >= 0xD800 && u < 0xDC00:
		c.flushHigh()
		c.high = true
	case u >= 0xDC00 && u < 0xE000:
		if c.high {
			c.high = false
			c.n += 4 // the pair is one code point past U+FFFF
		} else {
			c.n += 3
		}
	default:
		c.flushHigh()
		c.n += int64(utf8.RuneLen(u))
	}
}

func hexDigit(c byte) rune {
	switch {
	case c >= '0' && c <= '9':
		return rune(c - '0')
	case c >= 'a' && c <= 'f':
		return rune(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return rune(c-'A') + 10
	}
	return 0 // not JSON; the count is then a guess, as the client would fail on it anyway
}

// textLen is the decoded length of a whole JSON string literal, or false when lit is none.
func textLen(lit []byte) (int64, bool) {
	var c jsonTextLen
	c.Feed(lit)
	return c.done()
}

// eachMember calls fn with the key (raw, between its quotes) and the raw value of each
// member of the JSON object obj, in order, and reports whether obj was a whole object. On
// malformed or cut input it stops there, after the members that were whole: a prefix of an
// event still tells its type.
func eachMember(obj []byte, fn func(key []byte, keyEscaped bool, val []byte)) bool {
	i := skipSpace(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return false
	}
	i = skipSpace(obj, i+1)
	if i < len(obj) && obj[i] == '}' {
		return skipSpace(obj, i+1) == len(obj)
	}
	for {
		if i >= len(obj) || obj[i] != '"' {
			return false
		}
		end, escaped := stringEnd(obj, i)
		if end < 0 {
			return false
		}
		key := obj[i+1 : end-1]
		i = skipSpace(obj, end)
		if i >= len(obj) || obj[i] != ':' {
			return false
		}
		i = skipSpace(obj, i+1)
		vend := valueEnd(obj, i)
		if vend < 0 {
			return false
		}
		fn(key, escaped, obj[i:vend])
		i = skipSpace(obj, vend)
		if i >= len(obj) {
			return false
		}
		switch obj[i] {
		case ',':
			i = skipSpace(obj, i+1)
		case '}':
			return skipSpace(obj, i+1) == len(obj)
		default:
			return false
		}
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the index just past the string literal starting at b[i] ('"'), and
// whether it holds escapes; -1 when it does not end.
func stringEnd(b []byte, i int) (int, bool) {
	escaped := false
	for j := i + 1; j < len(b); {
		k := bytes.IndexAny(b[j:], `"\`)
		if k < 0 {
			return -1, false
		}
		j += k
		if b[j] == '"' {
			return j + 1, escaped
		}
		escaped = true
		j += 2
	}
	return -1, false
}

// valueEnd returns the index just past the JSON value starting at b[i], or -1. Containers
// are skipped by counting brackets outside strings; scalars end at a delimiter. It checks
// no more of the grammar than the taps need: a malformed value makes its member unread, or
// ends the object early.
func valueEnd(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		end, _ := stringEnd(b, i)
		return end
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				end, _ := stringEnd(b, j)
				if end < 0 {
					return -1
				}
				j = end - 1
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	}
	j := i
	for j < len(b) {
		switch b[j] {
		case ',', '}', ']', ' ', '\t', '\n', '\r':
			if j == i {
				return -1
			}
			return j
		}
		j++
	}
	return -1 // a scalar must be followed by something inside an object
}

// keyIs reports whether a member's raw key is name (unescaping it first when it has escapes).
func keyIs(key []byte, escaped bool, name string) bool {
	if !escaped {
		return string(key) == name
	}
	return unquote(key) == name
}

// stringContents returns the contents of a string value, unescaped only when it has escapes
// (then allocating), and false when the value is no string.
func stringContents(val []byte) ([]byte, bool) {
	if len(val) < 2 || val[0] != '"' {
		return nil, false
	}
	raw := val[1 : len(val)-1]
	if bytes.IndexByte(raw, '\\') < 0 {
		return raw, true
	}
	return []byte(unquote(raw)), true
}

// unquote decodes the contents of a string literal with escapes (rare in these names).
func unquote(raw []byte) string {
	var s string
	lit := make([]byte, 0, len(raw)+2)
	lit = append(append(append(lit, '"'), raw...), '"')
	if json.Unmarshal(lit, &s) != nil {
		return ""
	}
	return s
}
