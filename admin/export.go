package admin

import (
	"bufio"
	"context"
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/docsgate/gateway/limits"
)

// GET /usage/export costs the store: the Redis store builds a sorted set of every tenant of
// the window (about 120 bytes each) and holds it until the answer ends. So that no client can
// pile these up:
//
//   - one replica runs at most MaxExports exports at once; beyond, 429 too_many_exports with
//     Retry-After, before the store is read;
//   - every write of the answer has a deadline (ExportWriteTimeout, refreshed before each
//     chunk): a client that stops reading is cut off then, instead of holding its set for as
//     long as it keeps the connection open;
//   - the listing is closed (its set deleted, on a context of its own with a bounded time)
//     whenever the answer ends: complete, cut short by a failing store or a write that
//     failed or timed out, or a client gone.

// Defaults of the export bounds (Options.MaxExports, Options.ExportWriteTimeout).
const (
	DefaultMaxExports         = 2
	DefaultExportWriteTimeout = 10 * time.Second
	// exportRetryAfter is what a refused export is told to wait: about the length of a large
	// export (100,000 tenants take a few seconds).
	exportRetryAfter = 5
)

// exportSlots bounds the exports a replica runs at once.
type exportSlots chan struct{}

func newExportSlots(n int) exportSlots {
	if n <= 0 {
		n = DefaultMaxExports
	}
	return make(exportSlots, n)
}

// take takes a slot if one is free; give returns it.
func (s exportSlots) take() bool {
	select {
	case s <- struct{}{}:
		return true
	default:
		return false
	}
}

func (s exportSlots) give() { <-s }

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

// exportDeadline bounds one export, building and download together.
const exportDeadline = limits.ExportTTL * 2 / 3

// export serves GET /usage/export?limit=NAME&window=START[&format=csv|json][&unit=...]. The
// store is read whole first (a failure is a clean 503), then the rows stream out as they are
// written.
func (h *handler) export(w http.ResponseWriter, r *http.Request) {
	p, ferr := params(r, "limit", "window", "format?", "unit?")
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
	if !h.exports.take() {
		writeTooMany(w, "too_many_exports", fmt.Sprintf("Too many exports are running on this replica (at most %d at once). Please retry in %d s.", cap(h.exports), exportRetryAfter), exportRetryAfter)
		return
	}
	defer h.exports.give()
	// Minutes, not the 30 s of other reads: a large export, built on a busy replica or read
	// by a slow client, may rightly take that long. It ends well before its sorted set
	// expires (limits.ExportTTL), so a page is never read from a set that is gone; within it,
	// each store command's own timeout and the write deadline below (a client that stops
	// reading is cut off) bound it too.
	ctx, cancel := context.WithTimeout(r.Context(), exportDeadline)
	defer cancel()
	ex, err := h.o.History.Export(ctx, p["limit"], p["window"], p["unit"])
	if err != nil {
		h.historyFail(w, err, p["limit"])
		return
	}
	// Deferred, so it runs however the answer ends, panic(http.ErrAbortHandler) included.
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
	out := &deadlineWriter{w: w, rc: http.NewResponseController(w), timeout: h.exportWriteTimeout()}
	if format == "json" {
		hd.Set("Content-Type", "application/json; charset=utf-8")
		err = writeExportJSON(out, ex)
	} else {
		// As the issue names it; the text is UTF-8 (RFC 7111 makes charset optional).
		hd.Set("Content-Type", "text/csv")
		err = writeExportCSV(out, ex)
	}
	if err != nil {
		// The status is sent: breaking the connection (no final chunk) is how the client
		// learns the file is incomplete, rather than taking a cut CSV for a whole one.
		h.o.Logger.Warn("usage export cut short", zap.String("limit", ex.Limit), zap.Error(err))
		panic(http.ErrAbortHandler)
	}
}

func (h *handler) exportWriteTimeout() time.Duration {
	if h.o.ExportWriteTimeout > 0 {
		return h.o.ExportWriteTimeout
	}
	return DefaultExportWriteTimeout
}

// deadlineWriter gives each write to the client timeout to complete: a client that accepts no
// byte for that long makes the write fail. Writes arrive a buffer at a time (the CSV writer's
// 4 KiB, or one JSON row), so this is a deadline per chunk, not on the whole answer.
type deadlineWriter struct {
	w       io.Writer
	rc      *http.ResponseController
	timeout time.Duration
}

func (d *deadlineWriter) Write(p []byte) (int, error) {
	// A writer without deadlines (ErrNotSupported) writes without one.
	_ = d.rc.SetWriteDeadline(time.Now().Add(d.timeout))
	return d.w.Write(p)
}

func writeExportCSV(w io.Writer, ex limits.Export) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(exportHeader); err != nil {
		return err
	}
	rec := make([]string, len(exportHeader))
	for row, err := range ex.Rows {
		if err != nil {
			return err
		}
		rec[0], rec[1], rec[2] = inertCell(row.ID), strconv.FormatInt(row.Used, 10), strconv.FormatInt(row.Limit, 10)
		rec[3], rec[4], rec[5] = inertCell(row.Plan), inertCell(row.Label), inertCell(row.Org)
		if err := cw.Write(rec); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// inertCell keeps a text cell of the CSV from being taken for a formula by a spreadsheet
// (OWASP's rule for CSV injection): a cell starting with =, +, -, @, a tab or a carriage
// return gets a ' in front, which spreadsheets show as text and do not display. The counts
// are written as they are (non-negative numbers never start with one of these); the JSON
// export is never changed.
func inertCell(s string) string {
	if s == "" {
		return s
	}
	switch s[0] {
	case '=', '+', '-', '@', '\t', '\r':
		return "'" + s
	}
	return s
}

func writeExportJSON(out io.Writer, ex limits.Export) error {
	w := bufio.NewWriter(out) // one write to the client per 4 KiB, as the CSV writer does
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
	if _, err := w.Write([]byte("]}\n")); err != nil {
		return err
	}
	return w.Flush()
}
