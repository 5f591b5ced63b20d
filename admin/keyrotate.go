package admin

import (
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/internal/days"
)

// DefaultOverlap is how long a rotated key keeps working beside its successor when the
// rotation names no overlap: a day, for every client to take the new key.
const DefaultOverlap = 24 * time.Hour

// maxOverlap bounds the overlap a rotation may give the old key.
const maxOverlap = 365 * days.Day

// rotateKeyRequest is POST /keys/{digest}/rotate's optional body.
type rotateKeyRequest struct {
	// Overlap is how long the old key keeps working ("24h", "7d"; "0s": it ends now).
	Overlap *string `json:"overlap"`
	// Expires is the new key's expiry; absent: its kind's default lifetime.
	Expires *entryTime `json:"expires"`
}

// rotatedKey is the answer of a rotation: the new key, shown this once, and both entries.
type rotatedKey struct {
	Key      string     `json:"key"`
	Entry    auth.Entry `json:"entry"`
	Previous auth.Entry `json:"previous"`
}

// rotate issues the successor of the key of the path's digest (the same org, grants, plan,
// label and scopes, one tenant with it for every limit that counts by key) and schedules the
// old key's end after the overlap. It answers 201 with the new key, which is never shown
// again.
func (k keys) rotate(w http.ResponseWriter, r *http.Request) {
	digest, ok := pathDigest(w, r)
	if !ok {
		return
	}
	var req rotateKeyRequest
	if r.ContentLength != 0 || len(r.TransferEncoding) > 0 {
		if fe := readJSONBody(w, r, &req, maxKeyBody); fe != nil {
			if fe.twice() {
				writeFieldError(w, fe)
				return
			}
			writeError(w, http.StatusBadRequest, "invalid_request", `Send no body, or one JSON object: {"overlap": "24h", "expires": "2027-01-01"} (both optional).`)
			return
		}
	}
	overlap, fe := parseOverlap(req.Overlap)
	if fe != nil {
		writeFieldError(w, fe)
		return
	}
	old, found, err := k.find(r.Context(), digest)
	if err != nil {
		registryUnavailable(w)
		return
	}
	if !found {
		unknownDigest(w)
		return
	}
	kind := mustKind(old.Kind)
	var want *time.Time
	if req.Expires != nil {
		t := time.Time(*req.Expires)
		want = &t
	}
	now := time.Now()
	var lt auth.Lifetime
	if k.lifetime != nil {
		lt = k.lifetime(kind)
	}
	expires, err := lt.Expiry(want, now)
	if err != nil {
		writeFieldError(w, &fieldError{"expires", err.Error()})
		return
	}
	key, err := auth.Generate(kind)
	if err != nil {
		writeError(w, http.StatusInternalServerError, "internal", "Internal error: no new key could be generated.")
		return
	}
	next := auth.Successor(old, auth.Digest(key), expires)
	prev, err := k.km.Rotate(r.Context(), digest, next, now.Add(overlap))
	if err != nil {
		rotateRefused(w, err)
		return
	}
	if got, ok, err := k.find(r.Context(), next.Digest); err == nil && ok {
		next = got
	}
	writeJSON(w, http.StatusCreated, rotatedKey{Key: key, Entry: next, Previous: prev})
}

// parseOverlap reads a rotation's overlap: absent, DefaultOverlap.
func parseOverlap(s *string) (time.Duration, *fieldError) {
	if s == nil {
		return DefaultOverlap, nil
	}
	d, err := days.Parse(strings.TrimSpace(*s))
	switch {
	case err != nil:
		return 0, &fieldError{"overlap", "want a duration such as 24h or 7d (0s ends the old key now)"}
	case d < 0 || d > maxOverlap:
		return 0, &fieldError{"overlap", "must be between 0s and 365d"}
	}
	return d, nil
}

// rotateRefused answers a registry's refusal of a rotation.
func rotateRefused(w http.ResponseWriter, err error) {
	switch {
	case inactiveKey(w, err):
	case errors.Is(err, auth.ErrUnknownKey):
		unknownDigest(w)
	case errors.Is(err, auth.ErrRotated):
		writeError(w, http.StatusConflict, "key_rotated", "This key was rotated already: rotate the key it was rotated into (its rotated_to).")
	default:
		registryUnavailable(w)
	}
}
