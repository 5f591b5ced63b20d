// Package cors is the CORS policy of the assistant routes: the preflights it answers and the headers every answer carries.
package cors

import (
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// exposedHeaders are the response headers a browser script may read from an assistant answer:
// the thread it belongs to, the request id for support, the stream's protocol (the data
// stream of AI SDK 4, or the UI message stream of AI SDK 5 and later), and the rate-limit state.
const exposedHeaders = "X-Thread-Id, X-Thread-Key, X-Request-ID, X-Vercel-AI-Data-Stream, X-Vercel-AI-UI-Message-Stream, Retry-After, " +
	"RateLimit, RateLimit-Policy, RateLimit-Limit, RateLimit-Remaining, RateLimit-Reset, " +
	"Deprecation, Sunset, Link"

// Policy answers preflights and decorates responses of assistant routes, whose keys are public
// and which browsers call from documentation sites. Admin routes never answer CORS.
type Policy struct {
	any     bool
	origins []string
	maxAge  string
}

// New is the policy of cors.allowed_origins ("*" for any) and cors.max_age.
func New(origins []string, maxAge time.Duration) *Policy {
	return &Policy{
		any:     slices.Contains(origins, "*"),
		origins: origins,
		maxAge:  strconv.Itoa(int(maxAge / time.Second)),
	}
}

// allow returns the Access-Control-Allow-Origin value for origin, or "" when not allowed.
func (c *Policy) allow(origin string) string {
	if c.any {
		return "*"
	}
	if origin != "" && slices.Contains(c.origins, origin) {
		return origin
	}
	return ""
}

// Decorate puts the CORS headers on a response, errors and 429s included: a browser cannot
// read an error it is not allowed to see.
func (c *Policy) Decorate(h http.Header, r *http.Request) {
	origin := r.Header.Get("Origin")
	if !c.any {
		h.Add("Vary", "Origin")
	}
	allowed := c.allow(origin)
	if allowed == "" {
		return
	}
	// Canonical keys and, for the common "*", values shared read-only by every answer
	// (Header.Set allocates a slice per value): two allocations less per answer.
	if allowed == "*" {
		h["Access-Control-Allow-Origin"] = allowAnyOrigin
	} else {
		h["Access-Control-Allow-Origin"] = []string{allowed}
	}
	h["Access-Control-Expose-Headers"] = exposedHeadersValue
}

// Header values shared read-only by answers (length = capacity, so an append to one copies).
var (
	allowAnyOrigin      = []string{"*"}
	exposedHeadersValue = []string{exposedHeaders}
)

// Preflight answers an OPTIONS preflight for a path whose routes allow methods; no key is
// needed and nothing is counted against any limit.
func (c *Policy) Preflight(w http.ResponseWriter, r *http.Request, methods string) {
	h := w.Header()
	origin := r.Header.Get("Origin")
	if !c.any {
		h.Add("Vary", "Origin")
	}
	if allowed := c.allow(origin); allowed != "" {
		h.Set("Access-Control-Allow-Origin", allowed)
		h.Set("Access-Control-Allow-Methods", methods)
		h.Set("Access-Control-Allow-Headers", allowHeaders(r.Header.Get("Access-Control-Request-Headers")))
		h.Set("Access-Control-Max-Age", c.maxAge)
	}
	h.Set("Allow", methods+", OPTIONS")
	w.WriteHeader(http.StatusNoContent)
}

// allowHeaders lets the browser send the headers the assistant needs, plus whatever else it
// asks for: the key travels in Authorization, which CORS never allows by wildcard.
func allowHeaders(requested string) string {
	const base = "Authorization, Content-Type, X-Request-ID"
	if requested == "" || len(requested) > 1024 || !isVisibleASCIIOrSpace(requested) {
		return base
	}
	out := base
	for _, h := range strings.Split(requested, ",") {
		h = strings.TrimSpace(h)
		switch {
		case h == "", strings.EqualFold(h, "Authorization"), strings.EqualFold(h, "Content-Type"), strings.EqualFold(h, "X-Request-ID"):
		default:
			out += ", " + h
		}
	}
	return out
}

func isVisibleASCIIOrSpace(s string) bool {
	for i := 0; i < len(s); i++ {
		if (s[i] < ' ' || s[i] > '~') && s[i] != '\t' {
			return false
		}
	}
	return true
}
