package auth

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	cases := []struct {
		header string
		want   Kind
		reason Reason
	}{
		{"", Admin, Missing},
		{"Bearer svc_abc", Admin, 0},
		{"bearer svc_abc", Admin, 0},
		{"BEARER   svc_abc", Admin, 0},
		{"Bearer svc_dsc_abc", Assistant, 0},
		{"Bearer svc_dsc_abc", Admin, WrongKind},
		{"Bearer svc_abc", Assistant, WrongKind},
		{"Bearer svc_", Admin, UnknownFamily},
		{"Bearer svc_dsc_", Assistant, UnknownFamily},
		{"Bearer pk_abc", Admin, UnknownFamily},
		{"Bearer", Admin, Malformed},
		{"Bearer ", Admin, Malformed},
		{"Bearersvc_abc", Admin, Malformed},
		{"Basic svc_abc", Admin, Malformed},
		{"Bearer svc_a b", Admin, Malformed},
		{"Bearer svc_a\tb", Admin, Malformed},
		{"Bearer svc_é", Admin, Malformed},
		{"Bearer svc_abc==", Admin, 0},
		{"Bearer svc_a=b", Admin, Malformed},
		{"Bearer =", Admin, Malformed},
		{"Bearer svc_a-b.c_d~e+f/g", Admin, 0},
		{"Bearer svc_" + strings.Repeat("x", MaxKeyLen-4), Admin, 0},
		{"Bearer svc_" + strings.Repeat("x", MaxKeyLen-3), Admin, Malformed},
	}
	for _, c := range cases {
		id, reason := Check(c.header, c.want)
		if reason != c.reason {
			t.Errorf("Check(%q, %s) reason = %s, want %s", c.header, c.want, reason, c.reason)
			continue
		}
		if reason == 0 && (id.Kind != c.want || len(id.Digest) != 64) {
			t.Errorf("Check(%q) identity = %+v", c.header, id)
		}
		if reason != 0 && id != (Identity{}) {
			t.Errorf("Check(%q) returned an identity with a failure", c.header)
		}
	}
}

func TestDigestIsSHA256Hex(t *testing.T) {
	sum := sha256.Sum256([]byte("svc_dsc_key"))
	if got := Digest("svc_dsc_key"); got != hex.EncodeToString(sum[:]) || strings.Contains(got, "key") {
		t.Fatalf("Digest = %q", got)
	}
}

func FuzzBearer(f *testing.F) {
	for _, s := range []string{"", "Bearer svc_abc", "bearer svc_dsc_x==", "Bearer  svc_", "Basic x", "Bearer \x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, header string) {
		for _, want := range []Kind{Admin, Assistant} {
			id, reason := Check(header, want)
			if reason == 0 {
				if id.Kind != want || len(id.Digest) != 64 {
					t.Fatalf("accepted %q with identity %+v", header, id)
				}
				token := strings.TrimLeft(header[len("Bearer"):], " ")
				if len(token) > MaxKeyLen || !strings.HasPrefix(token, "svc_") {
					t.Fatalf("accepted a bad key in %q", header)
				}
			}
		}
	})
}
