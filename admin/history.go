package admin

import (
	"context"
	"errors"
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/docsgate/gateway/limits"
)

// HistoryReader reads the windows the limits keep (proxy.Gateway satisfies it). An unknown
// limit wraps limits.ErrUnknownLimit, a GCRA limit limits.ErrNoHistory, a window not kept
// limits.ErrUnknownWindow; a bad id or window is a *limits.InvalidError naming the field.
type HistoryReader interface {
	// History is a tenant's use of a limit in each kept window, newest first, in unit (""
	// for the limit's own; another reads what it counted before a change of its unit).
	History(ctx context.Context, limit, id, unit string) (limits.TenantHistory, error)
	// Export is every tenant with use of a limit in one window ("current", "previous" or a
	// window's start in RFC 3339), sorted by id, in unit (as History).
	Export(ctx context.Context, limit, window, unit string) (limits.Export, error)
}

type windowJSON struct {
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	Used  int64     `json:"used"`
	Limit int64     `json:"limit"`
	// The current window of the limit's own unit: the allowance in force (as /usage shows
	// it), its grants and the override in force, where there is one.
	Allowance *int64                `json:"allowance,omitempty"`
	Granted   *int64                `json:"granted,omitempty"`
	Override  *limits.OverrideTerms `json:"override,omitempty"`
}

func windowOf(u limits.WindowUse) windowJSON {
	w := windowJSON{Start: u.Start, End: u.End, Used: u.Used, Limit: u.Limit}
	if u.Current {
		w.Allowance, w.Granted, w.Override = &u.Allowance, &u.Granted, u.Override
	}
	return w
}

// history serves GET /usage/history?limit=NAME&id=ID[&unit=requests|tokens].
func (h *handler) history(w http.ResponseWriter, r *http.Request) {
	p, ferr := params(r, "limit", "id", "unit?")
	if ferr != nil {
		writeFieldError(w, ferr)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.o.UsageTimeout)
	defer cancel()
	th, err := h.o.History.History(ctx, p["limit"], p["id"], p["unit"])
	if err != nil {
		h.historyFail(w, err, p["limit"])
		return
	}
	out := struct {
		Limit   string       `json:"limit"`
		ID      string       `json:"id"`
		Unit    string       `json:"unit"`
		Windows []windowJSON `json:"windows"`
	}{Limit: th.Limit, ID: th.ID, Unit: th.Unit, Windows: make([]windowJSON, 0, len(th.Windows))}
	for _, u := range th.Windows {
		out.Windows = append(out.Windows, windowOf(u))
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *handler) historyFail(w http.ResponseWriter, err error, limit string) {
	switch {
	case writeLimitError(w, err, limit):
	case errors.Is(err, limits.ErrNoHistory):
		writeFieldError(w, &fieldError{"limit", "counts with gcra, which has no windows to keep (history counts fixed windows)"})
	case errors.Is(err, limits.ErrUnknownWindow):
		writeError(w, http.StatusNotFound, "unknown_window", "This window is not kept: it ended longer ago than the limit's history, or has not begun. GET /usage/history lists the kept windows.")
	default:
		h.o.Logger.Warn("usage history read failed", zap.String("limit", limit), zap.Error(err))
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "limiter_unavailable", "The limit store is unavailable. Please retry in a moment.")
	}
}

// params reads the query parameters named, each at most once; a name ending in "?" is
// optional, the others are required and not empty.
func params(r *http.Request, names ...string) (map[string]string, *fieldError) {
	q := r.URL.Query()
	out := make(map[string]string, len(names))
	for _, n := range names {
		name := n
		optional := name[len(name)-1] == '?'
		if optional {
			name = name[:len(name)-1]
		}
		v, ok := q[name]
		switch {
		case len(v) > 1:
			return nil, &fieldError{name, "given more than once"}
		case !ok && optional:
			continue
		case !ok || v[0] == "":
			return nil, &fieldError{name, "is required"}
		}
		out[name] = v[0]
	}
	return out, nil
}
