package auth

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestKeysFileRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys.yaml")
	rev := time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC)
	in := []Entry{
		{Digest: Digest("svc_dsc_b"), Kind: "assistant", Org: "acme", Domains: []string{"acme-docs", "acme-blog"}, Plan: "enterprise", Label: "docs site",
			Created: time.Date(2025, 2, 1, 0, 0, 0, 0, time.UTC), Revoked: &rev},
		{Digest: Digest("svc_a"), Kind: "admin", Org: "acme", Projects: []string{"*"}, Created: time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)},
	}
	if err := SaveKeysFile(path, in); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("mode: %v %v", fi.Mode(), err)
	}
	out, err := LoadKeysFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 2 || out[0].Digest != in[1].Digest || out[1].Label != "docs site" || out[1].Revoked == nil || !out[1].Revoked.Equal(rev) ||
		len(out[1].Domains) != 2 || !out[0].Created.Equal(in[1].Created) {
		t.Fatalf("round trip: %+v", out)
	}
	// No temporary files left behind.
	if ents, _ := os.ReadDir(filepath.Dir(path)); len(ents) != 1 {
		t.Fatalf("directory: %v", ents)
	}
	// Saving over an existing file replaces it.
	if err := SaveKeysFile(path, in[:1]); err != nil {
		t.Fatal(err)
	}
	if out, err := LoadKeysFile(path); err != nil || len(out) != 1 {
		t.Fatalf("after second save: %v %v", out, err)
	}
	if err := SaveKeysFile(path, []Entry{{Digest: "svc_dsc_rawkey"}}); err == nil {
		t.Fatal("saved an invalid entry")
	}
}

func TestKeysFileStrict(t *testing.T) {
	d := Digest("svc_dsc_a")
	good := "  - digest: " + d + "\n    kind: assistant\n    org: acme\n    domains: [acme-docs]\n"
	cases := []struct{ body, want string }{
		{"keys:\n" + good + "  - digest: " + Digest("svc_b") + "\n    kind: admin\n    org: acme\n    projects: [p]\n    colour: red\n", "keys[1] (line 6): line 10: colour: unknown field"},
		{"keys:\n" + good + "  - key: svc_dsc_topsecret\n    kind: assistant\n", "keys[1]"},
		{"keys:\n  - digest: svc_dsc_topsecret\n    kind: assistant\n    org: acme\n    domains: [d]\n", "raw key"},
		{"keys:\n  - digest: " + d + "\n    kind: assistant\n    org: acme\n    domains: [d]\n    label: svc_dsc_topsecret\n", "raw key"},
		{"keys:\n" + good + good, "keys[1] (line 6): same digest as keys[0]"},
		{"keys:\n  - digest: " + d + "\n    kind: admin\n    org: acme\n    domains: [d]\n", "keys[0]"},
		{"keys:\n  - digest: " + d + "\n    kind: assistant\n    org: acme\n    domains: [d]\n    created: yesterday\n", "keys[0]"},
		{"entries: []\n", "entries: unknown field"},
		{"keys: {a: b}\n", "want a list"},
		{"- 1\n", "want a mapping"},
		{"keys: [\n", "yaml"},
		{"keys:\n  - {digest: 'svc_dsc_topsecret\n", "yaml"},
	}
	for i, c := range cases {
		path := filepath.Join(t.TempDir(), "keys.yaml")
		os.WriteFile(path, []byte(c.body), 0o600)
		_, err := LoadKeysFile(path)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("case %d: %v, want %q", i, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "topsecret") {
			t.Errorf("case %d: the error repeats a raw key: %v", i, err)
		}
	}
	for _, body := range []string{"", "keys:\n", "keys: []\n", "# nothing\n"} {
		path := filepath.Join(t.TempDir(), "keys.yaml")
		os.WriteFile(path, []byte(body), 0o600)
		if es, err := LoadKeysFile(path); err != nil || len(es) != 0 {
			t.Errorf("%q: %v %v", body, es, err)
		}
	}
	if _, err := LoadKeysFile(filepath.Join(t.TempDir(), "missing.yaml")); err == nil {
		t.Fatal("missing file accepted")
	}
}

// Keys-file times accept a date (midnight UTC) as well as RFC 3339, quoted or not; a
// revocation time still to come keeps the key working until then.
func TestKeysFileDates(t *testing.T) {
	d := func(s string) string { return Digest("svc_dsc_" + s) }
	file := "keys:\n" +
		"  - {digest: " + d("a") + ", kind: assistant, org: acme, domains: ['*'], created: 2025-01-02, revoked: '2025-03-04'}\n" +
		"  - {digest: " + d("b") + ", kind: assistant, org: acme, domains: ['*'], created: '2025-01-02T03:04:05Z', revoked: 2099-12-31}\n" +
		"  - {digest: " + d("c") + ", kind: assistant, org: acme, domains: ['*'], created: \"2025-01-02\"}\n"
	es, err := parseKeysFile([]byte(file))
	if err != nil {
		t.Fatal(err)
	}
	day := time.Date(2025, 1, 2, 0, 0, 0, 0, time.UTC)
	if !es[0].Created.Equal(day) || !es[0].Revoked.Equal(time.Date(2025, 3, 4, 0, 0, 0, 0, time.UTC)) || es[0].Active() {
		t.Fatalf("date-only entry: %+v", es[0])
	}
	if !es[1].Created.Equal(time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)) || !es[1].Active() {
		t.Fatalf("a revocation to come must keep the key active: %+v", es[1])
	}
	if !es[2].Created.Equal(day) || es[2].Revoked != nil {
		t.Fatalf("quoted date: %+v", es[2])
	}
	for _, bad := range []string{"2025-13-01", "yesterday", "02/01/2025", "2025-01-02 03:04"} {
		_, err := parseKeysFile([]byte("keys:\n  - {digest: " + d("x") + ", kind: assistant, org: acme, domains: ['*'], revoked: '" + bad + "'}\n"))
		if err == nil || !strings.Contains(err.Error(), "revoked: want a date (2025-01-02) or an RFC 3339 time") {
			t.Errorf("revoked %q: %v", bad, err)
		}
	}
	// Revoking brings a scheduled revocation forward to now.
	now := time.Now()
	if r := revokedNow(es[1], now); !r.Revoked.Equal(now.UTC().Round(0)) {
		t.Fatalf("revokedNow kept the later time: %v", r.Revoked)
	}
}
