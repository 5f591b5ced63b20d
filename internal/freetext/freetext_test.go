package freetext

import (
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	for _, c := range []struct {
		in   string
		want string // "" when accepted, else a part of the error
	}{
		{"ticket 4711: launch week", ""},
		{"Zoë's café, 東京 — ok ✓", ""},
		{"<b>html</b> \"quoted\"", ""},
		{"non\u00a0breaking and\u3000ideographic spaces", ""},
		{"a\nforged line", "U+000A at character 2"},
		{"tab\there", "U+0009"},
		{"esc\x1b[31m", "U+001B"},
		{"c1\u009bcsi", "U+009B"},
		{"invoice\u202Etxt.exe", "U+202E at character 8"},
		{"isolate\u2066x\u2069", "U+2066"},
		{"zero\u200Bwidth", "U+200B"},
		{"joiner\u200Dx", "U+200D"},
		{"bom\uFEFF", "U+FEFF"},
		{"line\u2028sep", "U+2028"},
		{"para\u2029sep", "U+2029"},
		{"bad \xff byte", "not UTF-8 (character 5)"},
	} {
		err := Check(c.in)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("Check(%q): %v, want nil", c.in, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("Check(%q): %v, want an error with %q", c.in, err, c.want)
		}
		if got := Clean(c.in); Check(got) != nil || (c.want == "" && got != c.in) {
			t.Errorf("Clean(%q) = %q", c.in, got)
		}
	}
	if got := Clean("a\u202Eb\u2028c\xffd\u200Be"); got != "abc\uFFFDde" {
		t.Errorf("Clean: %q", got)
	}
}
