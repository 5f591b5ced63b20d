package admin

import (
	"context"
	"errors"
	"net/url"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/docsgate/gateway/limits"
)

// The usage page's history: for each listed tenant a small bar chart of its kept windows,
// drawn as inline SVG by the template (no script, no external asset), and per limit a link to
// the previous window's export.

// Chart geometry, in SVG user units (the page draws them as CSS pixels).
const (
	chartHeight = 28
	chartWidth  = 120 // about: a window's slot is 3 to 12 wide, a bar and a gap of 1
)

// chartView is one tenant's history as the template draws it, oldest window on the left.
type chartView struct {
	Width, Height int
	Base          int    // the baseline's y: bars stand on it
	Label         string // the whole chart in words, for screen readers
	Bars          []barView
}

type barView struct {
	X, Y, W, H int
	Title      string // the window and its use, shown on hover
	Class      string // "bar", "bar cur" (the current window), "bar over" (at or past the limit)
}

// exportLink is the previous window's export of a limit.
func exportLink(limit string) string {
	return "/usage/export?" + url.Values{"limit": {limit}, "window": {"previous"}}.Encode()
}

// charts reads the history of each tenant listed under v and draws its chart. A tenant whose
// limit keeps no windows (GCRA) has none; a failed read leaves the tenant without one.
func (u *ui) charts(ctx context.Context, v *limitView, kept int) {
	if kept > 0 {
		v.Export = exportLink(v.Name)
	}
	for i := range v.Tenants {
		t := &v.Tenants[i]
		h, err := u.o.History.History(ctx, v.Name, t.ID, "")
		switch {
		case errors.Is(err, limits.ErrNoHistory): // this tenant's plan counts it with gcra
			continue
		case err != nil:
			u.o.Logger.Warn("usage page: reading a tenant's history failed", zap.String("limit", v.Name), zap.Error(err))
			continue
		}
		t.Chart = chart(h, v.Unit)
	}
}

// chart scales the bars to the larger of the limit and the highest use, so a full bar is a
// window spent.
func chart(h limits.TenantHistory, unit string) *chartView {
	n := len(h.Windows)
	top := int64(1)
	for _, w := range h.Windows {
		top = max(top, w.Used, w.Limit)
	}
	slot := min(max(chartWidth/n, 3), 12)
	c := &chartView{Width: n * slot, Height: chartHeight, Base: chartHeight - 1, Bars: make([]barView, n)}
	for i, w := range h.Windows {
		at := n - 1 - i // newest on the right
		hgt := int(min(w.Used, top) * int64(c.Base) / top)
		if w.Used > 0 {
			hgt = max(hgt, 1) // any use shows
		}
		class := "bar"
		switch {
		case w.Limit > 0 && w.Used >= w.Limit:
			class = "bar over"
		case i == 0:
			class = "bar cur"
		}
		c.Bars[at] = barView{
			X: at * slot, Y: c.Base - hgt, W: slot - 1, H: hgt, Class: class,
			Title: w.Start.UTC().Format("2006-01-02 15:04:05") + " UTC: " + thousands(w.Used) + " of " + thousands(w.Limit) + " " + unit,
		}
	}
	c.Label = strconv.Itoa(n) + " windows, newest on the right: " + thousands(h.Windows[0].Used) + " " + unit + " in the current one"
	if n > 1 {
		c.Label += ", " + thousands(h.Windows[1].Used) + " in the previous one"
	}
	return c
}

// historyTimeout bounds the page's history reads, all limits together.
func (u *ui) historyContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, max(u.o.UsageTimeout, time.Second))
}
