// Package freetext says which characters free text handed to the gateway may hold.
//
// Freetext says which characters the free text operators and clients hand the
// gateway (quota reasons, Basic-auth user names, key labels and orgs) may hold, so that none
// can make what is stored, logged or printed read as something else.
//
// Refused: control characters (a newline forges a line; an escape sequence drives a
// terminal), Unicode format characters (category Cf: bidi overrides and isolates such as
// U+202E, which shows "txt.exe" for "exe.txt"; zero-width characters such as U+200B), line
// and paragraph separators (U+2028, U+2029), and bytes that are not UTF-8. Spaces, letters,
// marks, symbols and punctuation of any script are kept.
//
// Emoji sequences joined by U+200D (a zero-width joiner, category Cf) are refused with the
// rest: the rule is the category, not a list of characters thought harmful.
package freetext

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Refused reports whether r may not appear in free text: a control, format (Cf), line (Zl)
// or paragraph (Zp) separator character.
func Refused(r rune) bool {
	return unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp)
}

// Check returns nil when s may be kept as it is, else an error naming the first character
// refused (or the first byte that is not UTF-8) and where it is, counted in characters from 1.
func Check(s string) error {
	n := 0
	for i, r := range s {
		n++
		if r == utf8.RuneError {
			if _, size := utf8.DecodeRuneInString(s[i:]); size == 1 {
				return fmt.Errorf("holds a byte that is not UTF-8 (character %d)", n)
			}
		}
		if Refused(r) {
			return fmt.Errorf("must not hold control, format or separator characters (%U at character %d)", r, n)
		}
	}
	return nil
}

// Clean makes s fit to show or log: each byte that is not UTF-8 becomes U+FFFD, and the
// characters Refused names are dropped.
func Clean(s string) string {
	return strings.Map(func(r rune) rune {
		if Refused(r) {
			return -1
		}
		return r
	}, strings.ToValidUTF8(s, "\uFFFD"))
}
