package config

import (
	"regexp"
	"sort"
	"strconv"
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

// secretShaped matches a value that looks like a secret whatever key it was put under: a
// webhook signing secret (whsec_...) or an API key of either family (svc_..., svc_dsc_...),
// at the start of a word. The prefix is kept, so the message still says what was pasted
// where; what follows it (base64 or base64url) is not.
var secretShaped = regexp.MustCompile(`(^|[^A-Za-z0-9_])(whsec_|svc_(?:dsc_)?)[A-Za-z0-9+/=_.~-]+`)

// minSecret is the shortest configured secret masked wherever it appears: a shorter one
// would mask parts of ordinary words (no valid admin token is that short).
const minSecret = 4

// Redact masks every secret a config message could repeat: the user information of URL-like
// values (RedactURLs), values shaped like a signing secret or an API key, and every one of
// secrets (the configured admin token, the Redis password...) wherever it appears, also as
// %q would quote it. A value pasted under the wrong key (a secret in secret_env, a token in
// a timeout) is refused by a message that quotes it: this keeps the message and drops the
// secret.
func Redact(s string, secrets ...string) string {
	s = RedactURLs(s)
	if strings.Contains(s, "whsec_") || strings.Contains(s, "svc_") {
		s = secretShaped.ReplaceAllString(s, "${1}${2}REDACTED")
	}
	// Longest first: a secret that holds another is masked whole.
	sorted := make([]string, 0, 2*len(secrets))
	for _, v := range secrets {
		if len(v) < minSecret {
			continue
		}
		sorted = append(sorted, v)
		if q := strconv.Quote(v); q[1:len(q)-1] != v {
			sorted = append(sorted, q[1:len(q)-1])
		}
	}
	sort.Slice(sorted, func(i, j int) bool { return len(sorted[i]) > len(sorted[j]) })
	for _, v := range sorted {
		s = strings.ReplaceAll(s, v, "REDACTED")
	}
	return s
}

// Secrets lists the secret values c holds, for Redact: the admin token, the Redis password,
// the tracing headers' values (a collector's credentials) and the webhooks' inline secrets,
// each as written and each of its space-separated parts.
func (c *Config) Secrets() []string {
	out := []string{c.AdminToken, c.Redis.Password}
	for _, v := range c.Tracing.Headers {
		out = append(out, v)
	}
	for _, w := range c.Notifications.Webhooks {
		out = append(out, w.Secret)
		out = append(out, strings.Fields(w.Secret)...)
	}
	return out
}

// redactProblems masks every problem's key and message with Redact.
func redactProblems(problems []Problem, secrets []string) []Problem {
	for i, p := range problems {
		problems[i] = Problem{Key: Redact(p.Key, secrets...), Msg: Redact(p.Msg, secrets...)}
	}
	return problems
}
