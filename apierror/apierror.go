// Package apierror is the public API's error vocabulary: the stable codes and the {"error": "...", "code": "..."} body every front door answers with.
package apierror

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// The codes: a stable, documented vocabulary that clients and dashboards can rely on.
const (
	MissingCredentials   = "missing_credentials"
	InvalidCredentials   = "invalid_credentials"
	WrongKeyType         = "wrong_key_type"
	InvalidRequest       = "invalid_request"
	InvalidBody          = "invalid_body"
	UnsupportedMediaType = "unsupported_media_type"
	PayloadTooLarge      = "payload_too_large"
	RequestTimeout       = "request_timeout"
	NotFound             = "not_found"
	MethodNotAllowed     = "method_not_allowed"
	UpstreamUnavailable  = "upstream_unavailable"
	UpstreamTimeout      = "upstream_timeout"
	RateLimited          = "rate_limited"
	LimiterUnavailable   = "limiter_unavailable"
	Forbidden            = "forbidden"
	AuthUnavailable      = "auth_unavailable"
	TooManyAuthFailures  = "too_many_auth_failures"
	UpgradeNotSupported  = "upgrade_not_supported"
	KeyExpired           = "key_expired"
	OutOfScope           = "out_of_scope"
)

// Body keeps the platform's own shape, {"error": "..."}, which existing clients (and the
// browser chat hook, which shows it to the user) read, plus a stable code.
type Body struct {
	Error      string `json:"error"`
	Code       string `json:"code"`
	Field      string `json:"field,omitempty"`
	Limit      string `json:"limit,omitempty"`
	RetryAfter *int64 `json:"retry_after,omitempty"`
}

// Write is the one place the gateway writes an error of its own.
func Write(w http.ResponseWriter, status int, body Body) {
	data, err := json.Marshal(body)
	if err != nil { // cannot happen for this struct; keep the answer well-formed anyway
		data = []byte(`{"error":"Internal error.","code":"internal"}`)
	}
	WriteJSON(w, status, data)
}

// WriteJSON answers status with data, a JSON document, and a final newline: never cached,
// never sniffed.
func WriteJSON(w http.ResponseWriter, status int, data []byte) {
	h := w.Header()
	h.Set("Content-Type", "application/json; charset=utf-8")
	h.Set("Content-Length", strconv.Itoa(len(data)+1))
	h.Set("Cache-Control", "no-store")
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(append(data, '\n'))
}
