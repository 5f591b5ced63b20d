// Package auth turns a bearer key into the identity the gateway sees: its family and digest.
//
// It reads bearer credentials, tells the two key families apart, and keeps the key registry and
// the failed-authentication budget; nothing after it sees a key, only its SHA-256 digest.
package auth

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
)

// Kind is a key family.
type Kind uint8

const (
	// Admin keys (svc_...) are server-side secrets for agent jobs.
	Admin Kind = iota + 1
	// Assistant keys (svc_dsc_...) are public keys used from documentation sites.
	Assistant
)

// ParseKind maps the config's key names to kinds.
func ParseKind(s string) (Kind, bool) {
	switch s {
	case "admin":
		return Admin, true
	case "assistant":
		return Assistant, true
	}
	return 0, false
}

func (k Kind) String() string {
	switch k {
	case Admin:
		return "admin"
	case Assistant:
		return "assistant"
	}
	return "unknown"
}

const (
	adminPrefix     = "svc_"
	assistantPrefix = "svc_dsc_"
	// MaxKeyLen bounds a key; longer values are rejected before any work is done on them.
	MaxKeyLen = 256
)

// Reason says why credentials were refused; it is safe to log and to use as a metric label.
type Reason uint8

const (
	// Missing: no Authorization header at all.
	Missing Reason = iota + 1
	// Malformed: not "Bearer <token>", an empty token, characters outside the bearer token
	// set, or a token over MaxKeyLen bytes.
	Malformed
	// UnknownFamily: a well-formed token of neither key family, or a bare prefix.
	UnknownFamily
	// WrongKind: a key of the other family for this route.
	WrongKind
	// Expired: a registered key past its expiry (registry mode).
	Expired
)

func (r Reason) String() string {
	switch r {
	case Missing:
		return "missing"
	case Malformed:
		return "malformed"
	case UnknownFamily:
		return "unknown_family"
	case WrongKind:
		return "wrong_key_type"
	case Expired:
		return "expired"
	}
	return "unknown"
}

// Identity is what the gateway knows of a caller after auth: never the key itself.
type Identity struct {
	Kind Kind
	// Digest is the lower-case hex SHA-256 of the key, for counters and logs that need a stable
	// per-key id.
	Digest string
}

// Check validates an Authorization header value for a route that requires want. On failure it
// returns the reason and a zero Identity.
func Check(header string, want Kind) (Identity, Reason) {
	key, reason := bearer(header)
	if reason != 0 {
		return Identity{}, reason
	}
	kind := family(key)
	if kind == 0 {
		return Identity{}, UnknownFamily
	}
	if kind != want {
		return Identity{}, WrongKind
	}
	return Identity{Kind: kind, Digest: Digest(key)}, 0
}

// Digest is the lower-case hex SHA-256 of key.
func Digest(key string) string {
	var sum [sha256.Size]byte
	if len(key) <= MaxKeyLen {
		// Hash from a stack copy: converting the key to a []byte would allocate.
		var buf [MaxKeyLen]byte
		n := copy(buf[:], key)
		sum = sha256.Sum256(buf[:n])
	} else {
		sum = sha256.Sum256([]byte(key))
	}
	var out [2 * sha256.Size]byte
	hex.Encode(out[:], sum[:])
	return string(out[:])
}

// bearer extracts the token of "Bearer <token>" (scheme case-insensitive, RFC 7235).
func bearer(header string) (string, Reason) {
	if header == "" {
		return "", Missing
	}
	const scheme = "bearer"
	if len(header) <= len(scheme) || !strings.EqualFold(header[:len(scheme)], scheme) || header[len(scheme)] != ' ' {
		return "", Malformed
	}
	token := strings.TrimLeft(header[len(scheme):], " ")
	if token == "" || len(token) > MaxKeyLen || !isToken68(token) {
		return "", Malformed
	}
	return token, 0
}

// isToken68 reports whether s matches RFC 6750's b64token:
// 1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"=".
func isToken68(s string) bool {
	i := 0
	for ; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
			c == '-' || c == '.' || c == '_' || c == '~' || c == '+' || c == '/') {
			break
		}
	}
	if i == 0 {
		return false
	}
	for ; i < len(s); i++ {
		if s[i] != '=' {
			return false
		}
	}
	return true
}

// family classifies a key by prefix. The assistant prefix is itself an admin prefix, so it is
// tested first; a bare prefix with nothing after it is no key at all.
func family(key string) Kind {
	switch {
	case strings.HasPrefix(key, assistantPrefix):
		if len(key) == len(assistantPrefix) {
			return 0
		}
		return Assistant
	case strings.HasPrefix(key, adminPrefix):
		if len(key) == len(adminPrefix) {
			return 0
		}
		return Admin
	}
	return 0
}
