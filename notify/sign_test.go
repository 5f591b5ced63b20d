package notify

import (
	"encoding/base64"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/docsgate/gateway/config"
)

// The test vector the Standard Webhooks reference libraries all check: secret, id,
// timestamp and body, and the signature they produce.
const (
	vectorSecret    = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	vectorID        = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	vectorTimestamp = 1614265330
	vectorBody      = `{"test": 2432232314}`
	vectorSignature = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
)

func vectorKeys(t *testing.T) [][]byte {
	t.Helper()
	keys, err := config.ParseSecrets(vectorSecret)
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

func TestSignMatchesTheReferenceVector(t *testing.T) {
	if got := Sign(vectorKeys(t), vectorID, vectorTimestamp, []byte(vectorBody)); got != vectorSignature {
		t.Fatalf("got %s, want %s", got, vectorSignature)
	}
}

func headers(id, ts, sig string) http.Header {
	h := http.Header{}
	h.Set(HeaderID, id)
	h.Set(HeaderTimestamp, ts)
	h.Set(HeaderSignature, sig)
	return h
}

func TestVerify(t *testing.T) {
	keys := vectorKeys(t)
	at := time.Unix(vectorTimestamp, 0)
	const ts = "1614265330"
	if err := Verify(keys, headers(vectorID, ts, vectorSignature), []byte(vectorBody), at.Add(time.Minute), 5*time.Minute); err != nil {
		t.Fatalf("the reference vector: %v", err)
	}
	other := []byte(strings.Repeat("k", 32))
	// A rotation: two signatures, the receiver holding either key accepts.
	both := Sign([][]byte{other, keys[0]}, vectorID, vectorTimestamp, []byte(vectorBody))
	if parts := strings.Fields(both); len(parts) != 2 || parts[1] != vectorSignature {
		t.Fatalf("two keys: %q", both)
	}
	for _, k := range [][]byte{other, keys[0]} {
		if err := Verify([][]byte{k}, headers(vectorID, ts, both), []byte(vectorBody), at, time.Minute); err != nil {
			t.Fatalf("rotation: %v", err)
		}
	}
	for name, tc := range map[string]struct {
		h    http.Header
		body string
		now  time.Time
		want error
	}{
		"body changed":           {headers(vectorID, ts, vectorSignature), `{"test": 2432232315}`, at, ErrSignature},
		"id changed":             {headers("msg_other", ts, vectorSignature), vectorBody, at, ErrSignature},
		"timestamp changed":      {headers(vectorID, "1614265331", vectorSignature), vectorBody, at, ErrSignature},
		"too old":                {headers(vectorID, ts, vectorSignature), vectorBody, at.Add(6 * time.Minute), ErrTimestamp},
		"from the future":        {headers(vectorID, ts, vectorSignature), vectorBody, at.Add(-6 * time.Minute), ErrTimestamp},
		"no signature":           {headers(vectorID, ts, ""), vectorBody, at, ErrMissingHeaders},
		"another scheme":         {headers(vectorID, ts, "v1a,"+strings.TrimPrefix(vectorSignature, "v1,")), vectorBody, at, ErrSignature},
		"not base64":             {headers(vectorID, ts, "v1,%%%"), vectorBody, at, ErrSignature},
		"timestamp not a number": {headers(vectorID, "soon", vectorSignature), vectorBody, at, ErrTimestamp},
	} {
		if err := Verify(keys, tc.h, []byte(tc.body), tc.now, 5*time.Minute); !errors.Is(err, tc.want) {
			t.Errorf("%s: got %v, want %v", name, err, tc.want)
		}
	}
	if _, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(vectorSignature, "v1,")); err != nil {
		t.Fatal(err)
	}
}

func TestIDs(t *testing.T) {
	a, b := NewID(), NewID()
	if a == b || !strings.HasPrefix(a, "evt_") || len(a) != 36 || strings.Contains(a, ".") {
		t.Fatalf("%s %s", a, b)
	}
	if s := StableID("x", "y"); s != StableID(strings.Clone("x"), "y") || len(s) != 36 || s == StableID("xy") || StableID("x", "y") == StableID("y", "x") {
		t.Fatal("StableID is not a function of its parts")
	}
}
