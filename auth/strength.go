package auth

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
)

// MinKeyEntropyChars is how many characters a key registered by value needs after its
// family's prefix. 24 characters of [A-Za-z0-9_-] hold up to 144 bits; Generate makes 32
// (192 random bits).
const MinKeyEntropyChars = 24

// ErrWeakKey refuses a key too short or too plain to be a secret.
var ErrWeakKey = fmt.Errorf("the key is too weak: it needs at least %d characters from [A-Za-z0-9_-] after its prefix (gateway keys generate makes one)", MinKeyEntropyChars)

// CheckStrength refuses a key registered by value whose part after the family prefix is
// shorter than MinKeyEntropyChars or holds characters outside [A-Za-z0-9_-]. A key such as
// svc_1 is guessed at once; registry mode would then admit whoever guesses it. The error
// never repeats the key.
func CheckStrength(key string, kind Kind) error {
	prefix := adminPrefix
	if kind == Assistant {
		prefix = assistantPrefix
	}
	if len(key) < len(prefix) || key[:len(prefix)] != prefix {
		return errors.New("the key does not start with its family's prefix")
	}
	rest := key[len(prefix):]
	if len(rest) < MinKeyEntropyChars {
		return ErrWeakKey
	}
	for i := 0; i < len(rest); i++ {
		c := rest[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-') {
			return ErrWeakKey
		}
	}
	return nil
}

// Generate returns a new key of the family: its prefix and 32 characters of base64url
// (192 bits from crypto/rand).
func Generate(kind Kind) (string, error) {
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("auth: generating a key: %w", err)
	}
	prefix := adminPrefix
	if kind == Assistant {
		prefix = assistantPrefix
	}
	return prefix + base64.RawURLEncoding.EncodeToString(b[:]), nil
}
