package validate

import (
	"bytes"
	"slices"
	"strconv"
	"unicode/utf8"
)

// A member named twice in one object is refused at any depth, known or not: decoders keep
// one of the two (encoding/json the last, others the first), so the gateway and the upstream
// could read different bodies, and an upstream that reads a nested field the gateway does
// not know would read whichever its decoder keeps. Names are compared as encoding/json
// decodes them: "a" and "\u0061" are the same name.
//
// The scanner keeps the names of the members of every open object on one stack, innermost
// object last, each object's names after a mark that remembers where the enclosing object's
// names start. The mark is pushed with the object's first name: most objects the schema
// knows hold no name it does not know, and cost only a count and a bit. A new name is
// compared with those of its object while the object has few (real objects have a handful:
// a few length compares); an object with more is checked once, when it closes, by sorting
// its names, so a hostile object of 100,000 members costs n log n, not n². Up to 32 names are
// kept in the scanner itself: ordinary bodies allocate nothing.

// smallObject is how many names an object may hold and still be checked name by name.
const smallObject = 16

// memberName is one name on the stack: its raw text, still escaped, is data[pos:pos+len],
// where len is n without escapedBit, which says the name holds an escape. A mark
// (n == frameMark) opens an object; its pos is where the enclosing object's names start.
type memberName struct{ pos, n uint32 }

const (
	escapedBit = 1 << 31
	frameMark  = ^uint32(0)
)

// maxBody is the largest body the validators read: a name's place and length in it must fit
// a memberName.
const maxBody = 1<<31 - 1

func (m memberName) raw(data []byte) []byte { return data[m.pos : m.pos+m.n&^escapedBit] }
func (m memberName) escaped() bool          { return m.n&escapedBit != 0 }

// memberStack holds the names; up to len(inline) of them in the scanner itself, past that all
// of them in heap.
type memberStack struct {
	inline [32]memberName
	heap   []memberName
	n      int // entries in use, marks included
	base   int // where the innermost named object's names start
	depth  int // objects open: at most MaxDepth
	// named has bit d-1 set when the object open at depth d has its mark and names on the
	// stack.
	named uint64
}

func (ms *memberStack) entries() []memberName {
	if ms.heap != nil {
		return ms.heap[:ms.n]
	}
	return ms.inline[:ms.n]
}

func (ms *memberStack) push(e memberName) {
	if ms.heap == nil && ms.n < len(ms.inline) {
		ms.inline[ms.n] = e
		ms.n++
		return
	}
	ms.spill(e)
}

// spill is push past the inline names.
func (ms *memberStack) spill(e memberName) {
	if ms.heap == nil {
		ms.heap = append(make([]memberName, 0, 8*len(ms.inline)), ms.inline[:]...)
	}
	ms.heap = append(ms.heap[:ms.n], e)
	ms.n++
}

// openObject starts an object whose '{' was consumed; its mark waits for its first name.
func (s *scanner) openObject() {
	s.members.depth++
	s.members.named &^= 1 << uint(s.members.depth-1)
}

// member records the name of a member of the innermost open object, refusing it when the
// object already has a member of that name (checked here while the object is small). raw is
// the raw name key() returned, a slice of s.data.
func (s *scanner) member(raw []byte, escaped bool) *Error {
	ms := &s.members
	if bit := uint64(1) << uint(ms.depth-1); ms.named&bit == 0 {
		ms.named |= bit
		ms.push(memberName{pos: uint32(ms.base), n: frameMark})
		ms.base = ms.n
	} else if ms.n-ms.base < smallObject {
		if err := s.compareInObject(raw, escaped); err != nil {
			return err
		}
	}
	// raw is data[start:end], so its capacity tells where it starts.
	m := memberName{pos: uint32(cap(s.data) - cap(raw)), n: uint32(len(raw))}
	if escaped {
		m.n |= escapedBit
	}
	ms.push(m)
	return nil
}

// compareInObject refuses raw when the innermost open object has a member of that name.
func (s *scanner) compareInObject(raw []byte, escaped bool) *Error {
	ms := &s.members
	for _, m := range ms.entries()[ms.base:] {
		if !escaped && m.n == uint32(len(raw)) { // neither holds an escape: the bytes are the name
			if string(m.raw(s.data)) == string(raw) {
				return duplicateError(raw, escaped)
			}
		} else if (escaped || m.escaped()) && compareNames(m.raw(s.data), m.escaped(), raw, escaped) == 0 {
			return duplicateError(raw, escaped)
		}
	}
	return nil
}

// closeObject ends the innermost open object, whose '}' was consumed: a large one is checked
// for a duplicate now.
func (s *scanner) closeObject() *Error {
	s.members.depth--
	if s.members.named&(1<<uint(s.members.depth)) == 0 {
		return nil
	}
	return s.closeNamed()
}

// closeNamed is closeObject for an object that has names on the stack.
func (s *scanner) closeNamed() *Error {
	ms := &s.members
	entries := ms.entries()
	names := entries[ms.base:]
	ms.n, ms.base = ms.base-1, int(entries[ms.base-1].pos)
	if len(names) > smallObject {
		return s.sortedDuplicate(names)
	}
	return nil
}

// sortedDuplicate sorts names by their decoded text and refuses the first that repeats.
func (s *scanner) sortedDuplicate(names []memberName) *Error {
	slices.SortFunc(names, func(a, b memberName) int {
		return compareNames(a.raw(s.data), a.escaped(), b.raw(s.data), b.escaped())
	})
	for i := 1; i < len(names); i++ {
		a, b := names[i-1], names[i]
		if compareNames(a.raw(s.data), a.escaped(), b.raw(s.data), b.escaped()) == 0 {
			return duplicateError(b.raw(s.data), b.escaped())
		}
	}
	return nil
}

// compareNames orders two raw names by their decoded text, code point by code point (which
// is the order of their UTF-8 bytes): 0 when encoding/json would decode them to the same
// string.
func compareNames(a []byte, aEscaped bool, b []byte, bEscaped bool) int {
	if !aEscaped && !bEscaped {
		return bytes.Compare(a, b)
	}
	i, j := 0, 0
	for i < len(a) && j < len(b) {
		var ra, rb rune
		ra, i = nextRune(a, i)
		rb, j = nextRune(b, j)
		if ra != rb {
			if ra < rb {
				return -1
			}
			return 1
		}
	}
	switch {
	case i < len(a):
		return 1
	case j < len(b):
		return -1
	}
	return 0
}

// nextRune decodes the code point of a raw string (already checked by str) at raw[i], an
// escape as decodeU and unescape do, and returns it with the index after it.
func nextRune(raw []byte, i int) (rune, int) {
	if raw[i] != '\\' {
		if c := raw[i]; c < utf8.RuneSelf {
			return rune(c), i + 1
		}
		r, size := utf8.DecodeRune(raw[i:])
		return r, i + size
	}
	switch raw[i+1] {
	case 'u':
		return decodeU(raw, i)
	case 'b':
		return '\b', i + 2
	case 'f':
		return '\f', i + 2
	case 'n':
		return '\n', i + 2
	case 'r':
		return '\r', i + 2
	case 't':
		return '\t', i + 2
	}
	return rune(raw[i+1]), i + 2 // '"', '\\', '/'
}

// maxShownName bounds the name a duplicate's message quotes, in bytes of its decoded text.
const maxShownName = 64

// duplicateError reports a member named twice, quoting its decoded name in ASCII (whatever
// it holds reaches the client's screen as escapes, never raw). The caller names the object.
func duplicateError(raw []byte, escaped bool) *Error {
	var text []byte
	for i := 0; i < len(raw); {
		var r rune
		r, i = nextRune(raw, i)
		if len(text)+utf8.RuneLen(r) > maxShownName {
			text = append(text, "..."...)
			break
		}
		text = utf8.AppendRune(text, r)
	}
	name := string(text)
	return &Error{Reason: "has a duplicate member " + strconv.QuoteToASCII(name), Duplicate: name}
}

// within names field as where a duplicate member (or too deep a nesting) was found: the
// innermost object or field the schema knows, when the error does not name one yet.
func within(err *Error, field string) *Error {
	if err != nil && (err.Duplicate != "" || isTooDeep(err)) && err.Field == "" {
		err.Field = field
	}
	return err
}
