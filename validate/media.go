package validate

import (
	"mime"
	"strings"
)

// IsJSON says whether a Content-Type is one the validators read: it accepts application/json (and +json types) with no charset or UTF-8: JSON is UTF-8
// (RFC 8259), and the validators read it as such.
func IsJSON(ct string) bool {
	if ct == "application/json" {
		return true
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil {
		return false
	}
	if mt != "application/json" && !(strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json")) {
		return false
	}
	cs, ok := params["charset"]
	return !ok || strings.EqualFold(cs, "utf-8")
}

// FoldIndexes turns messages[3].role into messages[].role so the metric label stays bounded.
func FoldIndexes(field string) string {
	if !strings.Contains(field, "[") {
		return field
	}
	var b strings.Builder
	skip := false
	for i := 0; i < len(field); i++ {
		c := field[i]
		switch {
		case c == '[':
			skip = true
			b.WriteByte(c)
		case c == ']':
			skip = false
			b.WriteByte(c)
		case !skip:
			b.WriteByte(c)
		}
	}
	return b.String()
}
