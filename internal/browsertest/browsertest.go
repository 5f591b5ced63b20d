// Package browsertest opens pages in a real headless Chromium for tests.
//
// Browsertest opens pages in a real headless Chromium (Debian's chromium package)
// for tests, driven over the DevTools protocol with chromedp: what a person sees, the
// console errors a page raises, HTTP Basic auth answered as a person would at the browser's
// prompt, and screenshots.
package browsertest

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"
)

// chromiumPath finds the browser; CHROMIUM overrides.
func chromiumPath() string {
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// Browser is one headless Chromium for a test, stopped at its cleanup.
type Browser struct {
	ctx context.Context
}

// Start starts Chromium. Without it the test is skipped, except in CI (CI=true), where a
// missing browser fails the test: the suite's install step (scripts/test-deps.sh) must
// have put it there.
func Start(t *testing.T) *Browser {
	t.Helper()
	path := chromiumPath()
	if path == "" {
		if os.Getenv("CI") == "true" {
			t.Fatal("chromium not found: scripts/test-deps.sh installs it (apt-get install chromium)")
		}
		t.Skip("chromium not found: install it with `apt-get install chromium` (or run `make test`, which does)")
	}
	// Not t.TempDir: Chromium may still write its profile while the test's own cleanup runs.
	profile, err := os.MkdirTemp("", "browsertest-profile-")
	if err != nil {
		t.Fatal(err)
	}
	// As root and on a machine without a network, Chromium needs these: no sandbox (root), no
	// background connections (they would be refused, many at a time), a fresh profile.
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.UserDataDir(profile),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1280, 900),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	cleanProfile := func() { _ = os.RemoveAll(profile) }
	ctx, cancel := chromedp.NewContext(actx)
	if err := chromedp.Run(ctx); err != nil { // starts the browser
		cancel()
		cancelAlloc()
		cleanProfile()
		t.Fatalf("browsertest: start %s: %v", path, err)
	}
	t.Cleanup(func() {
		cancel() // closes the browser and waits for it
		cancelAlloc()
		cleanProfile()
	})
	return &Browser{ctx: ctx}
}

// Page is one tab.
type Page struct {
	ctx    context.Context
	mu     sync.Mutex
	errors []string
	auths  int
}

// Credentials answer the browser's HTTP Basic auth prompt, as a person typing them would.
type Credentials struct {
	User, Password string
}

// Open opens url in a new tab and waits until it has loaded. With creds, every Basic auth
// challenge of the page is answered with them (nil leaves challenges unanswered: the browser
// then shows the 401 answer). Console errors, uncaught exceptions and failed loads are
// collected from the start.
func (b *Browser) Open(t *testing.T, url string, creds *Credentials) *Page {
	t.Helper()
	ctx, cancel := chromedp.NewContext(b.ctx)
	t.Cleanup(cancel)
	p := &Page{ctx: ctx}
	chromedp.ListenTarget(ctx, func(ev any) {
		switch e := ev.(type) {
		case *runtime.EventConsoleAPICalled:
			if e.Type == runtime.APITypeError || e.Type == runtime.APITypeAssert {
				var parts []string
				for _, a := range e.Args {
					parts = append(parts, string(a.Value)+a.Description)
				}
				p.addError("console." + string(e.Type) + ": " + strings.Join(parts, " "))
			}
		case *runtime.EventExceptionThrown:
			p.addError("exception: " + e.ExceptionDetails.Text + " " + exceptionText(e.ExceptionDetails))
		case *log.EventEntryAdded:
			if e.Entry.Level == log.LevelError {
				p.addError("log: " + e.Entry.Text + " " + e.Entry.URL)
			}
		case *fetch.EventAuthRequired:
			p.mu.Lock()
			p.auths++
			p.mu.Unlock()
			resp := &fetch.AuthChallengeResponse{Response: fetch.AuthChallengeResponseResponseCancelAuth}
			if creds != nil {
				resp = &fetch.AuthChallengeResponse{Response: fetch.AuthChallengeResponseResponseProvideCredentials, Username: creds.User, Password: creds.Password}
			}
			go func() { _ = chromedp.Run(ctx, fetch.ContinueWithAuth(e.RequestID, resp)) }()
		case *fetch.EventRequestPaused:
			go func() { _ = chromedp.Run(ctx, fetch.ContinueRequest(e.RequestID)) }()
		}
	})
	// The first Run on a tab's context creates the tab and ties it to that context: run it on
	// ctx itself, so the timeout below bounds the loading only, not the tab's life.
	if err := chromedp.Run(ctx); err != nil {
		t.Fatalf("browsertest: new tab: %v", err)
	}
	tctx, tcancel := context.WithTimeout(ctx, 30*time.Second)
	defer tcancel()
	err := chromedp.Run(tctx,
		log.Enable(),
		runtime.Enable(),
		network.Enable(),
		fetch.Enable().WithHandleAuthRequests(true),
		chromedp.Navigate(url),
		chromedp.WaitReady("body"),
	)
	if err != nil {
		t.Fatalf("browsertest: open %s: %v", url, err)
	}
	return p
}

func exceptionText(d *runtime.ExceptionDetails) string {
	if d.Exception != nil {
		return d.Exception.Description
	}
	return ""
}

func (p *Page) addError(s string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.errors = append(p.errors, s)
}

// Errors are the console errors, exceptions and failed loads seen so far.
func (p *Page) Errors() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.errors...)
}

// AuthPrompts is how many times the browser was asked for credentials.
func (p *Page) AuthPrompts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.auths
}

// Run runs chromedp actions on the page, bounded by 30 s.
func (p *Page) Run(t *testing.T, actions ...chromedp.Action) {
	t.Helper()
	ctx, cancel := context.WithTimeout(p.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Run(ctx, actions...); err != nil {
		t.Fatalf("browsertest: %v", err)
	}
}

// Text is the visible text of the first element matching the CSS selector.
func (p *Page) Text(t *testing.T, selector string) string {
	t.Helper()
	// One evaluation finds the element and reads its text, as chromedp.Text does (innerText of
	// a visible element): a page that refreshes itself in place replaces its nodes, and a node
	// looked up first and read in a second call can be gone by then ("No node with given id").
	sel, err := json.Marshal(selector)
	if err != nil {
		t.Fatal(err)
	}
	visible := fmt.Sprintf(`(e => e !== null && !!(e.offsetWidth || e.offsetHeight || e.getClientRects().length))(document.querySelector(%s))`, sel)
	p.WaitFor(t, visible, 10*time.Second)
	var s string
	p.Eval(t, fmt.Sprintf(`(e => e === null ? "" : e.innerText)(document.querySelector(%s))`, sel), &s)
	return s
}

// Eval evaluates a JavaScript expression in the page into out.
func (p *Page) Eval(t *testing.T, expr string, out any) {
	t.Helper()
	p.Run(t, chromedp.Evaluate(expr, out))
}

// Screenshot writes a PNG of the whole page to path.
func (p *Page) Screenshot(t *testing.T, path string) {
	t.Helper()
	var png []byte
	p.Run(t, chromedp.FullScreenshot(&png, 100))
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
}

// WaitFor polls a JavaScript boolean expression until it is true or within passes.
func (p *Page) WaitFor(t *testing.T, expr string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		var ok bool
		p.Eval(t, expr, &ok)
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("browsertest: %s still false after %v", expr, within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// String is a helper for messages.
func (p *Page) String() string { return fmt.Sprintf("page with %d errors", len(p.Errors())) }
