package admin

import (
	"strings"
	"testing"
)

// A reason is kept in the audit trail and printed by the page, the log and gateway quota
// audit: control, format and separator characters are refused naming the character; text of
// any script, HTML and punctuation is kept as it is.
func TestCheckReason(t *testing.T) {
	for _, c := range []struct{ reason, want string }{
		{"ticket 4711: launch week", ""},
		{"<b>Zoë</b> — 東京 \"quoted\" =1+1", ""},
		{"", "must say why"},
		{"   ", "must say why"},
		{strings.Repeat("é", 501), "at most 500"},
		{"a\nFORGED", "U+000A"},
		{"approved by \u202Eecila", "U+202E at character 13"},
		{"ok\u2028FORGED LINE", "U+2028"},
		{"ok\u2029x", "U+2029"},
		{"hid\u200Bden", "U+200B"},
		{"iso\u2067late\u2069", "U+2067"},
		{"soft\u00ADhyphen", "U+00AD"},
		{"c1\u009B31m", "U+009B"},
	} {
		fe := checkReason(&c.reason)
		switch {
		case c.want == "" && fe != nil:
			t.Errorf("%q: refused: %v", c.reason, fe)
		case c.want != "" && (fe == nil || fe.field != "reason" || !strings.Contains(fe.msg, c.want)):
			t.Errorf("%q: %v, want reason refused with %q", c.reason, fe, c.want)
		}
	}
	if fe := checkReason(nil); fe == nil || fe.field != "reason" {
		t.Errorf("no reason: %v", fe)
	}
}
