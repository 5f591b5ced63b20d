package admin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"go.uber.org/zap"

	"github.com/docsgate/gateway/internal/freetext"
	"github.com/docsgate/gateway/limits"
)

// QuotaManager changes tenants' quotas at run time and keeps the audit trail
// (proxy.Gateway satisfies it). An unknown limit wraps limits.ErrUnknownLimit; a value it
// refuses is a *limits.InvalidError naming the field.
type QuotaManager interface {
	Grant(ctx context.Context, limit, id string, amount int64, who limits.Who) (limits.Grant, limits.AuditEntry, error)
	SetOverride(ctx context.Context, limit, id string, value int64, expires time.Time, who limits.Who) (limits.Override, limits.AuditEntry, error)
	EndOverride(ctx context.Context, limit, id string, who limits.Who) (limits.AuditEntry, error)
	Reset(ctx context.Context, limit, id string, who limits.Who) (limits.AuditEntry, error)
	Overrides(ctx context.Context) ([]limits.Override, error)
	Audit(ctx context.Context, n int) ([]limits.AuditEntry, error)
}

// The /quota endpoints (Handler registers the writes behind the write rules of protect.go):
//
//	POST   /quota/grants                     {"limit", "id", "amount", "reason"} -> 201 {"limit", "id", "granted", "window_end"}
//	PUT    /quota/overrides/{limit}/{id}     {"limit": N, "expires" | "ttl", "reason"} -> 200 the override
//	DELETE /quota/overrides/{limit}/{id}     ?reason= or {"reason"} -> 200 the audit entry; 404 unknown_override
//	GET    /quota/overrides                  -> {"overrides": [...]}
//	POST   /quota/resets                     {"limit", "id", "reason"} -> 200 the audit entry
//	GET    /quota/audit?n=100                -> {"entries": [...]}, newest first
//
// Every refusal has the admin error shape; a bad or missing field is 400 invalid_request
// with "field" naming it.
type quotas struct {
	qm      QuotaManager
	timeout time.Duration
	log     *zap.Logger
}

// Bounds of the quota requests.
const (
	maxQuotaBody  = 16 << 10
	reasonMax     = 500 // characters
	limitNameMax  = 64  // as the config allows
	auditDefaultN = 100
	auditMaxN     = 10_000
	// overrideMaxYears is how far ahead an override may end.
	overrideMaxYears = 1
)

// fieldError is a bad or missing field of a request.
type fieldError struct{ field, msg string }

func (e *fieldError) Error() string { return e.field + ": " + e.msg }

func writeFieldError(w http.ResponseWriter, e *fieldError) {
	noteCode(w, "invalid_request")
	writeJSON(w, http.StatusBadRequest, map[string]string{
		"error": "Invalid " + strconv.Quote(e.field) + ": " + e.msg + ".",
		"code":  "invalid_request",
		"field": e.field,
	})
}

// decodeBody decodes one JSON object into v, strictly (readJSONBody), of at most
// maxQuotaBody bytes.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) *fieldError {
	return readJSONBody(w, r, v, maxQuotaBody)
}

// decodeError is the fieldError of a failed Decode of a request's body; nil for nil.
func decodeError(err error) *fieldError {
	var typeErr *json.UnmarshalTypeError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &typeErr) && typeErr.Field != "":
		// The last part of the path: fields of embedded structs are named by it.
		field := typeErr.Field[strings.LastIndexByte(typeErr.Field, '.')+1:]
		return &fieldError{field, "want " + jsonKind(typeErr.Type.Kind().String())}
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name, _ := strconv.Unquote(strings.TrimPrefix(err.Error(), "json: unknown field "))
		return &fieldError{clipField(name), "not a field of this request"}
	}
	return &fieldError{"body", "not a JSON object"}
}

func jsonKind(goKind string) string {
	switch goKind {
	case "int64":
		return "a whole number"
	case "string":
		return "a string"
	case "slice":
		return "an array"
	}
	return goKind
}

// clipField keeps a client's field name fit for a message.
func clipField(s string) string {
	s = sanitize(s)
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// sanitize makes client text safe to keep and show: valid UTF-8, none of the characters
// freetext refuses (controls, format and separator characters).
func sanitize(s string) string {
	return freetext.Clean(s)
}

// checkReason: 1 to 500 characters, something besides spaces, none of the characters
// freetext refuses: a newline would let a reason forge lines wherever it is printed, a bidi
// override (U+202E) make it read backwards, a zero-width character hide text.
func checkReason(s *string) *fieldError {
	switch {
	case s == nil:
		return &fieldError{"reason", "required: say why (1 to 500 characters)"}
	case strings.TrimSpace(*s) == "":
		return &fieldError{"reason", "must say why: 1 to 500 characters, not only spaces"}
	case utf8.RuneCountInString(*s) > reasonMax:
		return &fieldError{"reason", fmt.Sprintf("at most %d characters", reasonMax)}
	}
	if err := freetext.Check(*s); err != nil {
		return &fieldError{"reason", err.Error()}
	}
	return nil
}

func checkName(field string, s *string) *fieldError {
	switch {
	case s == nil || *s == "":
		return &fieldError{field, "required"}
	case len(*s) > limitNameMax && field == "limit":
		return &fieldError{field, "not a limit's name"}
	}
	return nil
}

// writeLimitError answers the refusals every limit-naming endpoint shares (an unknown limit
// 404 unknown_limit, a bad field 400 invalid_request) and reports whether err was one.
func writeLimitError(w http.ResponseWriter, err error, limit string) bool {
	var invalid *limits.InvalidError
	switch {
	case errors.Is(err, limits.ErrUnknownLimit):
		writeError(w, http.StatusNotFound, "unknown_limit", "No enabled limit is named "+strconv.Quote(clip(sanitize(limit)))+" (for this tenant).")
	case errors.As(err, &invalid):
		writeFieldError(w, &fieldError{invalid.Field, invalid.Reason})
	default:
		return false
	}
	return true
}

// who is the request's actor (the Basic-auth user name, or token) and its reason.
func who(r *http.Request, reason string) limits.Who {
	return limits.Who{Actor: actor(r), Reason: reason}
}

// fail answers a manager's error: its status and code, or 503 when the store failed.
func (q quotas) fail(w http.ResponseWriter, err error, limit string) {
	switch {
	case writeLimitError(w, err, limit):
	case errors.Is(err, limits.ErrNoOverride):
		writeError(w, http.StatusNotFound, "unknown_override", "This tenant has no override in force on this limit.")
	default:
		q.log.Warn("quota action failed", zap.Error(err))
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "limiter_unavailable", "The limit store is unavailable. Please retry in a moment.")
	}
}

// done reports whether the action took effect (its audit entry may still be missing: that is
// logged, whole, at error level, and the action answered as done: it must not be repeated).
func (q quotas) done(err error) bool {
	var lost *limits.AuditError
	if errors.As(err, &lost) {
		q.log.Error("quota audit entry lost: the action took effect", zap.Any("entry", lost.Entry), zap.Error(lost.Err))
		return true
	}
	return err == nil
}

// tenantRequest names a tenant's limit and says why.
type tenantRequest struct {
	Limit  *string `json:"limit"`
	ID     *string `json:"id"`
	Reason *string `json:"reason"`
}

// read decodes a body holding t (req embeds it) and checks t's fields; false once it has
// answered.
func (t *tenantRequest) read(w http.ResponseWriter, r *http.Request, req any) bool {
	fe := decodeBody(w, r, req)
	if fe == nil {
		fe = firstOf(checkName("limit", t.Limit), checkName("id", t.ID), checkReason(t.Reason))
	}
	if fe != nil {
		writeFieldError(w, fe)
		return false
	}
	setAuditTarget(r, sanitize(*t.Limit+"/"+*t.ID))
	return true
}

type grantRequest struct {
	tenantRequest
	Amount *int64 `json:"amount"`
}

func (q quotas) grant(w http.ResponseWriter, r *http.Request) {
	var req grantRequest
	if !req.read(w, r, &req) {
		return
	}
	if fe := checkAmount(req.Amount); fe != nil {
		writeFieldError(w, fe)
		return
	}
	q.answer(w, r, *req.Limit, http.StatusCreated, func(ctx context.Context) (any, error) {
		g, e, err := q.qm.Grant(ctx, *req.Limit, *req.ID, *req.Amount, who(r, *req.Reason))
		return map[string]any{"limit": e.Limit, "id": e.ID, "granted": g.Granted, "window_end": g.WindowEnd}, err
	})
}

func checkAmount(n *int64) *fieldError {
	if n == nil || *n < 1 || *n > limits.MaxLimit {
		return &fieldError{"amount", fmt.Sprintf("required: a whole number from 1 to %d", int64(limits.MaxLimit))}
	}
	return nil
}

func firstOf(errs ...*fieldError) *fieldError {
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

type overrideRequest struct {
	Limit   *int64  `json:"limit"`
	Expires *string `json:"expires"`
	TTL     *string `json:"ttl"`
	Reason  *string `json:"reason"`
}

func (q quotas) setOverride(w http.ResponseWriter, r *http.Request) {
	limit, id := r.PathValue("limit"), r.PathValue("id")
	var req overrideRequest
	if fe := decodeBody(w, r, &req); fe != nil {
		writeFieldError(w, fe)
		return
	}
	now := time.Now()
	expires, fe := req.end(now)
	fe = firstOf(checkName("limit", &limit), checkName("id", &id), checkValue(req.Limit), fe, checkReason(req.Reason))
	if fe != nil {
		writeFieldError(w, fe)
		return
	}
	setAuditTarget(r, sanitize(limit+"/"+id))
	q.answer(w, r, limit, http.StatusOK, func(ctx context.Context) (any, error) {
		o, _, err := q.qm.SetOverride(ctx, limit, id, *req.Limit, expires, who(r, *req.Reason))
		return o, err
	})
}

// answer runs a quota action within the timeout and answers its outcome.
func (q quotas) answer(w http.ResponseWriter, r *http.Request, limit string, code int, act func(context.Context) (any, error)) {
	ctx, cancel := context.WithTimeout(r.Context(), q.timeout)
	defer cancel()
	v, err := act(ctx)
	if !q.done(err) {
		q.fail(w, err, limit)
		return
	}
	writeJSON(w, code, v)
}

func checkValue(n *int64) *fieldError {
	if n == nil || *n < 0 || *n > limits.MaxLimit {
		return &fieldError{"limit", fmt.Sprintf("required: the tenant's limit while the override lasts, a whole number from 0 (refuse every request) to %d", int64(limits.MaxLimit))}
	}
	return nil
}

// end is when the override ends: exactly one of expires (RFC 3339, in the future, at most a
// year ahead) or ttl (a duration such as 90m or 1h, at least 1s, at most a year).
func (req *overrideRequest) end(now time.Time) (time.Time, *fieldError) {
	latest := now.AddDate(overrideMaxYears, 0, 0)
	switch {
	case req.Expires != nil && req.TTL != nil:
		return time.Time{}, &fieldError{"ttl", "send expires or ttl, not both"}
	case req.Expires != nil:
		t, err := time.Parse(time.RFC3339, *req.Expires)
		switch {
		case err != nil:
			return time.Time{}, &fieldError{"expires", "want an RFC 3339 time such as 2027-01-02T15:04:05Z"}
		case !t.After(now):
			return time.Time{}, &fieldError{"expires", "must be in the future"}
		case t.After(latest):
			return time.Time{}, &fieldError{"expires", "at most a year ahead"}
		}
		return t.UTC(), nil
	case req.TTL != nil:
		d, err := time.ParseDuration(*req.TTL)
		switch {
		case err != nil:
			return time.Time{}, &fieldError{"ttl", "want a duration such as 30m, 1h or 72h"}
		case d < time.Second:
			return time.Time{}, &fieldError{"ttl", "at least 1s"}
		case now.Add(d).After(latest):
			return time.Time{}, &fieldError{"ttl", "at most a year"}
		}
		return now.Add(d).UTC(), nil
	}
	return time.Time{}, &fieldError{"expires", "required: expires (RFC 3339) or ttl (a duration such as 1h)"}
}

func (q quotas) endOverride(w http.ResponseWriter, r *http.Request) {
	limit, id := r.PathValue("limit"), r.PathValue("id")
	reason, fe := reasonOf(w, r)
	if fe == nil {
		fe = firstOf(checkName("limit", &limit), checkName("id", &id), checkReason(reason))
	}
	if fe != nil {
		writeFieldError(w, fe)
		return
	}
	setAuditTarget(r, sanitize(limit+"/"+id))
	q.answer(w, r, limit, http.StatusOK, func(ctx context.Context) (any, error) {
		return q.qm.EndOverride(ctx, limit, id, who(r, *reason))
	})
}

// reasonOf is DELETE's reason: ?reason= or a JSON body {"reason": ...}, not both.
func reasonOf(w http.ResponseWriter, r *http.Request) (*string, *fieldError) {
	q := r.URL.Query()
	hasBody := r.ContentLength != 0 || len(r.TransferEncoding) > 0
	if vs, ok := q["reason"]; ok {
		if len(vs) != 1 || hasBody {
			return nil, &fieldError{"reason", "send it once: ?reason= or a JSON body"}
		}
		return &vs[0], nil
	}
	if !hasBody {
		return nil, nil
	}
	var body struct {
		Reason *string `json:"reason"`
	}
	if fe := decodeBody(w, r, &body); fe != nil {
		return nil, fe
	}
	return body.Reason, nil
}

func (q quotas) reset(w http.ResponseWriter, r *http.Request) {
	var req tenantRequest
	if !req.read(w, r, &req) {
		return
	}
	q.answer(w, r, *req.Limit, http.StatusOK, func(ctx context.Context) (any, error) {
		return q.qm.Reset(ctx, *req.Limit, *req.ID, who(r, *req.Reason))
	})
}

func (q quotas) overrides(w http.ResponseWriter, r *http.Request) {
	q.answer(w, r, "", http.StatusOK, func(ctx context.Context) (any, error) {
		list, err := q.qm.Overrides(ctx)
		return map[string]any{"overrides": list}, err
	})
}

func (q quotas) audit(w http.ResponseWriter, r *http.Request) {
	n := auditDefaultN
	if vs, ok := r.URL.Query()["n"]; ok {
		var err error
		if len(vs) != 1 {
			err = errors.New("n given twice")
		} else {
			n, err = strconv.Atoi(vs[0])
		}
		if err != nil || n < 1 || n > auditMaxN {
			writeFieldError(w, &fieldError{"n", fmt.Sprintf("a whole number from 1 to %d (default %d)", auditMaxN, auditDefaultN)})
			return
		}
	}
	q.answer(w, r, "", http.StatusOK, func(ctx context.Context) (any, error) {
		entries, err := q.qm.Audit(ctx, n)
		return map[string]any{"entries": entries}, err
	})
}
