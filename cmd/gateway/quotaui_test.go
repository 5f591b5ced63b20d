package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/docsgate/gateway/internal/browsertest"
	"github.com/docsgate/gateway/internal/redistest"
)

// The usage page in headless Chromium shows a tenant's allowance with its override and
// grants, the overrides in force and the newest audit entries, with hostile reasons and user
// names as text, and no console error. QUOTA_SCREENSHOT=path keeps the screenshot there.
func TestQuotaPageInBrowser(t *testing.T) {
	t.Parallel()
	awayFromHourEnd(t)
	browser := browsertest.Start(t)
	up, _ := recordingUpstream(t)
	srv := redistest.Start(t)
	// redis.timeout 2s: exact counts are checked, not the timeout (exactTimeout).
	p := startGateway(t, up, fmt.Sprintf("redis: {addrs: [%q], timeout: 2s}\n%s", srv.Addr, quotaCfg))
	jobs(t, p, "acme-site", 2)
	jobs(t, p, "blocked", 1)
	mustStatus(t, quotaAPI(t, p, "alice", "POST", "/quota/grants", `{"limit":"agent_job_per_project","id":"acme-site","amount":1500,"reason":"ticket 4711: launch week"}`), 201)
	mustStatus(t, quotaAPI(t, p, "bob", "PUT", "/quota/overrides/agent_job_per_project/acme-site", `{"limit":10,"ttl":"2h","reason":"incident 93 <b>bold</b>"}`), 200)
	mustStatus(t, quotaAPI(t, p, "<img src=x onerror=alert(1)>", "PUT", "/quota/overrides/agent_job_per_project/blocked", `{"limit":0,"ttl":"30m","reason":"<script>alert(1)</script> scraper"}`), 200)
	mustStatus(t, quotaAPI(t, p, "", "POST", "/quota/resets", `{"limit":"agent_job_per_project","id":"blocked","reason":"client bug"}`), 200)

	page := browser.Open(t, "http://"+p.admin+"/ui/", &browsertest.Credentials{User: "operator", Password: quotaToken})
	row := page.Text(t, `section.limit[data-limit="agent_job_per_project"] tr[data-tenant="acme-site"]`)
	for _, want := range []string{"2", "1,510", "override", "+1,500 granted"} {
		if !strings.Contains(row, want) {
			t.Fatalf("acme-site's row %q lacks %q", row, want)
		}
	}
	var overrides []string
	page.Eval(t, `Array.from(document.querySelectorAll('tr[data-override]')).map(r => r.dataset.override + ": " + r.textContent.replace(/\s+/g, " ").trim())`, &overrides)
	if len(overrides) != 2 || !strings.HasPrefix(overrides[0], "agent_job_per_project/blocked: ") || !strings.Contains(overrides[0], "0: blocked") ||
		!strings.Contains(overrides[0], "<script>alert(1)</script> scraper") || !strings.Contains(overrides[1], "incident 93 <b>bold</b>") || !strings.Contains(overrides[1], "bob") {
		t.Fatalf("overrides on the page: %q", overrides)
	}
	var actions []string
	page.Eval(t, `Array.from(document.querySelectorAll('tr[data-action]')).map(r => r.dataset.action + " " + r.cells[1].textContent)`, &actions)
	if strings.Join(actions, ",") != "reset token,override <img src=x onerror=alert(1)>,override bob,grant alice" {
		t.Fatalf("audit on the page: %q", actions)
	}
	// Hostile text stayed text: no element came of it.
	var injected int
	page.Eval(t, `document.querySelectorAll('main script, main img, main b').length`, &injected)
	if injected != 0 {
		t.Fatalf("%d elements injected by reasons or user names", injected)
	}
	shot := filepath.Join(t.TempDir(), "quota-page.png")
	if path := os.Getenv("QUOTA_SCREENSHOT"); path != "" {
		shot = path
	}
	page.Screenshot(t, shot)
	t.Logf("screenshot: %s", shot)
	if errs := page.Errors(); len(errs) > 0 {
		t.Fatalf("console errors: %v", errs)
	}
}
