package admin

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"html/template"
	"io/fs"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/docsgate/gateway/internal/days"
	"github.com/docsgate/gateway/limits"
	"github.com/docsgate/gateway/notify"
)

// The usage page: one server-rendered page (html/template) with its stylesheet and script
// embedded in the binary, so it works on an air-gapped cluster. It shows the busiest tenants
// of every enabled limit (with its mode and this replica's count of its refusals) and the
// gateway's state, refreshes itself by fetching the page's content again and swapping it in
// (no full-page reload, no flash), and looks one tenant up through the usage API.

//go:embed ui
var uiFiles embed.FS

// State is the gateway's state as the usage page shows it.
type State struct {
	Version string
	// Store is "memory", "redis", "sentinel" or "cluster".
	Store string
	// RedisReachable is whether Redis answered a PING just now (on a Cluster, every master;
	// always true in memory).
	RedisReachable bool
	// OpenBreakers are the Redis nodes (host:port) whose breaker is open: the requests whose
	// limits live on them are answered by redis.on_error without calling them.
	OpenBreakers []string
	// LastReload is when the config was last (re)loaded, and LastReloadError why the last
	// attempt was rejected ("" when it applied).
	LastReload      time.Time
	LastReloadError string
	Started         time.Time
}

// uiTenants is how many tenants of each limit the page lists.
const uiTenants = 10

type ui struct {
	o    Options
	tmpl *template.Template
}

func newUI(o Options) *ui {
	funcs := template.FuncMap{
		"thousands": thousands,
		"when":      func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") },
		"ago":       ago,
		// Free text shown as it prints: entries stored before such characters were refused
		// keep none of them on the page (bidi overrides, zero-width, separators).
		"text":  sanitize,
		"join":  strings.Join,
		"int64": func(n int) int64 { return int64(n) },
		"days":  days.Format,
	}
	return &ui{o: o, tmpl: template.Must(template.New("page.html").Funcs(funcs).ParseFS(uiFiles, "ui/page.html"))}
}

type tenantView struct {
	limits.TopTenant
	Percent     float64    // for the bar, capped at 100
	PercentText string     // "91.2%", "<0.1%"
	Mark        string     // "", "near" (80% or more) or "over" (100% or more)
	Chart       *chartView // its kept windows; nil without history
}

type limitView struct {
	Name, Window, Unit, By string
	Mode                   string // "enforce", "shadow" or "mixed" (shadow in some plans)
	Tenants                []tenantView
	Export                 string // the previous window's export; "" for a limit without history
	Refusals               []refusalView
}

// refusalView is one line of a limit's refusals: those it made, or those it would have made
// in shadow mode.
type refusalView struct {
	Shadow      bool
	InWindow    int64
	Total       int64
	WindowStart time.Time // zero: the limit has no window (streams)
	Since       time.Time // when this replica started counting
}

// refusals is what the page says of a limit's refusals: the refused line of an enforced limit,
// the would-have-refused line of a shadow one, both for a limit in shadow in some plans only.
func refusals(mode string, r limits.Refusals) []refusalView {
	var out []refusalView
	if mode != "shadow" {
		out = append(out, refusalView{InWindow: r.InWindow, Total: r.Total, WindowStart: r.WindowStart, Since: r.Since})
	}
	if mode != "enforce" {
		out = append(out, refusalView{Shadow: true, InWindow: r.ShadowInWindow, Total: r.ShadowTotal, WindowStart: r.WindowStart, Since: r.Since})
	}
	return out
}

// percentText writes a percentage with one decimal; one under 0.1% but not 0 is "<0.1%", so
// that a tenant with some use never reads as none (nor rounds up to 0.1%).
func percentText(pct float64) string {
	if pct > 0 && pct < 0.1 {
		return "<0.1%"
	}
	return strconv.FormatFloat(pct, 'f', 1, 64) + "%"
}

type pageData struct {
	Generated time.Time
	Refresh   int // seconds; 0 never
	State     *State
	Limits    []limitView
	// KeyLimits are the limits that count by key: the tenant lookup reads a key digest's use
	// of each of them.
	KeyLimits []string
	Error     string
	// Quotas is set when run-time quotas are served: the overrides in force and the newest
	// audit entries.
	Quotas *quotaView
	// Notifications is set when notifications are on: the outbox's counts and its dead
	// letters.
	Notifications *notificationsView
	// EndingKeys is set in registry mode: the keys ending within the expiry notice.
	EndingKeys *endingKeysView
}

type notificationsView struct {
	Pending, Dead int
	DeadLetters   []deadLetterView // by when they died, oldest first; at most uiDeadLetters
	More          int              // dead letters not listed
	Error         string
}

type deadLetterView struct {
	notify.Delivery
	// Limit and Tenant are what the event is about, from its data ("" for an event of none).
	Limit, Tenant string
}

func deadLetterOf(d notify.Delivery) deadLetterView {
	var ev struct {
		Data struct {
			Limit  string `json:"limit"`
			Tenant string `json:"tenant"`
		} `json:"data"`
	}
	_ = json.Unmarshal(d.Body, &ev) // an event of another shape shows without them
	return deadLetterView{Delivery: d, Limit: ev.Data.Limit, Tenant: ev.Data.Tenant}
}

// uiDeadLetters is how many dead letters the page lists.
const uiDeadLetters = 20

type quotaView struct {
	Overrides []limits.Override
	Audit     []limits.AuditEntry
	Error     string
}

// uiAudit is how many audit entries the page lists.
const uiAudit = 20

func (u *ui) data(ctx context.Context) pageData {
	d := pageData{Generated: time.Now(), Refresh: int(u.o.UIRefresh / time.Second)}
	if u.o.State != nil {
		st := u.o.State(ctx)
		d.State = &st
	}
	if u.o.Quotas != nil {
		d.Quotas = u.quotas(ctx)
	}
	if u.o.Notifications != nil {
		d.Notifications = u.notifications(ctx)
	}
	if u.o.Keys != nil && u.o.KeyExpiryNotice != nil {
		if notice := u.o.KeyExpiryNotice(); notice > 0 {
			d.EndingKeys = u.endingKeys(ctx, notice)
		}
	}
	tctx, cancel := context.WithTimeout(ctx, u.o.TopTimeout)
	defer cancel()
	lists, err := u.o.Top.Top(tctx, "", uiTenants)
	if err != nil {
		u.o.Logger.Warn("usage page: reading the limit store failed", zap.Error(err))
		d.Error = "The limit store could not be read just now; the page tries again at its next refresh."
		return d
	}
	var hctx context.Context
	if u.o.History != nil {
		var hcancel context.CancelFunc
		hctx, hcancel = u.historyContext(ctx)
		defer hcancel()
	}
	for _, l := range lists {
		v := limitView{Name: l.Limit, Window: l.Window, Unit: l.Unit, By: l.By, Mode: l.Mode, Refusals: refusals(l.Mode, l.Refused)}
		if l.By == "key" {
			d.KeyLimits = append(d.KeyLimits, l.Limit)
		}
		for _, t := range l.Tenants {
			pct := t.Fraction * 100
			tv := tenantView{TopTenant: t, Percent: math.Min(pct, 100), PercentText: percentText(pct)}
			switch {
			case t.Fraction >= 1:
				tv.Mark = "over"
			case t.Fraction >= 0.8:
				tv.Mark = "near"
			}
			v.Tenants = append(v.Tenants, tv)
		}
		if hctx != nil {
			u.charts(hctx, &v, l.History)
		}
		d.Limits = append(d.Limits, v)
	}
	return d
}

// quotas reads the overrides in force and the newest audit entries.
func (u *ui) quotas(ctx context.Context) *quotaView {
	ctx, cancel := context.WithTimeout(ctx, u.o.UsageTimeout)
	defer cancel()
	var v quotaView
	var err error
	if v.Overrides, err = u.o.Quotas.Overrides(ctx); err == nil {
		v.Audit, err = u.o.Quotas.Audit(ctx, uiAudit)
	}
	if err != nil {
		u.o.Logger.Warn("usage page: reading the quota overrides and audit failed", zap.Error(err))
		v.Error = "The overrides and the audit trail could not be read just now; the page tries again at its next refresh."
	}
	return &v
}

// notifications reads the outbox's counts and its first uiDeadLetters dead letters, by when
// they died (the page says how many more GET /notifications lists).
func (u *ui) notifications(ctx context.Context) *notificationsView {
	ctx, cancel := context.WithTimeout(ctx, u.o.UsageTimeout)
	defer cancel()
	var v notificationsView
	var err error
	var ds []notify.Delivery
	if v.Pending, v.Dead, err = u.o.Notifications.Count(ctx); err == nil && v.Dead > 0 {
		ds, err = u.o.Notifications.List(ctx, true, uiDeadLetters)
	}
	if err != nil {
		u.o.Logger.Warn("usage page: reading the notification outbox failed", zap.Error(err))
		v.Error = "The notification outbox could not be read just now; the page tries again at its next refresh."
		return &v
	}
	for _, d := range ds {
		v.DeadLetters = append(v.DeadLetters, deadLetterOf(d))
	}
	v.More = max(v.Dead-len(ds), 0)
	return &v
}

// page serves the whole page, or with ?partial=1 only its content, which the page's script
// swaps in on refresh.
func (u *ui) page(w http.ResponseWriter, r *http.Request) {
	name := "page"
	if r.URL.Query().Get("partial") == "1" {
		name = "content"
	}
	var buf bytes.Buffer
	if err := u.tmpl.ExecuteTemplate(&buf, name, u.data(r.Context())); err != nil {
		u.o.Logger.Error("usage page: render", zap.Error(err))
		writeError(w, http.StatusInternalServerError, "internal", "The usage page could not be rendered.")
		return
	}
	uiHeaders(w.Header())
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = w.Write(buf.Bytes())
}

func (u *ui) assets() http.Handler {
	sub, _ := fs.Sub(uiFiles, "ui") // "ui" is embedded above: cannot fail
	files := http.StripPrefix("/ui/assets/", http.FileServerFS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		uiHeaders(w.Header())
		files.ServeHTTP(w, r)
	})
}

// uiHeaders: nothing but the gateway's own files may run or load, and nothing is cached (the
// page holds tenants' usage).
func uiHeaders(h http.Header) {
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cache-Control", "no-store")
}

// thousands writes n with thin-space-free comma grouping: 12,345,678.
func thousands(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := s[0] == '-'
	if neg {
		s = s[1:]
	}
	var out []byte
	for i := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}

// ago says how far t is from now, in words: "in 42 min", "3 s ago".
func ago(t time.Time) string {
	d := time.Until(t)
	suffix, prefix := "", "in "
	if d < 0 {
		d, suffix, prefix = -d, " ago", ""
	}
	var v string
	switch {
	case d < time.Minute:
		v = strconv.Itoa(int(d/time.Second)) + " s"
	case d < time.Hour:
		v = strconv.Itoa(int(d/time.Minute)) + " min"
	case d < 48*time.Hour:
		v = strconv.Itoa(int(d/time.Hour)) + " h"
	default:
		v = strconv.Itoa(int(d/(24*time.Hour))) + " days"
	}
	return prefix + v + suffix
}
