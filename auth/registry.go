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
	// List returns every entry, sorted by Created then Digest.
	List(ctx context.Context) ([]Entry, error)
	Close() error
}

// ErrUnknownKey is returned by Revoke for a digest that is not registered.
var ErrUnknownKey = errors.New("auth: unknown key")

// ErrRevoked is returned by Add for a digest that was revoked: a revoked key stays revoked
// (a leaked key must not come back by a re-registration); issue a new key instead.
var ErrRevoked = errors.New("auth: the key was revoked; revoked keys stay revoked, register a new key")

// Limits on entry fields, so a registry entry stays small.
const (
	maxNameLen = 200 // org, plan, label, one project or domain
	maxGrants  = 1000
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

// Active reports whether the key works now: never revoked, or revoked at a time still to
// come (a keys file may schedule a revocation, for example revoked: 2026-12-31).
func (e *Entry) Active() bool {
	return e.Revoked == nil || time.Now().Before(*e.Revoked)
}

// clone returns a copy sharing nothing mutable with e.
func (e Entry) clone() Entry {
	e.Projects = slices.Clone(e.Projects)
	e.Domains = slices.Clone(e.Domains)
	if e.Revoked != nil {
		r := *e.Revoked
		e.Revoked = &r
	}
	return e
}

// normalize fills Created and returns a private copy, times in UTC.
func (e Entry) normalize(now time.Time) Entry {
	e = e.clone()
	if e.Created.IsZero() {
		e.Created = now
	}
	e.Created = e.Created.UTC().Round(0)
	if e.Revoked != nil {
		*e.Revoked = e.Revoked.UTC().Round(0)
	}
	return e
}

// updating returns e as an update of the registered entry old: the times e leaves unset are
// old's.
func (e Entry) updating(old Entry) Entry {
	if e.Created.IsZero() {
		e.Created = old.Created
	}
	if e.Revoked == nil && old.Revoked != nil {
		r := *old.Revoked
		e.Revoked = &r
	}
	return e
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
