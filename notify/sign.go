// Package notify signs and delivers the gateway's webhook events through an outbox.
//
// Notify signs and delivers the gateway's webhook events: Standard Webhooks 1.0
// signatures, an outbox that holds every delivery from its detection to its answer (in
// process, or in Redis where the replicas share it), and a loop that delivers what is due with
// exponential backoff and jitter, then keeps what never got through as a dead letter.
package notify

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The Standard Webhooks headers.
const (
	HeaderID        = "webhook-id"
	HeaderTimestamp = "webhook-timestamp"
	HeaderSignature = "webhook-signature"
)

// Sign returns the webhook-signature header of one delivery: "v1," and the base64
// HMAC-SHA256 of "id.timestamp.body" under each key, separated by spaces (several keys during
// a rotation).
func Sign(keys [][]byte, id string, timestamp int64, body []byte) string {
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString("v1,")
		b.WriteString(base64.StdEncoding.EncodeToString(mac(k, id, strconv.FormatInt(timestamp, 10), body)))
	}
	return b.String()
}

func mac(key []byte, id, timestamp string, body []byte) []byte {
	h := hmac.New(sha256.New, key)
	h.Write([]byte(id))
	h.Write([]byte{'.'})
	h.Write([]byte(timestamp))
	h.Write([]byte{'.'})
	h.Write(body)
	return h.Sum(nil)
}

// Verification errors.
var (
	ErrMissingHeaders = errors.New("webhook-id, webhook-timestamp or webhook-signature missing")
	ErrTimestamp      = errors.New("webhook-timestamp is not a Unix time within the tolerance")
	ErrSignature      = errors.New("no signature matches")
)

// Verify checks a delivery as a receiver does: the timestamp within tolerance of now, and
// one v1 signature of the header matching one of keys (compared in constant time).
func Verify(keys [][]byte, h http.Header, body []byte, now time.Time, tolerance time.Duration) error {
	id, ts, sigs := h.Get(HeaderID), h.Get(HeaderTimestamp), h.Get(HeaderSignature)
	if id == "" || ts == "" || sigs == "" {
		return ErrMissingHeaders
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return ErrTimestamp
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return ErrTimestamp
	}
	for _, s := range strings.Fields(sigs) {
		v, enc, ok := strings.Cut(s, ",")
		if !ok || v != "v1" {
			continue
		}
		got, err := base64.StdEncoding.DecodeString(enc)
		if err != nil {
			continue
		}
		for _, k := range keys {
			if subtle.ConstantTimeCompare(got, mac(k, id, ts, body)) == 1 {
				return nil
			}
		}
	}
	return ErrSignature
}
