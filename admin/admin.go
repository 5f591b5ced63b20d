// Package admin serves the operator endpoints of the admin listener.
//
// Health, readiness, metrics, usage read-back, run-time quotas, keys, the webhook outbox and
// profiling; none of it is ever on the public listener.
package admin

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/pprof"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/limits"
)

// UsageReader reads limit counters without consuming anything.
type UsageReader interface {
	// UsageViews returns every limit counting by what ("project", "org", "ip" or "key") for
	// subject, as the tenants' own usage answer shows a limit.
	UsageViews(ctx context.Context, what, subject string) ([]limits.View, error)
}

// Options wires the admin handler.
type Options struct {
	// Ready reports whether the replica should receive traffic, and a word saying why not.
	Ready func() (bool, string)
	// Metrics serves the Prometheus exposition.
	Metrics http.Handler
	// Usage backs the /usage endpoints.
	Usage UsageReader
	// Top backs GET /usage/top.
	Top TopReader
	// TopTimeout bounds one /usage/top read (it scans every counter of the limits it lists).
	TopTimeout time.Duration
	// Reload re-reads the config file (POST /reload); nil disables the endpoint.
	Reload func() error
	// Keys manages registered keys (POST /keys, DELETE /keys/{digest}, GET /keys); nil in
	// auth.mode: prefix.
	Keys KeyManager
	// KnownPlan tells whether the running config defines a plan; keys naming another are refused.
	KnownPlan func(string) bool
	// RouteKind is the key family of the running config's route of that name; keys whose
	// scopes name no route of their kind are refused. nil: scopes are not checked.
	RouteKind func(name string) (auth.Kind, bool)
	// KeyLifetime bounds the expiry of the keys registered and rotated (auth.key_lifetime).
	// nil: no bounds.
	KeyLifetime func(auth.Kind) auth.Lifetime
	// KeyLastUse, when set, gives GET /keys and the usage page each key's last use.
	KeyLastUse KeyLastUse
	// KeyExpiryNotice is auth.expiry_notice of the running config: the usage page lists the
	// keys ending within it. nil or 0: not listed.
	KeyExpiryNotice func() time.Duration
	// Quotas backs the /quota endpoints (grants, overrides, resets, the audit trail) and the
	// page's lists of overrides and audit entries; nil disables them.
	Quotas QuotaManager
	// History backs GET /usage/history and GET /usage/export and the page's charts; nil
	// disables them. History reads take TopTimeout; an export takes minutes (see
	// exportDeadline).
	History HistoryReader
	// Notifications backs the /notifications endpoints (the webhook outbox: list, retry and
	// drop deliveries) and the page's notifications section; nil (notifications off)
	// disables them.
	Notifications NotificationOutbox
	// MaxExports is how many GET /usage/export answers the replica runs at once (each holds
	// a sorted set of every tenant in Redis while it runs); beyond, 429 too_many_exports.
	// 0: DefaultMaxExports.
	MaxExports int
	// ExportWriteTimeout is how long one write of an export may take (a client that accepts
	// no byte for that long is cut off and its listing freed). 0: DefaultExportWriteTimeout.
	ExportWriteTimeout time.Duration
	// Token, when set, is required on every endpoint but /healthz and /readyz, as
	// "Authorization: Bearer <token>" or as the password of HTTP Basic auth (any user name),
	// so that a browser can open the usage page. Empty: write endpoints answer 403
	// admin_token_required and the rest is open.
	Token string
	// Hosts are the host names, besides IP literals and localhost, requests may name
	// (admin_hosts); any other Host gets 421.
	Hosts []string
	// FailureLimit is how many wrong tokens one client (IPv6: per IPv6Prefix) may send in a
	// minute before its wrong tokens get 429 instead of 401; the right token is served
	// whatever the client sent before. 0: no limit.
	FailureLimit int
	IPv6Prefix   int
	// State reports the gateway's state for the usage page; nil shows none.
	State func(context.Context) State
	// UIRefresh is how often the usage page refreshes itself; 0 never.
	UIRefresh time.Duration
	// UsageTimeout bounds one usage read.
	UsageTimeout time.Duration
	Logger       *zap.Logger
}

// Handler builds the admin listener's handler: the endpoints behind the checks of
// protect.go (Host, cross-origin, token, JSON-only writes, audit).
func Handler(o Options) http.Handler {
	h, _ := build(o)
	return h
}

// routes is the admin mux and the patterns registered on it, in order: the OpenAPI
// document's test compares them with the document's paths.
type routes struct {
	*http.ServeMux
	patterns []string
	writes   map[string]string // the patterns behind the write rules
}

func (m *routes) Handle(pattern string, h http.Handler) {
	m.patterns = append(m.patterns, pattern)
	m.ServeMux.Handle(pattern, h)
}

func (m *routes) HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request)) {
	m.Handle(pattern, http.HandlerFunc(h))
}

// build is Handler, with the mux it serves.
func build(o Options) (http.Handler, *routes) {
	h := &handler{o: o, access: newAccess(o), exports: newExportSlots(o.MaxExports)}
	guard, write := h.access.guard, h.access.write
	// writes maps each write endpoint's pattern to the action its audit line names.
	writes := map[string]string{}
	mux := &routes{ServeMux: http.NewServeMux()}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		ok, status := o.Ready()
		code := http.StatusOK
		if !ok {
			code = http.StatusServiceUnavailable
		}
		writeJSON(w, code, map[string]string{"status": status})
	})
	mux.Handle("GET /metrics", guard(o.Metrics))
	// The OpenAPI document of this API, behind the token like the other reads.
	mux.Handle("GET /openapi.json", guard(http.HandlerFunc(serveOpenAPI)))
	mux.Handle("GET /usage/projects/{projectId}", guard(h.usage("project", "projectId")))
	mux.Handle("GET /usage/orgs/{org}", guard(h.usage("org", "org")))
	mux.Handle("GET /usage/ips/{ip}", guard(h.usage("ip", "ip")))
	// A read (nothing changes), but it takes the key in a JSON body.
	mux.Handle("POST /usage/key", guard(jsonOnly(http.HandlerFunc(h.usageKey), true)))
	if o.Top != nil {
		mux.Handle("GET /usage/top", guard(http.HandlerFunc(h.top)))
	}
	if o.History != nil {
		mux.Handle("GET /usage/history", guard(http.HandlerFunc(h.history)))
		mux.Handle("GET /usage/export", guard(ownPagesOnly(http.HandlerFunc(h.export))))
	}
	if o.Keys != nil {
		k := keys{km: o.Keys, knownPlan: o.KnownPlan, routeKind: o.RouteKind, lifetime: o.KeyLifetime, lastUse: o.KeyLastUse}
		mux.Handle("POST /keys", write(jsonOnly(http.HandlerFunc(k.add), true)))
		mux.Handle("DELETE /keys/{digest}", write(http.HandlerFunc(k.revoke)))
		mux.Handle("POST /keys/{digest}/rotate", write(jsonOnly(http.HandlerFunc(k.rotate), false)))
		mux.Handle("GET /keys", guard(http.HandlerFunc(k.list)))
		writes["POST /keys"], writes["DELETE /keys/{digest}"] = "keys.add", "keys.revoke"
		writes["POST /keys/{digest}/rotate"] = "keys.rotate"
	}
	if o.Quotas != nil {
		q := quotas{qm: o.Quotas, timeout: o.UsageTimeout, log: o.Logger}
		for pattern, action := range map[string]string{
			"POST /quota/grants":                   "quota.grant",
			"PUT /quota/overrides/{limit}/{id...}": "quota.override",
			// DELETE takes ?reason= or a JSON body: write's rules refuse a body of another type.
			"DELETE /quota/overrides/{limit}/{id...}": "quota.override_end",
			"POST /quota/resets":                      "quota.reset",
		} {
			writes[pattern] = action
		}
		mux.Handle("POST /quota/grants", write(jsonOnly(http.HandlerFunc(q.grant), true)))
		mux.Handle("PUT /quota/overrides/{limit}/{id...}", write(jsonOnly(http.HandlerFunc(q.setOverride), true)))
		mux.Handle("DELETE /quota/overrides/{limit}/{id...}", write(http.HandlerFunc(q.endOverride)))
		mux.Handle("POST /quota/resets", write(jsonOnly(http.HandlerFunc(q.reset), true)))
		mux.Handle("GET /quota/overrides", guard(http.HandlerFunc(q.overrides)))
		mux.Handle("GET /quota/audit", guard(http.HandlerFunc(q.audit)))
	}
	if o.Notifications != nil {
		nt := newNotifications(o)
		mux.Handle("GET /notifications", guard(http.HandlerFunc(nt.list)))
		mux.Handle("POST /notifications/retry", write(jsonOnly(http.HandlerFunc(nt.retry), true)))
		mux.Handle("POST /notifications/drop", write(jsonOnly(http.HandlerFunc(nt.drop), true)))
		writes["POST /notifications/retry"], writes["POST /notifications/drop"] = "notifications.retry", "notifications.drop"
	}
	if o.Reload != nil {
		mux.Handle("POST /reload", write(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			if err := o.Reload(); err != nil {
				writeError(w, http.StatusUnprocessableEntity, "reload_rejected", "The config was not reloaded (the running config stays): "+err.Error())
				return
			}
			writeJSON(w, http.StatusOK, map[string]string{"status": "reloaded"})
		})))
		writes["POST /reload"] = "reload"
	}
	if o.Top != nil {
		ui := newUI(o)
		// The page at /ui (the document's path; a path ending in a slash is a lint error
		// there) and at /ui/, the address the docs and bookmarks use: its assets and its own
		// refresh use absolute paths, so it works at either.
		mux.Handle("GET /ui", guard(http.HandlerFunc(ui.page)))
		mux.Handle("GET /ui/{$}", guard(http.HandlerFunc(ui.page)))
		mux.Handle("GET /ui/assets/", guard(ui.assets()))
	}
	// Profiles of the running gateway, for performance work; behind the token like the rest.
	mux.Handle("GET /debug/pprof", guard(http.HandlerFunc(pprofIndex)))
	mux.Handle("GET /debug/pprof/", guard(http.HandlerFunc(pprof.Index)))
	mux.Handle("GET /debug/pprof/cmdline", guard(http.HandlerFunc(pprof.Cmdline)))
	mux.Handle("GET /debug/pprof/profile", guard(http.HandlerFunc(pprof.Profile)))
	mux.Handle("GET /debug/pprof/symbol", guard(http.HandlerFunc(pprof.Symbol)))
	mux.Handle("GET /debug/pprof/trace", guard(http.HandlerFunc(pprof.Trace)))
	// Behind the token too, so which endpoints exist cannot be probed without it.
	mux.Handle("/", guard(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeError(w, http.StatusNotFound, "not_found", "Not found: no such admin endpoint.")
	})))
	mux.writes = writes
	return h.access.protect(mux.ServeMux, writes), mux
}

type handler struct {
	o       Options
	access  *access
	exports exportSlots
}

func (h *handler) usage(what, param string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		subject := r.PathValue(param)
		if what == "ip" {
			if _, err := netip.ParseAddr(subject); err != nil {
				writeError(w, http.StatusBadRequest, "invalid_request", "Not an IP address: "+clip(subject)+".")
				return
			}
		}
		h.writeUsage(w, r, what, subject)
	})
}

// usageKey takes the key in a JSON body, never in the URL, so it stays out of access logs.
func (h *handler) usageKey(w http.ResponseWriter, r *http.Request) {
	var body struct {
		Key string `json:"key"`
	}
	fe := readJSONBody(w, r, &body, 4096)
	if fe != nil && fe.twice() {
		writeFieldError(w, fe)
		return
	}
	if fe != nil || body.Key == "" || len(body.Key) > 256 || strings.ContainsAny(body.Key, " \t\r\n") {
		writeError(w, http.StatusBadRequest, "invalid_request", `Send {"key": "<API key>"} as JSON.`)
		return
	}
	h.writeUsage(w, r, "key", body.Key)
}

func (h *handler) writeUsage(w http.ResponseWriter, r *http.Request, what, subject string) {
	ctx, cancel := context.WithTimeout(r.Context(), h.o.UsageTimeout)
	defer cancel()
	views, err := h.o.Usage.UsageViews(ctx, what, subject)
	if err != nil {
		h.o.Logger.Warn("usage read failed", zap.String("what", what), zap.Error(err))
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "limiter_unavailable", "The limit store is unavailable. Please retry in a moment.")
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Limits []limits.View `json:"limits"`
	}{Limits: views})
}

// reserved is the "reserved" of a usage answer: present for a tokens limit with a reserve
// (0 included), absent for other limits, so their answers keep their shape.
func reserved(reserves bool, n int64) *int64 {
	if !reserves && n == 0 {
		return nil
	}
	return &n
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		code, data = http.StatusInternalServerError, []byte(`{"error":"Internal error.","code":"internal"}`)
	}
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = w.Write(append(data, '\n'))
}

// writeTooMany answers 429 with the error code, Retry-After and "retry_after" (seconds).
func writeTooMany(w http.ResponseWriter, errCode, msg string, retry int64) {
	w.Header().Set("Retry-After", strconv.FormatInt(retry, 10))
	noteCode(w, errCode)
	writeJSON(w, http.StatusTooManyRequests, map[string]any{"error": msg, "code": errCode, "retry_after": retry})
}

func writeError(w http.ResponseWriter, code int, errCode, msg string) {
	noteCode(w, errCode)
	writeJSON(w, code, map[string]string{"error": msg, "code": errCode})
}

// ceilSecond rounds up, so a client waiting until reset is never early.
func ceilSecond(t time.Time) time.Time {
	return t.UTC().Add(time.Second - 1).Truncate(time.Second)
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}
