package config

import (
	"regexp"
	"strings"
)

// token is a run of characters that can belong to one URL-like value in a message: values
// are quoted (%q) or stand between spaces.
var token = regexp.MustCompile("[^\\s\"'`<>]+")

// RedactURLs replaces the user information of every URL-like value in s with "REDACTED":
// "redis://default:S3cret@host:6379" becomes "redis://REDACTED@host:6379", and the
// scheme-less "default:S3cret@host:6379" becomes "REDACTED@host:6379". Config messages
// repeat the values they refuse, and they reach the terminal, the error log, the 422 body of
// POST /reload and the usage page: a password in a mistyped address must reach none of them.
func RedactURLs(s string) string {
	if !strings.Contains(s, "@") {
		return s
	}
	return token.ReplaceAllStringFunc(s, redactToken)
}

func redactToken(t string) string {
	at := strings.LastIndexByte(t, '@')
	if at < 0 {
		return t
	}
	if i := strings.Index(t, "://"); i >= 0 && i < at {
		return t[:i+3] + "REDACTED" + t[at:]
	}
	if strings.Contains(t[:at], ":") {
		return "REDACTED" + t[at:]
	}
	return t // an address such as ops@example.com: no secret in it
}
