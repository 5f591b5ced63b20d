package admin

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/docsgate/gateway/auth"
)

// KeyManager manages registered keys (auth.Registry satisfies it).
type KeyManager interface {
	Add(ctx context.Context, e auth.Entry) error
	Revoke(ctx context.Context, digest string) error
	Rotate(ctx context.Context, old string, next auth.Entry, oldEnds time.Time) (auth.Entry, error)
	List(ctx context.Context) ([]auth.Entry, error)
}

// KeyLastUse reads when each key was last used (auth.LastUse satisfies it).
type KeyLastUse interface {
	Load(ctx context.Context) (map[string]time.Time, error)
}

// keyLookup is used when the manager has it (auth.Registry does) to answer DELETE with the
// entry without listing every key.
type keyLookup interface {
	Lookup(ctx context.Context, digest string) (auth.Entry, bool, error)
}

// maxKeyBody caps POST /keys bodies.
const maxKeyBody = 16 << 10

// The key endpoints (Handler registers them, behind the write rules for POST and DELETE):
//
// POST /keys takes {"key": "<raw key>", "kind", "org", "projects"|"domains", "plan", "label",
// "scopes", "created", "revoked", "expires"} (the key is hashed at once and never stored or
// logged; its family must match kind, and it must be strong: see auth.CheckStrength) or the
// same with "digest" instead of "key", and answers 201 with the entry. DELETE /keys/{digest}
// answers 200 with the revoked entry, 404 not_found for an unknown digest. POST
// /keys/{digest}/rotate (keyrotate.go) issues the key's successor. GET /keys answers
// {"keys": [...]}, each with its last use.
//
// knownPlan, when set, refuses entries naming a plan the running config does not define;
// routeKind, scopes naming no route of the key's kind; lifetime gives each kind's bounds on
// expiry (auth.key_lifetime).
type keys struct {
	km        KeyManager
	knownPlan func(string) bool
	routeKind func(string) (auth.Kind, bool)
	lifetime  func(auth.Kind) auth.Lifetime
	lastUse   KeyLastUse
}

type addKeyRequest struct {
	Key      string   `json:"key"`
	Digest   string   `json:"digest"`
	Kind     string   `json:"kind"`
	Org      string   `json:"org"`
	Projects []string `json:"projects"`
	Domains  []string `json:"domains"`
	Plan     string   `json:"plan"`
	Label    string   `json:"label"`
	Scopes   []string `json:"scopes"`
	// Created, Revoked and Expires, when given, set the entry's times (a revoked time to come
	// schedules the revocation); an update of a registered key keeps the times it does not set.
	// A new key without Expires gets its kind's default lifetime.
	Created *entryTime `json:"created"`
	Revoked *entryTime `json:"revoked"`
	Expires *entryTime `json:"expires"`
}

// entryTime is a date (2027-01-01, midnight UTC) or an RFC 3339 time, as in the keys file.
type entryTime time.Time

func (t *entryTime) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return errors.New("want a date (2027-01-01) or an RFC 3339 time")
	}
	v, err := time.Parse(time.DateOnly, s)
	if err != nil {
		if v, err = time.Parse(time.RFC3339, s); err != nil {
			return errors.New("want a date (2027-01-01) or an RFC 3339 time")
		}
	}
	*t = entryTime(v.UTC())
	return nil
}

func (k keys) add(w http.ResponseWriter, r *http.Request) {
	var req addKeyRequest
	if fe := readJSONBody(w, r, &req, maxKeyBody); fe != nil {
		if fe.twice() {
			writeFieldError(w, fe)
			return
		}
		msg := "Send one JSON object: {\"key\" or \"digest\", \"kind\", \"org\", \"projects\" or \"domains\", \"plan\", \"label\", \"scopes\", \"created\", \"revoked\", \"expires\"} (times as 2027-01-01 or RFC 3339)."
		if strings.HasPrefix(fe.msg, "larger than") {
			msg = "The body is larger than 16 KiB."
		}
		writeError(w, http.StatusBadRequest, "invalid_request", msg)
		return
	}
	kind, ok := auth.ParseKind(req.Kind)
	if !ok {
		writeError(w, http.StatusBadRequest, "invalid_request", `"kind" must be "admin" or "assistant".`)
		return
	}
	switch {
	case req.Key != "" && req.Digest != "":
		writeError(w, http.StatusBadRequest, "invalid_request", `Send "key" or "digest", not both.`)
		return
	case req.Key != "":
		// The key is hashed here and dropped; messages never repeat it.
		id, reason := auth.Check("Bearer "+req.Key, kind)
		strength := auth.CheckStrength(req.Key, kind)
		req.Key = ""
		if reason != 0 {
			msg := "\"key\" is not a valid " + kind.String() + " key."
			if reason == auth.WrongKind {
				msg = "\"key\" is not of kind " + kind.String() + ": its prefix says it belongs to the other key family."
			}
			writeError(w, http.StatusBadRequest, "invalid_request", msg)
			return
		}
		if strength != nil {
			writeError(w, http.StatusBadRequest, "invalid_request", "\"key\": "+strength.Error()+".")
			return
		}
		req.Digest = id.Digest
	case req.Digest == "":
		writeError(w, http.StatusBadRequest, "invalid_request", `Send "key" (the raw key) or "digest" (its SHA-256, 64 lower-case hex characters).`)
		return
	}
	e := auth.Entry{
		Digest:   req.Digest,
		Kind:     kind.String(),
		Org:      req.Org,
		Projects: req.Projects,
		Domains:  req.Domains,
		Plan:     req.Plan,
		Label:    req.Label,
		Scopes:   req.Scopes,
	}
	if req.Created != nil {
		e.Created = time.Time(*req.Created)
	}
	if req.Revoked != nil {
		revoked := time.Time(*req.Revoked)
		e.Revoked = &revoked
	}
	setAuditTarget(r, e.Digest)
	if msg := k.check(&e); msg != "" {
		writeError(w, http.StatusBadRequest, "invalid_request", msg)
		return
	}
	if !k.setExpiry(w, r, &e, req.Expires) {
		return
	}
	if err := k.km.Add(r.Context(), e); err != nil {
		if !inactiveKey(w, err) {
			registryUnavailable(w)
		}
		return
	}
	if got, found, err := k.find(r.Context(), e.Digest); err == nil && found {
		e = got // an update keeps the times it did not set: answer what is registered
	}
	writeJSON(w, http.StatusCreated, e)
}

// check validates an entry to register, its scopes against the running config's routes; it
// returns the message of a 400, "" when the entry is good.
func (k keys) check(e *auth.Entry) string {
	err := e.Validate()
	if err == nil {
		err = e.CheckText()
	}
	if err != nil {
		return "Invalid entry: " + err.Error() + "."
	}
	if e.Plan != "" && k.knownPlan != nil && !k.knownPlan(e.Plan) {
		return "Invalid entry: plan \"" + clip(e.Plan) + "\" is not defined under plans in the config."
	}
	for _, sc := range e.Scopes {
		if k.routeKind == nil {
			break
		}
		if kind, ok := k.routeKind(sc); !ok || kind.String() != e.Kind {
			return "Invalid entry: scopes: \"" + clip(sc) + "\" is not the name of a route of " + e.Kind + " keys in the config."
		}
	}
	return ""
}

// setExpiry sets the expiry of e, to register now: the one asked for, within its kind's
// longest lifetime, else (for a key not registered yet) its kind's default lifetime. It
// answers a 400 and returns false for an expiry refused.
func (k keys) setExpiry(w http.ResponseWriter, r *http.Request, e *auth.Entry, asked *entryTime) bool {
	var want *time.Time
	if asked != nil {
		t := time.Time(*asked)
		want = &t
	} else if _, found, err := k.find(r.Context(), e.Digest); err != nil || found {
		return true // an update keeps the expiry the key has (the registry answers errors)
	}
	var lt auth.Lifetime
	if k.lifetime != nil {
		lt = k.lifetime(mustKind(e.Kind))
	}
	exp, err := lt.Expiry(want, time.Now())
	if err != nil {
		writeFieldError(w, &fieldError{"expires", err.Error()})
		return false
	}
	e.Expires = exp
	return true
}

// inactiveKey answers 409 for a registry's refusal of a revoked or expired key, and reports
// whether err was one.
func inactiveKey(w http.ResponseWriter, err error) bool {
	switch {
	case errors.Is(err, auth.ErrRevoked):
		writeError(w, http.StatusConflict, "key_revoked", "This key was revoked, and revoked keys stay revoked: register a new key.")
	case errors.Is(err, auth.ErrExpired):
		writeError(w, http.StatusConflict, "key_expired", "This key has expired, and expired keys stay expired: register a new key.")
	default:
		return false
	}
	return true
}

func mustKind(s string) auth.Kind {
	k, _ := auth.ParseKind(s)
	return k
}

// pathDigest reads the path's key digest and names it as the audit record's target; a path
// that does not hold one is answered 400.
func pathDigest(w http.ResponseWriter, r *http.Request) (string, bool) {
	digest := r.PathValue("digest")
	if !auth.ValidDigest(digest) {
		setAuditTarget(r, "(not a digest)")
		writeError(w, http.StatusBadRequest, "invalid_request", "Not a key digest: want 64 lower-case hex characters (SHA-256 of the key).")
		return "", false
	}
	setAuditTarget(r, digest)
	return digest, true
}

// unknownDigest answers 404 for a digest no key has.
func unknownDigest(w http.ResponseWriter) {
	writeError(w, http.StatusNotFound, "not_found", "No key with this digest is registered.")
}

func (k keys) revoke(w http.ResponseWriter, r *http.Request) {
	digest, ok := pathDigest(w, r)
	if !ok {
		return
	}
	err := k.km.Revoke(r.Context(), digest)
	if errors.Is(err, auth.ErrUnknownKey) {
		unknownDigest(w)
		return
	}
	if err != nil {
		registryUnavailable(w)
		return
	}
	e, found, err := k.find(r.Context(), digest)
	if err != nil || !found {
		// Revoked, but it cannot be read back right now.
		writeJSON(w, http.StatusOK, map[string]string{"digest": digest, "status": "revoked"})
		return
	}
	writeJSON(w, http.StatusOK, e)
}

func (k keys) find(ctx context.Context, digest string) (auth.Entry, bool, error) {
	if l, ok := k.km.(keyLookup); ok {
		return l.Lookup(ctx, digest)
	}
	list, err := k.km.List(ctx)
	if err != nil {
		return auth.Entry{}, false, err
	}
	for _, e := range list {
		if e.Digest == digest {
			return e, true, nil
		}
	}
	return auth.Entry{}, false, nil
}

func (k keys) list(w http.ResponseWriter, r *http.Request) {
	list, err := k.km.List(r.Context())
	if err != nil {
		registryUnavailable(w)
		return
	}
	if list == nil {
		list = []auth.Entry{}
	}
	if k.lastUse != nil {
		// Without the last uses the list is still worth answering; they show as absent.
		if uses, err := k.lastUse.Load(r.Context()); err == nil {
			list = auth.WithLastUse(list, uses)
		}
	}
	writeJSON(w, http.StatusOK, map[string][]auth.Entry{"keys": list})
}

func registryUnavailable(w http.ResponseWriter) {
	w.Header().Set("Retry-After", "1")
	writeError(w, http.StatusServiceUnavailable, "registry_unavailable", "The key registry is unavailable. Please retry in a moment.")
}
