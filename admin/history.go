package admin

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/docsgate/gateway/limits"
)

// HistoryReader reads the windows the limits keep (proxy.Gateway satisfies it). An unknown
// limit wraps limits.ErrUnknownLimit, a GCRA limit limits.ErrNoHistory, a window not kept
// limits.ErrUnknownWindow; a bad id or window is a *limits.InvalidError naming the field.
type HistoryReader interface {
	// History is a tenant's use of a limit in each kept window, newest first.
	History(ctx context.Context, limit, id string) (limits.TenantHistory, error)
	// Export is every tenant with use of a limit in one window ("current", "previous" or a
	// window's start in RFC 3339), sorted by id.
	Export(ctx context.Context, limit, window string) (limits.Export, error)
}

type windowJSON struct {
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
	Used  int64     `json:"used"`
	Limit int64     `json:"limit"`
}

// history serves GET /usage/history?limit=NAME&id=ID.
func (h *handler) history(w http.ResponseWriter, r *http.Request) {
	p, ferr := params(r, "limit", "id")
	if ferr != nil {
		writeFieldError(w, ferr)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.o.UsageTimeout)
	defer cancel()
	th, err := h.o.History.History(ctx, p["limit"], p["id"])
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
		out.Windows = append(out.Windows, windowJSON{u.Start, u.End, u.Used, u.Limit})
	}
	writeJSON(w, http.StatusOK, out)
}

// exportHeader is the CSV's first line.
var exportHeader = []string{"id", "used", "limit", "plan", "label", "org"}

type exportRowJSON struct {
	ID    string `json:"id"`
	Used  int64  `json:"used"`
	Limit int64  `json:"limit"`
	Plan  string `json:"plan"`
	Label string `json:"label"`
	Org   string `json:"org"`
}

// export serves GET /usage/export?limit=NAME&window=START[&format=csv|json]. The store is read
// whole first (a failure is a clean 503), then the rows stream out as they are written.
func (h *handler) export(w http.ResponseWriter, r *http.Request) {
	p, ferr := params(r, "limit", "window", "format?")
	if ferr != nil {
		writeFieldError(w, ferr)
		return
	}
	format := p["format"]
	switch format {
	case "":
		format = "csv"
	case "csv", "json":
	default:
		writeFieldError(w, &fieldError{"format", "must be csv (the default) or json"})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.o.TopTimeout)
	defer cancel()
	ex, err := h.o.History.Export(ctx, p["limit"], p["window"])
	if err != nil {
		h.historyFail(w, err, p["limit"])
		return
	}
	defer func() {
		if err := ex.Close(); err != nil {
			h.o.Logger.Warn("usage export: freeing the sorted listing failed (it expires by itself)", zap.Error(err))
		}
	}()
	name := "usage-" + ex.Limit + "-" + ex.Start.UTC().Format("20060102T150405Z") + "." + format
	hd := w.Header()
	hd.Set("Content-Disposition", `attachment; filename="`+name+`"`)
	hd.Set("Cache-Control", "no-store")
	hd.Set("X-Content-Type-Options", "nosniff")
	if format == "json" {
		hd.Set("Content-Type", "application/json; charset=utf-8")
		err = writeExportJSON(w, ex)
	} else {
		// As the issue names it; the text is UTF-8 (RFC 7111 makes charset optional).
		hd.Set("Content-Type", "text/csv")
		err = writeExportCSV(w, ex)
	}
	if err != nil {
		// The status is sent: breaking the connection (no final chunk) is how the client
		// learns the file is incomplete, rather than taking a cut CSV for a whole one.
		h.o.Logger.Warn("usage export cut short", zap.String("limit", ex.Limit), zap.Error(err))
		panic(http.ErrAbortHandler)
	}
}

func writeExportCSV(w http.ResponseWriter, ex limits.Export) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(exportHeader); err != nil {
		return err
	}
	rec := make([]string, len(exportHeader))
	for row, err := range ex.Rows {
		if err != nil {
			return err
		}
		rec[0], rec[1], rec[2] = row.ID, strconv.FormatInt(row.Used, 10), strconv.FormatInt(row.Limit, 10)
		rec[3], rec[4], rec[5] = row.Plan, row.Label, row.Org
		if err := cw.Write(rec); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

func writeExportJSON(w http.ResponseWriter, ex limits.Export) error {
	head, _ := json.Marshal(struct {
		Limit string    `json:"limit"`
		Unit  string    `json:"unit"`
		Start time.Time `json:"start"`
		End   time.Time `json:"end"`
	}{ex.Limit, ex.Unit, ex.Start, ex.End})
	// The head object, reopened to append the tenants array as it streams.
	if _, err := w.Write(append(head[:len(head)-1], `,"tenants":[`...)); err != nil {
		return err
	}
	sep := []byte{}
	for row, err := range ex.Rows {
		if err != nil {
			return err
		}
		b, _ := json.Marshal(exportRowJSON(row))
		if _, err := w.Write(append(sep, b...)); err != nil {
			return err
		}
		sep = []byte{','}
	}
	_, err := w.Write([]byte("]}\n"))
	return err
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
