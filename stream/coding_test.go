package stream

import (
	"bytes"
	"io"
	"slices"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/docsgate/gateway/internal/codingtest"
)

func TestAnswerCodings(t *testing.T) {
	for _, tc := range []struct {
		values []string
		want   []Coding
		label  string
		ok     bool
	}{
		{nil, nil, "", true},
		{[]string{"identity"}, nil, "", true},
		{[]string{"gzip"}, []Coding{codingGzip}, "gzip", true},
		{[]string{"X-GZIP"}, []Coding{codingGzip}, "gzip", true},
		{[]string{" deflate "}, []Coding{codingDeflate}, "deflate", true},
		{[]string{"gzip, br"}, []Coding{codingGzip, codingBrotli}, "br", true},
		{[]string{"gzip", "zstd"}, []Coding{codingGzip, codingZstd}, "zstd", true},
		{[]string{"identity, br,"}, []Coding{codingBrotli}, "br", true},
		{[]string{"compress"}, nil, "other", false},
		{[]string{"gzip, x-custom"}, nil, "other", false},
		{[]string{"gzip, gzip, gzip"}, nil, "other", false}, // past maxCodings
	} {
		cs, label, ok := Codings(tc.values)
		if !slices.Equal(cs, tc.want) || label.String() != tc.label || ok != tc.ok {
			t.Errorf("%q: %v %q %v, want %v %q %v", tc.values, cs, label, ok, tc.want, tc.label, tc.ok)
		}
	}
}

// Every coding the gateway reads decodes to the answer as it was, whatever the sizes of the
// upstream's reads; an empty answer is empty, a truncated or corrupt one an error (never a
// clean end), and deflate is read with or without its zlib wrapper.
func TestDecodingBody(t *testing.T) {
	answer := []byte(strings.Repeat("data: {\"type\":\"text-delta\",\"id\":\"t1\",\"delta\":\"hello\"}\n\n", 200))
	for name, ce := range codingtest.Codings() {
		if name == "xor" {
			continue
		}
		t.Run(name, func(t *testing.T) {
			cs, _, ok := Codings([]string{ce})
			if !ok {
				t.Fatalf("%q is not read", ce)
			}
			coded := codingtest.Encode(name, answer)
			for _, raw := range []io.Reader{bytes.NewReader(coded), iotest.OneByteReader(bytes.NewReader(coded)), iotest.HalfReader(bytes.NewReader(coded))} {
				d := NewDecoder(io.NopCloser(raw), cs)
				got, err := io.ReadAll(d)
				if err != nil || !bytes.Equal(got, answer) {
					t.Fatalf("decoded %d bytes (%v), want %d", len(got), err, len(answer))
				}
				if err := d.Close(); err != nil || d.Close() != nil {
					t.Fatalf("close: %v", err)
				}
			}
			d := &decodingBody{raw: io.NopCloser(bytes.NewReader(coded[:len(coded)*2/3])), codings: cs}
			if _, err := io.ReadAll(d); err == nil {
				t.Fatal("a truncated answer read as whole")
			}
			if got, err := io.ReadAll(&decodingBody{raw: io.NopCloser(strings.NewReader("")), codings: cs}); err != nil || len(got) != 0 {
				t.Fatalf("an empty answer: %q %v", got, err)
			}
		})
	}
	d := &decodingBody{raw: io.NopCloser(strings.NewReader("this is no gzip at all")), codings: []Coding{codingGzip}}
	if _, err := io.ReadAll(d); err == nil || !strings.Contains(err.Error(), "decoding the answer's gzip") {
		t.Fatalf("corrupt gzip: %v", err)
	}
}

// The opaque tap counts every byte as text in reads of any size, and with a check drops a
// read that would take the answer past its budget, whole.
func TestOpaqueTap(t *testing.T) {
	var tap Opaque
	for _, n := range []int{1, 100, 7} {
		if got := tap.Feed(make([]byte, n)); got != n {
			t.Fatalf("took %d of %d", got, n)
		}
	}
	if tap.Outcome().TextBytes != 108 || tap.Outcome().Result() != "incomplete" {
		t.Fatalf("outcome %+v", *tap.Outcome())
	}
	budget := int64(50)
	tap = Opaque{check: CheckFunc(func(whole bool) Action {
		if !whole {
			t.Fatal("an opaque read is always whole")
		}
		if tap.out.TextBytes > budget {
			return CutBefore
		}
		return GoOn
	})}
	if tap.Feed(make([]byte, 40)) != 40 || tap.Feed(make([]byte, 20)) != 0 || tap.Outcome().TextBytes != 40 {
		t.Fatalf("the read past the budget was not dropped: %+v", *tap.Outcome())
	}
}
