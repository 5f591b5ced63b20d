package admin

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/docsgate/gateway/limits"
)

// TopReader answers the busiest tenants of the enabled limits.
type TopReader interface {
	// Top returns, for the limit named (every enabled limit when limit is ""), the n tenants
	// with the highest use in the current window, highest fraction first. An unknown name
	// wraps limits.ErrUnknownLimit.
	Top(ctx context.Context, limit string, n int) ([]limits.TopList, error)
}

// Bounds of n in GET /usage/top.
const (
	topDefaultN = 20
	topMaxN     = 1000
)

type topTenantJSON struct {
	ID        string    `json:"id"`
	Label     string    `json:"label,omitempty"`
	Org       string    `json:"org,omitempty"`
	Used      int64     `json:"used"`
	Reserved  *int64    `json:"reserved,omitempty"` // tokens limits with a reserve: held by answers in flight; remaining is net of it
	Limit     int64     `json:"limit"`
	Remaining int64     `json:"remaining"`
	Fraction  float64   `json:"fraction"`
	Reset     time.Time `json:"reset"`
	Plan      string    `json:"plan"`
	// Granted and Override are the tenant's run-time quota, where present (Limit includes
	// them).
	Granted  int64                 `json:"granted,omitempty"`
	Override *limits.OverrideTerms `json:"override,omitempty"`
}

type topListJSON struct {
	Limit   string          `json:"limit"`
	Window  string          `json:"window"`
	Unit    string          `json:"unit"`
	Tenants []topTenantJSON `json:"tenants"`
}

func topJSON(l limits.TopList) topListJSON {
	out := topListJSON{Limit: l.Limit, Window: l.Window, Unit: l.Unit, Tenants: make([]topTenantJSON, 0, len(l.Tenants))}
	for _, t := range l.Tenants {
		out.Tenants = append(out.Tenants, topTenantJSON{
			ID: t.ID, Label: t.Label, Org: t.Org, Used: t.Used, Reserved: reserved(t.Reserves, t.Reserved), Limit: t.Limit, Remaining: t.Remaining,
			Fraction: t.Fraction, Reset: ceilSecond(t.Reset), Plan: t.Plan, Granted: t.Granted, Override: t.Override,
		})
	}
	return out
}

// top serves GET /usage/top?limit=NAME&n=N.
func (h *handler) top(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	n := topDefaultN
	if v, ok := q["n"]; ok {
		var err error
		if len(v) != 1 {
			err = errors.New("n given twice")
		} else {
			n, err = strconv.Atoi(v[0])
		}
		if err != nil || n < 1 || n > topMaxN {
			writeError(w, http.StatusBadRequest, "invalid_request", "n must be a whole number from 1 to 1000 (default 20).")
			return
		}
	}
	name := q.Get("limit")
	if len(q["limit"]) > 1 || (name == "" && q.Has("limit")) {
		writeError(w, http.StatusBadRequest, "invalid_request", "limit must name one limit (omit it for every enabled limit).")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.o.TopTimeout)
	defer cancel()
	lists, err := h.o.Top.Top(ctx, name, n)
	switch {
	case errors.Is(err, limits.ErrUnknownLimit):
		writeError(w, http.StatusNotFound, "unknown_limit", "No enabled limit is named \""+clip(name)+"\".")
		return
	case err != nil:
		h.o.Logger.Warn("usage top read failed", zap.String("limit", name), zap.Error(err))
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "limiter_unavailable", "The limit store is unavailable. Please retry in a moment.")
		return
	}
	if name != "" {
		writeJSON(w, http.StatusOK, topJSON(lists[0]))
		return
	}
	out := struct {
		Limits []topListJSON `json:"limits"`
	}{Limits: make([]topListJSON, 0, len(lists))}
	for _, l := range lists {
		out.Limits = append(out.Limits, topJSON(l))
	}
	writeJSON(w, http.StatusOK, out)
}
