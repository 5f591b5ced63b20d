package auth

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

func assistantEntry(key string, domains ...string) Entry {
	return Entry{Digest: Digest(key), Kind: "assistant", Org: "acme", Domains: domains}
}

func adminEntry(key string, projects ...string) Entry {
	return Entry{Digest: Digest(key), Kind: "admin", Org: "acme", Projects: projects}
}

func TestEntryValidate(t *testing.T) {
	ok := []Entry{
		assistantEntry("svc_dsc_a", "acme-docs"),
		assistantEntry("svc_dsc_a", "*"),
		adminEntry("svc_a", "p1", "p2"),
		{Digest: Digest("svc_x"), Kind: "admin", Org: "acme", Projects: []string{"*"}, Plan: "enterprise", Label: "CI"},
	}
	for i, e := range ok {
		if err := e.Validate(); err != nil {
			t.Errorf("ok[%d]: %v", i, err)
		}
	}
	bad := []struct {
		e    Entry
		want string
	}{
		{Entry{Digest: "abc", Kind: "admin", Org: "o", Projects: []string{"p"}}, "digest"},
		{Entry{Digest: strings.ToUpper(Digest("svc_a")), Kind: "admin", Org: "o", Projects: []string{"p"}}, "digest"},
		{Entry{Digest: "svc_dsc_secretsecret", Kind: "assistant", Org: "o", Domains: []string{"d"}}, "raw key"},
		{Entry{Digest: Digest("svc_a"), Kind: "root", Org: "o", Projects: []string{"p"}}, "kind"},
		{Entry{Digest: Digest("svc_a"), Kind: "admin", Org: " ", Projects: []string{"p"}}, "org"},
		{Entry{Digest: Digest("svc_a"), Kind: "admin", Org: "o"}, "projects"},
		{Entry{Digest: Digest("svc_a"), Kind: "admin", Org: "o", Projects: []string{"p"}, Domains: []string{"d"}}, "domains"},
		{Entry{Digest: Digest("svc_dsc_a"), Kind: "assistant", Org: "o"}, "domains"},
		{Entry{Digest: Digest("svc_dsc_a"), Kind: "assistant", Org: "o", Domains: []string{"d"}, Projects: []string{"p"}}, "projects"},
		{Entry{Digest: Digest("svc_dsc_a"), Kind: "assistant", Org: "o", Domains: []string{""}}, "domains[0]"},
		{Entry{Digest: Digest("svc_dsc_a"), Kind: "assistant", Org: "o", Domains: []string{"d"}, Label: "svc_dsc_topsecret"}, "label"},
		{Entry{Digest: Digest("svc_dsc_a"), Kind: "assistant", Org: "o", Domains: []string{"d"}, Label: strings.Repeat("x", 201)}, "label"},
	}
	for i, c := range bad {
		err := c.e.Validate()
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("bad[%d]: %v, want an error naming %q", i, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("bad[%d]: error repeats a raw key: %v", i, err)
		}
	}
}

// CheckText refuses, in what is being registered, the format and separator characters that
// Validate lets through (so that entries stored before still load), naming the field.
func TestEntryCheckText(t *testing.T) {
	e := assistantEntry("svc_dsc_a", "acme-docs")
	e.Label = "billing bot, 東京 (prod) =1"
	if err := e.CheckText(); err != nil {
		t.Fatalf("a plain entry: %v", err)
	}
	for _, c := range []struct {
		set  func(*Entry)
		want string
	}{
		{func(e *Entry) { e.Label = "invoice\u202Efdp.exe" }, "label: must not hold control, format or separator characters (U+202E at character 8)"},
		{func(e *Entry) { e.Org = "ac\u200Bme" }, "org: "},
		{func(e *Entry) { e.Plan = "gold\u2028" }, "plan: "},
		{func(e *Entry) { e.Domains = []string{"a", "b\u2066c"} }, "domains[1]: "},
		{func(e *Entry) { e.Label = "c1\u009b" }, "label: "},
	} {
		e := assistantEntry("svc_dsc_a", "acme-docs")
		c.set(&e)
		if err := e.CheckText(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", e, err, c.want)
		}
		if err := e.Validate(); err != nil {
			t.Errorf("%+v: Validate refuses what an older gateway stored: %v", e, err)
		}
	}
}

func TestEntryAllowsActive(t *testing.T) {
	a := assistantEntry("svc_dsc_a", "acme-docs", "acme-blog")
	if !a.Allows("acme-docs") || !a.Allows("acme-blog") || a.Allows("other") || a.Allows("") {
		t.Fatal("assistant grant")
	}
	any := adminEntry("svc_a", "*")
	if !any.Allows("p1") || any.Allows("") {
		t.Fatal("wildcard grant")
	}
	p := adminEntry("svc_a", "p1")
	if !p.Allows("p1") || p.Allows("p2") {
		t.Fatal("admin grant")
	}
	if !p.Active() {
		t.Fatal("active")
	}
	now := time.Now()
	p.Revoked = &now
	if p.Active() {
		t.Fatal("revoked but active")
	}
}

func TestMemoryRegistry(t *testing.T) {
	ctx := context.Background()
	if _, err := NewMemoryRegistry([]Entry{{Digest: "x"}}); err == nil || !strings.Contains(err.Error(), "keys[0]") {
		t.Fatalf("invalid entry accepted: %v", err)
	}
	e1 := adminEntry("svc_one", "p1")
	e1.Created = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	if _, err := NewMemoryRegistry([]Entry{e1, e1}); err == nil {
		t.Fatal("duplicate digest accepted")
	}
	m, err := NewMemoryRegistry([]Entry{e1})
	if err != nil {
		t.Fatal(err)
	}
	testRegistryBasics(t, m)

	// Replace swaps everything; a bad set keeps the current one.
	if err := m.Replace([]Entry{{Digest: "bad"}}); err == nil {
		t.Fatal("bad replace accepted")
	}
	if _, ok, _ := m.Lookup(ctx, e1.Digest); !ok {
		t.Fatal("bad replace changed the set")
	}
	e3 := assistantEntry("svc_dsc_three", "d")
	if err := m.Replace([]Entry{e3}); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := m.Lookup(ctx, e1.Digest); ok {
		t.Fatal("replaced entry still there")
	}
	if got, ok, _ := m.Lookup(ctx, e3.Digest); !ok || got.Created.IsZero() {
		t.Fatalf("replacement: %+v %v", got, ok)
	}
}

// testRegistryBasics runs the Registry contract on r, which holds adminEntry("svc_one") from
// 2025-01-01 and nothing else.
func testRegistryBasics(t *testing.T, r Registry) {
	t.Helper()
	ctx := context.Background()
	one := Digest("svc_one")
	e, ok, err := r.Lookup(ctx, one)
	if err != nil || !ok || e.Kind != "admin" || !e.Active() || !e.Allows("p1") {
		t.Fatalf("lookup one: %+v %v %v", e, ok, err)
	}
	if _, ok, err := r.Lookup(ctx, Digest("svc_unknown")); ok || err != nil {
		t.Fatalf("unknown key: %v %v", ok, err)
	}
	if _, ok, err := r.Lookup(ctx, "not-a-digest"); ok || err != nil {
		t.Fatalf("malformed digest: %v %v", ok, err)
	}
	if err := r.Add(ctx, Entry{Digest: "nope"}); err == nil {
		t.Fatal("invalid entry added")
	}
	two := assistantEntry("svc_dsc_two", "acme-docs")
	two.Label = "docs"
	before := time.Now().Add(-time.Second)
	if err := r.Add(ctx, two); err != nil {
		t.Fatal(err)
	}
	got, ok, err := r.Lookup(ctx, two.Digest)
	if err != nil || !ok || got.Label != "docs" || got.Created.Before(before) || !got.Allows("acme-docs") {
		t.Fatalf("lookup two: %+v %v %v", got, ok, err)
	}
	if err := r.Revoke(ctx, Digest("svc_unknown")); !errors.Is(err, ErrUnknownKey) {
		t.Fatalf("revoke unknown: %v", err)
	}
	if err := r.Revoke(ctx, two.Digest); err != nil {
		t.Fatal(err)
	}
	got, ok, err = r.Lookup(ctx, two.Digest)
	if err != nil || !ok || got.Active() {
		t.Fatalf("revoked lookup: %+v %v %v", got, ok, err)
	}
	first := *got.Revoked
	time.Sleep(5 * time.Millisecond)
	if err := r.Revoke(ctx, two.Digest); err != nil {
		t.Fatal(err)
	}
	got, _, _ = r.Lookup(ctx, two.Digest)
	if !got.Revoked.Equal(first) {
		t.Fatalf("second revoke moved the time: %v -> %v", first, got.Revoked)
	}
	list, err := r.List(ctx)
	if err != nil || len(list) != 2 || list[0].Digest != one || list[1].Digest != two.Digest || list[1].Active() {
		t.Fatalf("list: %+v %v", list, err)
	}
	// List hands out copies.
	list[0].Projects[0] = "changed"
	if e, _, _ := r.Lookup(ctx, one); e.Projects[0] != "p1" {
		t.Fatal("List shares memory with the registry")
	}
	// Add never brings a revoked key back.
	two.Label = "again"
	if err := r.Add(ctx, two); !errors.Is(err, ErrRevoked) {
		t.Fatalf("re-adding a revoked key: %v", err)
	}
	if got, _, _ := r.Lookup(ctx, two.Digest); got.Label == "again" || got.Active() {
		t.Fatalf("the revoked key came back: %+v", got)
	}
	// Add replaces an active entry.
	e = adminEntry("svc_replaced", "p1")
	if err := r.Add(ctx, e); err != nil {
		t.Fatal(err)
	}
	e.Label = "again"
	if err := r.Add(ctx, e); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := r.Lookup(ctx, e.Digest); got.Label != "again" || !got.Active() {
		t.Fatalf("replace: %+v", got)
	}

	// An update keeps the registered entry's times unless it sets them: a scheduled
	// revocation survives a re-registration, and so does the creation time.
	sched := adminEntry("svc_scheduled", "p1")
	sched.Created = time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC)
	revokeAt := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	sched.Revoked = &revokeAt
	if err := r.Add(ctx, sched); err != nil {
		t.Fatal(err)
	}
	update := adminEntry("svc_scheduled", "p1", "p2")
	if err := r.Add(ctx, update); err != nil {
		t.Fatal(err)
	}
	got, _, _ = r.Lookup(ctx, sched.Digest)
	if got.Revoked == nil || !got.Revoked.Equal(revokeAt) || !got.Created.Equal(sched.Created) || !got.Allows("p2") {
		t.Fatalf("update lost the entry's times: %+v, want created %v and revoked %v", got, sched.Created, revokeAt)
	}
	later := revokeAt.Add(time.Hour)
	update.Revoked, update.Created = &later, time.Date(2025, 6, 7, 0, 0, 0, 0, time.UTC)
	if err := r.Add(ctx, update); err != nil {
		t.Fatal(err)
	}
	if got, _, _ = r.Lookup(ctx, sched.Digest); !got.Revoked.Equal(later) || !got.Created.Equal(update.Created) {
		t.Fatalf("an update that sets the times: %+v", got)
	}
	// Revoking a key whose revocation is scheduled revokes it now.
	if err := r.Revoke(ctx, sched.Digest); err != nil {
		t.Fatal(err)
	}
	if got, _, _ = r.Lookup(ctx, sched.Digest); got.Active() || got.Revoked.After(time.Now()) {
		t.Fatalf("revoke left a scheduled revocation in the future: %+v", got)
	}
}
