package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/internal/browsertest"
	"github.com/docsgate/gateway/internal/redistest"
)

// The usage page as a person meets it: opened in headless Chromium on the admin listener,
// through the browser's Basic auth prompt when admin_token is set, showing the tenants with
// the store's numbers, the 80% and 100% marks, the shadow badge, this replica's refusals per
// limit, a streams limit without a window, token use in one table, "<0.1%" for a tiny use and
// the gateway's state; looking up any tenant (an org, an IP, a key digest) through the usage
// API; refreshing itself in place, with no console error.
func TestUsagePageInBrowser(t *testing.T) {
	t.Parallel()
	browser := browsertest.Start(t)
	up := tokenUpstream(t)
	const token = "ui-admin-token-0123456789"
	const cfg = `
admin_ui_refresh: 1s
orgs:
  acme: {domains: [acme-docs], plan: gold}
  globex: [globex-docs]
  initech: [initech-docs]
plans:
  gold:
    assistant_per_org: {limit: 40}
limits:
  assistant_per_org: {limit: 10, window: hour}
  assistant_per_ip: {limit: 100000, window: day}
  assistant_tokens_per_org: {limit: 2000000, window: month, by: org, unit: tokens, mode: shadow}
  assistant_streams_per_org: {limit: 5, by: org, unit: streams}
routes:
  - name: assistant_message
    limits: [assistant_per_key, assistant_per_org, assistant_per_ip, assistant_tokens_per_org, assistant_streams_per_org]
`
	for _, c := range []struct {
		name  string
		token string
	}{{"basic auth", token}, {"no token", ""}} {
		t.Run(c.name, func(t *testing.T) {
			srv := redistest.Start(t)
			// The page shows exact counts: a 2 s redis.timeout keeps a loaded machine's slow call
			// from turning a counted request into a 503 (the timeout is not what this tests).
			extra := fmt.Sprintf("redis: {addrs: [%q], timeout: 2s}\n", srv.Addr) + cfg
			if c.token != "" {
				extra = fmt.Sprintf("admin_token: %q\n", c.token) + extra
			}
			p := startGateway(t, up, extra)
			ask := func(org, fp string) {
				send(t, p, "POST", "/discovery/v1/assistant/"+org+"-docs/message", "svc_dsc_"+org+"key", `{"fp":"`+fp+`","messages":[]}`)
			}
			for range 10 {
				ask("initech", "plain") // 10 of 10: at the limit
			}
			for range 2 {
				ask("initech", "plain") // refused: 429
			}
			for range 8 {
				ask("globex", "plain") // 8 of 10: near it
			}
			for range 9 {
				ask("acme", "u-1200-3400-1-full") // 9 of 40, and 41,400 tokens
			}

			var creds *browsertest.Credentials
			if c.token != "" {
				// Without credentials the admin listener refuses, and asks browsers for them.
				res, err := http.Get("http://" + p.admin + "/ui/")
				if err != nil {
					t.Fatal(err)
				}
				res.Body.Close()
				if res.StatusCode != 401 || res.Header.Get("WWW-Authenticate") != `Basic realm="gateway"` {
					t.Fatalf("/ui/ without credentials: %d %v", res.StatusCode, res.Header)
				}
				creds = &browsertest.Credentials{User: "operator", Password: c.token}
			}
			// The numbers the page must show are the store's, as the API reads them.
			want := usageTop(t, p, c.token, "assistant_per_org")
			waitFor(t, 5*time.Second, func() bool { return tokensOf(t, p, c.token, "acme") == 41400 })

			page := browser.Open(t, "http://"+p.admin+"/ui/", creds)
			if c.token != "" && page.AuthPrompts() == 0 {
				t.Fatal("the browser was never asked for credentials")
			}
			if c.token == "" && page.AuthPrompts() != 0 {
				t.Fatal("asked for credentials without an admin token")
			}
			row := func(limit, tenant string) string {
				return page.Text(t, fmt.Sprintf(`section.limit[data-limit=%q] tr[data-tenant=%q]`, limit, tenant))
			}
			for _, w := range want {
				text := row("assistant_per_org", w.ID)
				if !strings.Contains(text, fmt.Sprint(w.Used)) || !strings.Contains(text, fmt.Sprint(w.Limit)) {
					t.Fatalf("row of %s shows %q, want used %d of %d", w.ID, text, w.Used, w.Limit)
				}
			}
			if r := row("assistant_per_org", "initech"); !strings.Contains(r, "100.0%") || !strings.Contains(r, "at limit") {
				t.Fatalf("initech (10 of 10) is not marked at the limit: %q", r)
			}
			if r := row("assistant_per_org", "globex"); !strings.Contains(r, "80.0%") || !strings.Contains(r, "≥ 80%") || strings.Contains(r, "at limit") {
				t.Fatalf("globex (8 of 10) is not marked near the limit: %q", r)
			}
			if r := row("assistant_per_org", "acme"); strings.Contains(r, "80%") || strings.Contains(r, "at limit") || !strings.Contains(r, "gold") {
				t.Fatalf("acme (9 of its plan's 40) is marked or lacks its plan: %q", r)
			}
			// Order: highest fraction first.
			var order []string
			page.Eval(t, `Array.from(document.querySelectorAll('section.limit[data-limit="assistant_per_org"] tbody tr')).map(r => r.dataset.tenant)`, &order)
			if strings.Join(order, ",") != "initech,globex,acme" {
				t.Fatalf("order %v", order)
			}
			// Token use is in one table: the tokens limit's own section.
			if tok := row("assistant_tokens_per_org", "acme"); !strings.Contains(tok, "41,400") {
				t.Fatalf("token use of acme: %q", tok)
			}
			var acmeTokenRows, tokenTables int
			page.Eval(t, `document.querySelectorAll('#content tr[data-tenant="acme"]').length`, &acmeTokenRows)
			page.Eval(t, `document.querySelectorAll('#content section[data-limit="assistant_tokens_per_org"] table, table.tokens').length`, &tokenTables)
			if tokenTables != 1 || acmeTokenRows != 2 { // assistant_per_org and the tokens limit (no answer in flight)
				t.Fatalf("%d token tables, acme in %d rows: want 1 table and acme once per by-org limit it uses", tokenTables, acmeTokenRows)
			}
			// The shadow limit says so, in its heading; the enforced ones do not.
			if h := page.Text(t, `section.limit[data-limit="assistant_tokens_per_org"] h2`); !strings.Contains(h, "shadow") {
				t.Fatalf("the shadow limit's heading lacks the badge: %q", h)
			}
			if h := page.Text(t, `section.limit[data-limit="assistant_per_org"] h2`); strings.Contains(h, "shadow") {
				t.Fatalf("an enforced limit's heading shows a shadow badge: %q", h)
			}
			// Refusals: the 2 refused initech requests, counted by this replica in the window.
			if r := page.Text(t, `section.limit[data-limit="assistant_per_org"] p.refusals`); !strings.Contains(r, "Refused on this replica: 2 in the current hour") || !strings.Contains(r, "2 since it started") {
				t.Fatalf("refusals of assistant_per_org: %q", r)
			}
			if r := page.Text(t, `section.limit[data-limit="assistant_tokens_per_org"] p.refusals`); !strings.Contains(r, "Would have refused (shadow) on this replica: 0 in the current month") {
				t.Fatalf("refusals of the shadow limit: %q", r)
			}
			// A streams limit has no window: none in its heading, no Resets column.
			streams := page.Text(t, `section.limit[data-limit="assistant_streams_per_org"]`)
			if !strings.Contains(streams, "streams in flight, by org") || strings.Contains(streams, " per ") || strings.Contains(streams, "window") || strings.Contains(streams, "Resets") {
				t.Fatalf("the streams limit's section: %q", streams)
			}
			// 27 of 100,000 requests from this IP: under 0.1%, not 0.0%.
			if r := page.Text(t, `section.limit[data-limit="assistant_per_ip"] tbody tr`); !strings.Contains(r, "<0.1%") {
				t.Fatalf("a tiny use of assistant_per_ip reads %q, want <0.1%%", r)
			}
			state := page.Text(t, "section.state")
			for _, s := range []string{"v0.0.0-test", "redis", "reachable", "closed"} {
				if !strings.Contains(state, s) {
					t.Fatalf("state %q lacks %q", state, s)
				}
			}
			// The lookup: any tenant, through the usage API, with the page's credentials.
			prompts := page.AuthPrompts()
			lookup := func(by, id, limit string) string {
				page.Run(t,
					chromedp.SetValue(`#lookup select[name="by"]`, by, chromedp.ByQuery),
					chromedp.SetValue(`#lookup input[name="id"]`, id, chromedp.ByQuery),
					chromedp.Click(`#lookup button[type="submit"]`, chromedp.ByQuery),
				)
				sel := fmt.Sprintf(`#lookup-result tr[data-limit=%q]`, limit)
				page.WaitFor(t, fmt.Sprintf(`document.querySelector(%q) !== null && document.querySelector('#lookup-result code').textContent === %q`, sel, id), 10*time.Second)
				return page.Text(t, sel)
			}
			if r := lookup("org", "acme", "assistant_per_org"); !strings.Contains(r, "9") || !strings.Contains(r, "40 requests") {
				t.Fatalf("lookup of acme, assistant_per_org: %q", r)
			}
			if r := page.Text(t, `#lookup-result tr[data-limit="assistant_tokens_per_org"]`); !strings.Contains(r, "41,400") || !strings.Contains(r, "shadow") {
				t.Fatalf("lookup of acme, its tokens: %q", r)
			}
			if r := lookup("org", "umbrella", "assistant_per_org"); !strings.Contains(r, "0.0%") {
				t.Fatalf("lookup of an org with no use: %q", r)
			}
			if r := lookup("ip", "127.0.0.1", "assistant_per_ip"); !strings.Contains(r, "<0.1%") {
				t.Fatalf("lookup of this IP: %q", r)
			}
			if r := lookup("key", auth.Digest("svc_dsc_acmekey"), "assistant_per_key"); !strings.Contains(r, "9") || !strings.Contains(r, "10,000 requests") {
				t.Fatalf("lookup of acme's key digest: %q", r)
			}
			if c.token != "" && page.AuthPrompts() != prompts {
				// The browser answers the API's challenges with the credentials it has.
				t.Fatalf("credential prompts: %d before the lookups, %d after", prompts, page.AuthPrompts())
			}
			shot := filepath.Join(t.TempDir(), "usage-page.png")
			if os.Getenv("UPDATE_SCREENSHOT") == "1" && c.token != "" {
				shot = filepath.Join("..", "..", "docs", "usage-page.png")
			}
			page.Screenshot(t, shot)

			// It refreshes in place: new numbers appear without a page load.
			page.Eval(t, `window.__sameDocument = true`, nil)
			ask("globex", "plain")
			page.WaitFor(t, `document.querySelector('section.limit[data-limit="assistant_per_org"] tr[data-tenant="globex"] td.used').textContent.trim() === "9"`, 10*time.Second)
			var same bool
			page.Eval(t, `window.__sameDocument === true`, &same)
			if !same {
				t.Fatal("the page reloaded instead of refreshing in place")
			}
			if errs := page.Errors(); len(errs) > 0 {
				t.Fatalf("console errors: %v", errs)
			}
			// The API's refusal is shown as it says it, as text.
			page.Run(t,
				chromedp.SetValue(`#lookup select[name="by"]`, "ip", chromedp.ByQuery),
				chromedp.SetValue(`#lookup input[name="id"]`, "<b>nope</b>", chromedp.ByQuery),
				chromedp.Click(`#lookup button[type="submit"]`, chromedp.ByQuery),
			)
			page.WaitFor(t, `document.querySelector('#lookup-result p.error') !== null`, 10*time.Second)
			if e := page.Text(t, `#lookup-result p.error`); !strings.Contains(e, "Not an IP address: <b>nope</b>") {
				t.Fatalf("lookup of a bad IP: %q", e)
			}
			// Chromium logs the 400 itself; nothing else went wrong.
			for _, e := range page.Errors() {
				if !strings.Contains(e, "status of 400") {
					t.Fatalf("console error: %s", e)
				}
			}
		})
	}
}

type topTenantT struct {
	ID    string `json:"id"`
	Used  int64  `json:"used"`
	Limit int64  `json:"limit"`
}

func adminJSON(t *testing.T, p *proc, path, token string, out any) {
	t.Helper()
	code, body := adminGet(t, p, path, token)
	if code != 200 {
		t.Fatalf("%s: %d %s", path, code, body)
	}
	if err := json.Unmarshal([]byte(body), out); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

func usageTop(t *testing.T, p *proc, token, limit string) []topTenantT {
	var out struct {
		Tenants []topTenantT `json:"tenants"`
	}
	adminJSON(t, p, "/usage/top?limit="+limit, token, &out)
	return out.Tenants
}

func tokensOf(t *testing.T, p *proc, token, org string) int64 {
	for _, tn := range usageTop(t, p, token, "assistant_tokens_per_org") {
		if tn.ID == org {
			return tn.Used
		}
	}
	return 0
}

func waitFor(t *testing.T, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in time")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
