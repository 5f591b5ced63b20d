package validate

import "testing"

func TestIsJSON(t *testing.T) {
	for ct, want := range map[string]bool{
		"application/json":                  true,
		"application/json; charset=utf-8":   true,
		"application/json; charset=UTF-8":   true,
		"application/vnd.api+json":          true,
		"application/json; charset=latin-1": false,
		"text/plain":                        false,
		"":                                  false,
		"application/json;;":                false,
	} {
		if got := IsJSON(ct); got != want {
			t.Errorf("IsJSON(%q) = %v, want %v", ct, got, want)
		}
	}
}

func TestFoldIndexes(t *testing.T) {
	for in, want := range map[string]string{
		"messages[3].role":           "messages[].role",
		"messages[12].parts[0].text": "messages[].parts[].text",
		"prompt":                     "prompt",
	} {
		if got := FoldIndexes(in); got != want {
			t.Errorf("FoldIndexes(%q) = %q, want %q", in, got, want)
		}
	}
}
