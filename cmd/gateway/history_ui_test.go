package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/docsgate/gateway/internal/browsertest"
	"github.com/docsgate/gateway/internal/redistest"
)

// The usage page in Chromium shows each listed tenant's kept windows as an inline-SVG chart
// drawn by the server (bars of the store's numbers, the current window on the right), links
// to the previous window's export (which the browser downloads with the page's credentials),
// and logs no console error.
func TestUsageHistoryChartInBrowser(t *testing.T) {
	// Not parallel: the page, its checks, a screenshot and the export's fetch must all fit in
	// one 3 s window (inWindow), with a browser of its own.
	browser := browsertest.Start(t)
	const token = "ui-admin-token-0123456789"
	srv := redistest.Start(t)
	// Exact counts per window: a 2 s redis.timeout keeps a loaded machine's slow call from
	// turning a counted job into a 503 (the timeout is not what this tests).
	p := startGateway(t, tokenUpstream(t), fmt.Sprintf(`admin_token: %q
redis: {addrs: [%q], timeout: 2s}
limits:
  agent_job_per_project: {limit: 10, window: 3s, history: 4}
`, token, srv.Addr))
	jobs := func(project string, n int) {
		t.Helper()
		for range n {
			if res := send(t, p, "POST", "/v2/agent/"+project+"/job", "svc_a", `{"prompt":"x"}`); res.StatusCode != 201 {
				t.Fatalf("job %s: %d", project, res.StatusCode)
			}
		}
	}
	w0 := windowStartAfter(t, time.Time{})
	jobs("p1", 6)
	jobs("p2", 2)
	inWindow(t, w0)
	w1 := windowStartAfter(t, w0)
	jobs("p1", 3)
	jobs("p2", 10) // at its limit: a red bar

	page := browser.Open(t, "http://"+p.admin+"/ui/", &browsertest.Credentials{User: "operator", Password: token})
	type bar struct {
		H     int    `json:"h"`
		Class string `json:"class"`
		Title string `json:"title"`
	}
	bars := func(tenant string) []bar {
		var out []bar
		page.Eval(t, fmt.Sprintf(`Array.from(document.querySelectorAll('section.limit[data-limit="agent_job_per_project"] tr[data-tenant=%q] svg.chart rect.bar')).map(r => ({h: r.height.baseVal.value, class: r.getAttribute("class"), title: r.querySelector("title").textContent}))`, tenant), &out)
		return out
	}
	when := func(k int) string {
		return w1.Add(-historyWindow*4+historyWindow*time.Duration(k)).Format("2006-01-02 15:04:05") + " UTC: "
	}
	// 5 windows (the current and 4 kept), oldest first; 27 units high for the limit of 10.
	want := map[string][]bar{
		"p1": {{0, "bar", when(0) + "0 of 10 requests"}, {0, "bar", when(1) + "0 of 10 requests"}, {0, "bar", when(2) + "0 of 10 requests"},
			{16, "bar", when(3) + "6 of 10 requests"}, {8, "bar cur", when(4) + "3 of 10 requests"}},
		"p2": {{0, "bar", when(0) + "0 of 10 requests"}, {0, "bar", when(1) + "0 of 10 requests"}, {0, "bar", when(2) + "0 of 10 requests"},
			{5, "bar", when(3) + "2 of 10 requests"}, {27, "bar over", when(4) + "10 of 10 requests"}},
	}
	for tenant, w := range want {
		if got := bars(tenant); fmt.Sprint(got) != fmt.Sprint(w) {
			t.Errorf("chart of %s:\n got %+v\nwant %+v", tenant, got, w)
		}
	}
	var label string
	page.Eval(t, `document.querySelector('tr[data-tenant="p1"] svg.chart').getAttribute("aria-label")`, &label)
	if label != "5 windows, newest on the right: 3 requests in the current one, 6 in the previous one" {
		t.Errorf("chart label %q", label)
	}
	shot := filepath.Join(t.TempDir(), "usage-history.png")
	if os.Getenv("UPDATE_SCREENSHOT") == "1" {
		shot = filepath.Join("..", "..", "docs", "usage-history.png")
	}
	page.Screenshot(t, shot)
	t.Logf("screenshot: %s", shot)

	// The link to the previous window's export, followed with the page's credentials.
	var href string
	page.Eval(t, `document.querySelector('section.limit[data-limit="agent_job_per_project"] p.export a').getAttribute("href")`, &href)
	if href != "/usage/export?limit=agent_job_per_project&window=previous" {
		t.Fatalf("export link %q", href)
	}
	var got struct {
		Status int    `json:"status"`
		Type   string `json:"type"`
		Body   string `json:"body"`
	}
	page.Run(t, chromedp.Evaluate(`fetch(document.querySelector('p.export a').href, {credentials: "same-origin"}).then(async r => ({status: r.status, type: r.headers.get("content-type"), body: await r.text()}))`, &got,
		func(p *runtime.EvaluateParams) *runtime.EvaluateParams { return p.WithAwaitPromise(true) }))
	if got.Status != 200 || !strings.HasPrefix(got.Type, "text/csv") || got.Body != "id,used,limit,plan,label,org\np1,6,10,,,\np2,2,10,,,\n" {
		t.Errorf("the export link answered %+v", got)
	}
	inWindow(t, w1)
	if errs := page.Errors(); len(errs) > 0 {
		t.Fatalf("console errors: %v", errs)
	}
}
