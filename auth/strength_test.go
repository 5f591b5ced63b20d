package auth

import (
	"strings"
	"testing"
)

func TestCheckStrength(t *testing.T) {
	strong := strings.Repeat("aB3_-", 5)[:MinKeyEntropyChars]
	for _, c := range []struct {
		key  string
		kind Kind
		ok   bool
	}{
		{"svc_" + strong, Admin, true},
		{"svc_dsc_" + strong, Assistant, true},
		{"svc_1", Admin, false},
		{"svc_" + strong[:MinKeyEntropyChars-1], Admin, false},
		// The assistant prefix does not count towards the characters after it.
		{"svc_dsc_" + strong[:MinKeyEntropyChars-1], Assistant, false},
		{"svc_" + strong[:MinKeyEntropyChars-1] + ".", Admin, false},
		{"svc_" + strong + "~", Admin, false},
		{"svc_" + strong + "=", Admin, false},
		{"svc_dsc_" + strong, Admin, true}, // an admin prefix followed by 32 good characters
	} {
		err := CheckStrength(c.key, c.kind)
		if (err == nil) != c.ok {
			t.Errorf("CheckStrength(%q, %v) = %v, want ok %t", c.key, c.kind, err, c.ok)
		}
		if err != nil && strings.Contains(err.Error(), c.key) {
			t.Errorf("the error repeats the key: %v", err)
		}
	}
}

func TestGenerate(t *testing.T) {
	seen := map[string]bool{}
	for _, kind := range []Kind{Admin, Assistant} {
		for range 100 {
			k, err := Generate(kind)
			if err != nil {
				t.Fatal(err)
			}
			if seen[k] {
				t.Fatalf("%q generated twice", k)
			}
			seen[k] = true
			if err := CheckStrength(k, kind); err != nil {
				t.Fatalf("generated %q is weak: %v", k, err)
			}
			if id, reason := Check("Bearer "+k, kind); reason != 0 || id.Kind != kind {
				t.Fatalf("generated %q is not a %v key: %v", k, kind, reason)
			}
		}
	}
}
