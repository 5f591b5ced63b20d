package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/internal/browsertest"
	"github.com/docsgate/gateway/internal/redistest"
)

// The usage page's keys ending soon, in headless Chromium: a key expiring within the notice
// (used: its last use shows), a key rotated with an overlap (its revocation scheduled, its
// successor named), and neither a key expiring after the notice nor one with no end.
func TestKeysEndingSoonInBrowser(t *testing.T) {
	t.Parallel()
	browser := browsertest.Start(t)
	srv := redistest.Start(t)
	upURL, _ := recordingUpstream(t)
	gw := startGatewayRaw(t, lcConfig(upURL, fmt.Sprintf("redis: {addrs: [%q], timeout: 2s}\n", srv.Addr), "", ""))

	const soon, rotated, later, never = "svc_dsc_pageSoonKey0123456789abcdefgh", "svc_dsc_pageRotatedKey0123456789abcde",
		"svc_dsc_pageLaterKey0123456789abcdefg", "svc_dsc_pageNeverKey0123456789abcdefg"
	in := func(d time.Duration) string { return time.Now().Add(d).UTC().Format(time.RFC3339) }
	for k, extra := range map[string]string{
		soon:    `,"label":"docs widget","expires":"` + in(50*time.Hour) + `"`,
		rotated: `,"label":"search bot"`,
		later:   `,"expires":"` + in(30*24*time.Hour) + `"`,
		never:   ``,
	} {
		lcAdmin(t, gw, "POST", "/keys", `{"key":"`+k+`","kind":"assistant","org":"acme","domains":["acme-docs"]`+extra+`}`, 201)
	}
	if code := statusOf(t, gw, soon); code != 201 {
		t.Fatalf("a request of the key ending soon: %d", code)
	}
	next, _ := apiRotate(t, gw, auth.Digest(rotated), 3*time.Hour)

	creds := &browsertest.Credentials{User: "operator", Password: lcToken}
	page := browser.Open(t, "http://"+gw.admin+"/ui/", creds)
	var rows []string
	page.Eval(t, `Array.from(document.querySelectorAll('section.keys tbody tr')).map(r => r.dataset.key)`, &rows)
	if strings.Join(rows, ",") != auth.Digest(rotated)+","+auth.Digest(soon) {
		t.Fatalf("keys ending soon %v; want the rotated key (3 h) then the expiring one (2 days)", rows)
	}
	if h := page.Text(t, "section.keys h2"); !strings.Contains(h, "within 7d") {
		t.Fatalf("heading %q", h)
	}
	row := func(k string) string {
		return page.Text(t, fmt.Sprintf(`section.keys tr[data-key=%q]`, auth.Digest(k)))
	}
	if r := row(soon); !strings.Contains(r, "docs widget") || !strings.Contains(r, "in 2 days") ||
		!strings.Contains(r, "expiry") || !strings.Contains(r, "s ago") || !strings.Contains(r, "not rotated") {
		t.Fatalf("the key expiring soon: %q", r)
	}
	if r := row(rotated); !strings.Contains(r, "revocation scheduled") || !strings.Contains(r, auth.Digest(next)) || !strings.Contains(r, "never") {
		t.Fatalf("the rotated key: %q", r)
	}
	shot := filepath.Join(t.TempDir(), "keys-ending.png")
	if os.Getenv("UPDATE_SCREENSHOT") == "1" {
		shot = filepath.Join("..", "..", "docs", "usage-page-keys.png")
	}
	page.Screenshot(t, shot)
	if errs := page.Errors(); len(errs) > 0 {
		t.Fatalf("console errors: %v", errs)
	}
}
