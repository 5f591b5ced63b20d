package auth

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/docsgate/gateway/internal/freetext"
)

// Entry is one registered key. The key itself is never stored: only its SHA-256 digest.
type Entry struct {
	Digest   string     `json:"digest" yaml:"digest"`                         // 64 lower-case hex chars
	Kind     string     `json:"kind" yaml:"kind"`                             // "admin" | "assistant"
	Org      string     `json:"org" yaml:"org"`                               // the tenant the key belongs to
	Projects []string   `json:"projects,omitempty" yaml:"projects,omitempty"` // admin keys: projects it may be used on ("*" = any)
	Domains  []string   `json:"domains,omitempty" yaml:"domains,omitempty"`   // assistant keys: domains it may be used on ("*" = any)
	Plan     string     `json:"plan,omitempty" yaml:"plan,omitempty"`
	Label    string     `json:"label,omitempty" yaml:"label,omitempty"`
	Created  time.Time  `json:"created" yaml:"created"`
	Revoked  *time.Time `json:"revoked,omitempty" yaml:"revoked,omitempty"`
	// Expires, when set, is when the key stops working (a 401 key_expired after it).
	Expires *time.Time `json:"expires,omitempty" yaml:"expires,omitempty"`
	// Scopes are the route names the key may call; none: every route of its kind.
	Scopes []string `json:"scopes,omitempty" yaml:"scopes,omitempty"`
	// Lineage is the digest of the first key of the rotations this key came from (see
	// Rotate), "" for a key that replaces none: the keys of one lineage are one tenant for
	// every limit that counts by key (Tenant).
	Lineage string `json:"lineage,omitempty" yaml:"lineage,omitempty"`
	// Replaces is the digest of the key this one was rotated from; RotatedTo the digest of
	// the key this one was rotated into.
	Replaces  string `json:"replaces,omitempty" yaml:"replaces,omitempty"`
	RotatedTo string `json:"rotated_to,omitempty" yaml:"rotated_to,omitempty"`
	// LastUsed is when the key was last used, to the minute, as a listing reads it from the
	// last-use store (LastUse); never stored with the entry.
	LastUsed *time.Time `json:"last_used,omitempty" yaml:"-"`
}

// Tenant is what the limits that count by key count this key as: its lineage's first digest,
// so that a rotation never resets or splits a per-key budget.
func (e *Entry) Tenant() string {
	if e.Lineage != "" {
		return e.Lineage
	}
	return e.Digest
}

// AllowsRoute reports whether the key may call the route of that name: its scopes name it,
// or it has none.
func (e *Entry) AllowsRoute(route string) bool {
	return len(e.Scopes) == 0 || slices.Contains(e.Scopes, route)
}

// Expired reports whether the key's expiry has passed at now.
func (e *Entry) Expired(now time.Time) bool {
	return e.Expires != nil && !now.Before(*e.Expires)
}

// Revoked reports whether the key's revocation has come at now (a revocation may be
// scheduled: a time still to come).
func (e *Entry) RevokedAt(now time.Time) bool {
	return e.Revoked != nil && !now.Before(*e.Revoked)
}

// Ends is when the key stops working: the earlier of its revocation and its expiry (nil:
// never).
func (e *Entry) Ends() *time.Time {
	switch {
	case e.Revoked == nil:
		return e.Expires
	case e.Expires == nil || e.Revoked.Before(*e.Expires):
		return e.Revoked
	}
	return e.Expires
}

// Registry is what the request path and the managers use.
type Registry interface {
	// Lookup is on the hot path: a local cache answers in steady state (no network round trip).
	// ok=false: unknown key. A revoked entry is returned with ok=true and Active()==false.
	// The returned entry's slices are shared with the registry: do not modify them.
	Lookup(ctx context.Context, digest string) (e Entry, ok bool, err error)
	// Add inserts an entry, or updates a registered one: an update keeps the Created and
	// Revoked times of the registered entry unless e sets them (a scheduled revocation is not
	// lost by a re-registration). Created is set to now for a new entry. A revoked entry is
	// never replaced (ErrRevoked).
	Add(ctx context.Context, e Entry) error
	// Revoke sets Revoked to now (keeping an earlier revocation time); an unknown digest gives
	// ErrUnknownKey.
	Revoke(ctx context.Context, digest string) error
	// Rotate registers next, the successor of the key old (Successor), and schedules old's end
	// at oldEnds (an earlier revocation stays), as one change: both keys work until then, one
	// tenant for the limits that count by key. It refuses an unknown old (ErrUnknownKey), a
	// revoked or expired one (ErrRevoked, ErrExpired), one rotated already (ErrRotated) and a
	// next registered already (ErrKeyExists). It returns old as it now is.
	Rotate(ctx context.Context, old string, next Entry, oldEnds time.Time) (Entry, error)
	// List returns every entry, sorted by Created then Digest.
	List(ctx context.Context) ([]Entry, error)
	Close() error
}

// ErrUnknownKey is returned by Revoke for a digest that is not registered.
var ErrUnknownKey = errors.New("auth: unknown key")

// ErrRevoked is returned by Add for a digest that was revoked: a revoked key stays revoked
// (a leaked key must not come back by a re-registration); issue a new key instead.
var ErrRevoked = errors.New("auth: the key was revoked; revoked keys stay revoked, register a new key")

// ErrExpired is returned by Add for a digest whose expiry has passed, and by Rotate for an
// expired key: an expired key stays expired, like a revoked one.
var ErrExpired = errors.New("auth: the key has expired; expired keys stay expired, register a new key")

// ErrRotated is returned by Rotate for a key already rotated into another: rotate that one.
var ErrRotated = errors.New("auth: the key was already rotated; rotate the key it was rotated into")

// ErrKeyExists is returned by Rotate when the new key's digest is registered already.
var ErrKeyExists = errors.New("auth: the new key's digest is registered already")

// Limits on entry fields, so a registry entry stays small.
const (
	maxNameLen = 200 // org, plan, label, one project or domain
	maxGrants  = 1000
	maxScopes  = 100
)

// ValidDigest reports whether s is a lower-case hex SHA-256 (64 characters), as Digest makes.
func ValidDigest(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// looksLikeKey reports whether s could be a raw key pasted where only metadata belongs.
// Error messages never repeat such a value.
func looksLikeKey(s string) bool {
	return strings.HasPrefix(strings.TrimSpace(s), adminPrefix)
}

// Validate checks the digest format, the kind, a non-empty org and the grants: an admin key
// needs at least one project and no domains, an assistant key at least one domain and no
// projects. It refuses any field that looks like a raw key, without repeating it.
func (e *Entry) Validate() error {
	switch {
	case looksLikeKey(e.Digest):
		return errors.New("digest: this looks like a raw key; register its SHA-256 digest, never the key")
	case !ValidDigest(e.Digest):
		return errors.New("digest: want 64 lower-case hex characters (SHA-256 of the key)")
	}
	kind, ok := ParseKind(e.Kind)
	if !ok {
		return fmt.Errorf("kind: %q is not admin or assistant", clipName(e.Kind))
	}
	for _, f := range []struct{ name, v string }{{"org", e.Org}, {"plan", e.Plan}, {"label", e.Label}} {
		if err := checkName(f.name, f.v, f.name == "org"); err != nil {
			return err
		}
	}
	if err := checkGrants("projects", e.Projects); err != nil {
		return err
	}
	if err := checkGrants("domains", e.Domains); err != nil {
		return err
	}
	if err := checkLifecycle(e); err != nil {
		return err
	}
	switch kind {
	case Admin:
		if len(e.Projects) == 0 {
			return errors.New("projects: an admin key needs at least one project (\"*\" for any)")
		}
		if len(e.Domains) > 0 {
			return errors.New("domains: an admin key has projects, not domains")
		}
	case Assistant:
		if len(e.Domains) == 0 {
			return errors.New("domains: an assistant key needs at least one domain (\"*\" for any)")
		}
		if len(e.Projects) > 0 {
			return errors.New("projects: an assistant key has domains, not projects")
		}
	}
	return nil
}

// checkLifecycle checks the scopes and the lineage's digests.
func checkLifecycle(e *Entry) error {
	if len(e.Scopes) > maxScopes {
		return fmt.Errorf("scopes: more than %d entries", maxScopes)
	}
	for i, sc := range e.Scopes {
		name := fmt.Sprintf("scopes[%d]", i)
		if err := checkName(name, sc, true); err != nil {
			return err
		}
		if strings.ContainsAny(sc, " /") {
			return fmt.Errorf("%s: want a route's name", name)
		}
	}
	for _, f := range []struct{ name, v string }{{"lineage", e.Lineage}, {"replaces", e.Replaces}, {"rotated_to", e.RotatedTo}} {
		if f.v != "" && !ValidDigest(f.v) {
			return fmt.Errorf("%s: want a key's digest (64 lower-case hex characters)", f.name)
		}
	}
	return nil
}

// CheckText refuses, in the free text of an entry being registered (org, plan, label, each
// project and domain), every character freetext refuses: besides the control characters
// Validate refuses, bidi overrides (U+202E), zero-width and other format characters, and
// line and paragraph separators, which would make an export, the page or a listing read as
// something else. Validate does not apply it, so an entry registered before still loads and
// its key keeps working; the admin API and gateway keys add apply it to what they register.
func (e *Entry) CheckText() error {
	fields := []struct{ name, v string }{{"org", e.Org}, {"plan", e.Plan}, {"label", e.Label}}
	for i, v := range e.Projects {
		fields = append(fields, struct{ name, v string }{fmt.Sprintf("projects[%d]", i), v})
	}
	for i, v := range e.Domains {
		fields = append(fields, struct{ name, v string }{fmt.Sprintf("domains[%d]", i), v})
	}
	for _, f := range fields {
		if err := freetext.Check(f.v); err != nil {
			return fmt.Errorf("%s: %w", f.name, err)
		}
	}
	return nil
}

func checkName(field, v string, required bool) error {
	switch {
	case required && strings.TrimSpace(v) == "":
		return fmt.Errorf("%s: required", field)
	case looksLikeKey(v):
		return fmt.Errorf("%s: this looks like a raw key; keys never go into metadata", field)
	case len(v) > maxNameLen:
		return fmt.Errorf("%s: longer than %d bytes", field, maxNameLen)
	case strings.ContainsFunc(v, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return fmt.Errorf("%s: control characters", field)
	}
	return nil
}

func checkGrants(field string, grants []string) error {
	if len(grants) > maxGrants {
		return fmt.Errorf("%s: more than %d entries", field, maxGrants)
	}
	for i, g := range grants {
		name := fmt.Sprintf("%s[%d]", field, i)
		if err := checkName(name, g, true); err != nil {
			return err
		}
		if g != strings.TrimSpace(g) || strings.ContainsAny(g, " /") {
			return fmt.Errorf("%s: spaces or slashes", name)
		}
	}
	return nil
}

func clipName(s string) string {
	if looksLikeKey(s) {
		return "svc_..."
	}
	if len(s) > 32 {
		return s[:32] + "..."
	}
	return s
}

// Allows reports whether the key may be used on resource: a project for an admin key, a
// domain for an assistant key. "*" in the grant matches every resource.
func (e *Entry) Allows(resource string) bool {
	if resource == "" {
		return false
	}
	grants := e.Domains
	if e.Kind == "admin" {
		grants = e.Projects
	}
	for _, g := range grants {
		if g == "*" || g == resource {
			return true
		}
	}
	return false
}

// Active reports whether the key works now: neither revoked nor expired, a revocation or an
// expiry at a time still to come aside (a keys file may schedule one, for example revoked:
// 2026-12-31).
func (e *Entry) Active() bool {
	now := time.Now()
	return !e.RevokedAt(now) && !e.Expired(now)
}

// clone returns a copy sharing nothing mutable with e.
func (e Entry) clone() Entry {
	e.Projects = slices.Clone(e.Projects)
	e.Domains = slices.Clone(e.Domains)
	e.Scopes = slices.Clone(e.Scopes)
	e.Revoked, e.Expires, e.LastUsed = cloneTime(e.Revoked), cloneTime(e.Expires), cloneTime(e.LastUsed)
	return e
}

func cloneTime(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	c := *t
	return &c
}

// normalize fills Created and returns a private copy, times in UTC, without what is never
// stored (LastUsed).
func (e Entry) normalize(now time.Time) Entry {
	e = e.clone()
	if e.Created.IsZero() {
		e.Created = now
	}
	e.Created = e.Created.UTC().Round(0)
	for _, t := range []*time.Time{e.Revoked, e.Expires} {
		if t != nil {
			*t = t.UTC().Round(0)
		}
	}
	e.LastUsed = nil
	return e
}

// updating returns e as an update of the registered entry old: the times and the lineage e
// leaves unset are old's.
func (e Entry) updating(old Entry) Entry {
	if e.Created.IsZero() {
		e.Created = old.Created
	}
	if e.Revoked == nil {
		e.Revoked = cloneTime(old.Revoked)
	}
	if e.Expires == nil {
		e.Expires = cloneTime(old.Expires)
	}
	if e.Lineage == "" && e.Replaces == "" && e.RotatedTo == "" {
		e.Lineage, e.Replaces, e.RotatedTo = old.Lineage, old.Replaces, old.RotatedTo
	}
	return e
}

// inactiveErr is why a registered entry can no longer change: ErrRevoked or ErrExpired; nil
// while it is active.
func inactiveErr(e Entry, now time.Time) error {
	switch {
	case e.RevokedAt(now):
		return ErrRevoked
	case e.Expired(now):
		return ErrExpired
	}
	return nil
}

// Successor is the entry a rotation of old into the key of digest makes: the same org,
// grants, plan, label and scopes, created now, in old's lineage; expires is its expiry (nil:
// none).
func Successor(old Entry, digest string, expires *time.Time) Entry {
	next := old.clone()
	next.Digest, next.Created, next.Revoked, next.Expires = digest, time.Time{}, nil, cloneTime(expires)
	next.Lineage, next.Replaces, next.RotatedTo, next.LastUsed = old.Tenant(), old.Digest, "", nil
	return next
}

// rotation checks that old may be rotated into next at now (active, not rotated into a key
// that exists, next not registered: exists tells) and returns old as the rotation leaves it:
// pointing at next, its end at oldEnds or sooner.
func rotation(old Entry, next Entry, oldEnds time.Time, now time.Time, exists func(digest string) bool) (Entry, error) {
	if err := inactiveErr(old, now); err != nil {
		return Entry{}, err
	}
	if old.RotatedTo != "" && exists(old.RotatedTo) {
		return Entry{}, ErrRotated
	}
	if exists(next.Digest) {
		return Entry{}, ErrKeyExists
	}
	old = old.clone()
	old.RotatedTo = next.Digest
	if old.Revoked == nil || old.Revoked.After(oldEnds) {
		t := oldEnds.UTC().Round(0)
		old.Revoked = &t
	}
	return old, nil
}

// sortEntries orders by Created then Digest.
func sortEntries(es []Entry) {
	slices.SortFunc(es, func(a, b Entry) int {
		if c := a.Created.Compare(b.Created); c != 0 {
			return c
		}
		return strings.Compare(a.Digest, b.Digest)
	})
}

// revokedNow returns e revoked at now, keeping an earlier revocation time (a later, scheduled
// one is brought forward).
func revokedNow(e Entry, now time.Time) Entry {
	if e.Revoked == nil || e.Revoked.After(now) {
		t := now.UTC().Round(0)
		e.Revoked = &t
	}
	return e
}
