package admin

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/internal/freetext"
)

// The admin listener defends itself against who can reach it and from where:
//
//   - a Host that is not an IP literal, localhost or a name in admin_hosts gets 421, so a web
//     page cannot reach the listener through a DNS name of its own that resolves to it (DNS
//     rebinding);
//   - a state-changing request (POST, PUT, PATCH, DELETE) from a browser on another origin gets
//     403 cross_origin_refused (net/http's CrossOriginProtection: Sec-Fetch-Site, then Origin
//     against Host), before any credential is looked at, so the Basic-auth credentials a
//     browser caches for the usage page cannot be spent by a page of another site;
//   - the token (bearer, or the Basic-auth password) is compared in constant time without
//     revealing its length; the right token is always served, and wrong tokens count against
//     a per-client failure budget, past which they get 429;
//   - a Basic-auth user name (the actor of the audit trail) holding control, format or
//     separator characters gets 400 invalid_request naming the field "user";
//   - write endpoints refuse to run without a configured token (403 admin_token_required), take
//     JSON only (415 before the body is read), and leave one audit line each.
//
// Nothing here ever sets a CORS header: no other origin may read an admin answer.

// access holds what the checks need, built once.
type access struct {
	tokenSum [sha256.Size]byte // SHA-256 of the token: compared without revealing its length
	hasToken bool
	hosts    map[string]bool
	budget   *auth.FailureBudget
	limit    int // wrong tokens per client and minute; 0: unbounded
	v6Bits   int
	log      *zap.Logger
}

func newAccess(o Options) *access {
	a := &access{
		tokenSum: sha256.Sum256([]byte(o.Token)),
		hasToken: o.Token != "",
		hosts:    make(map[string]bool, len(o.Hosts)),
		budget:   auth.NewFailureBudget(time.Now),
		limit:    o.FailureLimit,
		v6Bits:   o.IPv6Prefix,
		log:      o.Logger,
	}
	if a.v6Bits <= 0 || a.v6Bits > 128 {
		a.v6Bits = 64
	}
	for _, h := range o.Hosts {
		a.hosts[normalizeHost(h)] = true
	}
	return a
}

// ownPagesOnly refuses a read with a side cost when a browser makes it for a page of another
// origin (an <img> or link on any site, sent with the operator's cached Basic credentials):
// GET /usage/export builds a sorted set of every tenant in Redis per call. The usage page's
// own link (same-origin), a typed address or bookmark (none) and clients that send no
// Sec-Fetch-Site (the CLI, curl, scripts) pass.
func ownPagesOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Header.Get("Sec-Fetch-Site") {
		case "", "same-origin", "none":
			next.ServeHTTP(w, r)
		default:
			writeError(w, http.StatusForbidden, "cross_origin_refused",
				"Refused: an export requested by a page of another origin. Open it from the usage page, or use curl or the admin API directly.")
		}
	})
}

// protect wraps the whole admin mux: the Host check, cross-origin protection and the audit of
// writes. writes maps the mux patterns of write endpoints to their audit action.
func (a *access) protect(mux *http.ServeMux, writes map[string]string) http.Handler {
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		writeError(w, http.StatusForbidden, "cross_origin_refused",
			"Refused: a state-changing admin request from a page of another origin. Use the CLI, curl or the admin API directly.")
	}))
	checked := cop.Handler(mux)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var action string
		if unsafeMethod(r.Method) {
			_, pattern := mux.Handler(r)
			action = writes[pattern]
		}
		if action == "" {
			a.serve(checked, w, r)
			return
		}
		rec := &auditRecord{target: r.URL.Path}
		aw := &auditWriter{ResponseWriter: w, status: http.StatusOK}
		a.serve(checked, aw, r.WithContext(context.WithValue(r.Context(), auditKey{}, rec)))
		a.audit(r, action, rec, aw)
	})
}

func (a *access) serve(next http.Handler, w http.ResponseWriter, r *http.Request) {
	if !a.hostAllowed(r.Host) {
		writeError(w, http.StatusMisdirectedRequest, "misdirected_request",
			"This admin listener does not serve this host name: use its IP address or localhost, or list the name under admin_hosts.")
		return
	}
	next.ServeHTTP(w, r)
}

func unsafeMethod(m string) bool {
	switch m {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return false
	}
	return true
}

// hostAllowed: an IP literal (what Prometheus and the kubelet's probes send, by pod IP),
// localhost (kubectl port-forward, a local browser) or a configured name. A rebinding page
// can only make the browser send a name the attacker controls, never one of these.
func (a *access) hostAllowed(hostport string) bool {
	host := normalizeHost(hostport)
	if host == "" {
		return false
	}
	if _, err := netip.ParseAddr(host); err == nil {
		return true
	}
	return host == "localhost" || a.hosts[host]
}

// normalizeHost strips the port and brackets, a trailing dot and case.
func normalizeHost(hostport string) string {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.TrimPrefix(strings.TrimSuffix(host, "]"), "["), ".")
	return strings.ToLower(host)
}

// guard requires the admin token when one is configured: as a bearer token, or as the
// password of HTTP Basic auth (any user name), which browsers ask for by themselves. The
// token is compared first, in constant time, and the right one is always served: a client
// that sent wrong tokens past its budget gets 429 for its wrong ones only, so nobody who
// shares the operator's address (a local user, an ingress, a port-forward) can lock the
// operator out by guessing.
func (a *access) guard(next http.Handler) http.Handler {
	if !a.hasToken {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, sent := credential(r)
		if a.matches(got) {
			if fe := checkUser(r); fe != nil {
				writeFieldError(w, fe)
				return
			}
			next.ServeHTTP(w, r)
			return
		}
		if a.limit > 0 && a.refuseSpent(w, r) {
			return
		}
		if sent && a.limit > 0 {
			// Only a token that was sent and is wrong counts: a browser's first request
			// carries none, and a page of another site must not be able to spend the budget
			// by making the browser ask without credentials.
			a.budget.Fail(a.client(r))
		}
		// Basic first: a browser then asks for credentials; API clients send Bearer.
		w.Header()["Www-Authenticate"] = []string{`Basic realm="gateway"`, `Bearer realm="gateway"`}
		writeError(w, http.StatusUnauthorized, "invalid_credentials", "This admin endpoint needs the admin token (Authorization: Bearer <token>, or HTTP Basic auth with the token as password).")
	})
}

// refuseSpent answers 429 too_many_auth_failures, with Retry-After, when the client has spent
// its budget of wrong tokens, and reports whether it did.
func (a *access) refuseSpent(w http.ResponseWriter, r *http.Request) bool {
	left, spent := a.budget.Spent(a.client(r), a.limit)
	if !spent {
		return false
	}
	retry := max(int64((left+time.Second-1)/time.Second), 1)
	writeTooMany(w, "too_many_auth_failures", fmt.Sprintf("Too many wrong admin tokens from this address. Please retry in %d s.", retry), retry)
	return true
}

// matches compares digests of equal length in constant time: neither the token's bytes nor
// its length show in how long a wrong guess takes.
func (a *access) matches(got string) bool {
	sum := sha256.Sum256([]byte(got))
	return subtle.ConstantTimeCompare(sum[:], a.tokenSum[:]) == 1
}

// credential is the token the request carries, and whether it carries one at all.
func credential(r *http.Request) (string, bool) {
	if _, pass, ok := r.BasicAuth(); ok {
		return pass, true
	}
	if v, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		return v, true
	}
	return "", r.Header.Get("Authorization") != ""
}

// client is the failure budget's key: the peer's address (the admin listener believes no
// forwarding header), IPv6 grouped per client_ip.ipv6_prefix like the public listener.
func (a *access) client(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	addr := ap.Addr().Unmap().WithZone("")
	if addr.Is4() {
		return addr
	}
	if p, err := addr.Prefix(a.v6Bits); err == nil {
		return p.Addr()
	}
	return addr
}

// write wraps a write endpoint: it refuses to run without a configured token, and a body
// that is not JSON before anything reads it (a form or text/plain body is what a page of
// another site can send without asking).
func (a *access) write(next http.Handler) http.Handler {
	return a.guard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !a.hasToken {
			writeError(w, http.StatusForbidden, "admin_token_required",
				"Admin writes are disabled until admin_token is set (GATEWAY_ADMIN_TOKEN); the gateway keys CLI and SIGHUP work without it.")
			return
		}
		jsonOnly(next, false).ServeHTTP(w, r)
	}))
}

// jsonOnly refuses with 415 a request whose body is not declared application/json
// (parameters allowed): always when the endpoint takes a body, else only when one is sent.
func jsonOnly(next http.Handler, takesBody bool) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hasBody := r.ContentLength != 0 || len(r.TransferEncoding) > 0
		if takesBody || hasBody {
			mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
			if err != nil || mt != "application/json" {
				writeError(w, http.StatusUnsupportedMediaType, "unsupported_media_type",
					"Send the body as JSON, with Content-Type: application/json.")
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// The audit of writes: one info line each, whatever the outcome, never a key.

type auditKey struct{}

// auditRecord is what a write endpoint adds to its audit line: the key digest it concerns.
type auditRecord struct {
	target string
}

// setAuditTarget names what a write acted on (a digest; never a key).
func setAuditTarget(r *http.Request, target string) {
	if rec, ok := r.Context().Value(auditKey{}).(*auditRecord); ok {
		rec.target = target
	}
}

// auditWriter notes the status and the error code of the answer.
type auditWriter struct {
	http.ResponseWriter
	status int
	code   string
}

func (w *auditWriter) WriteHeader(code int) {
	w.status = code
	w.ResponseWriter.WriteHeader(code)
}

func (w *auditWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// noteCode tells the audit of a write which error code its answer carries.
func noteCode(w http.ResponseWriter, code string) {
	if aw, ok := w.(*auditWriter); ok {
		aw.code = code
	}
}

func (a *access) audit(r *http.Request, action string, rec *auditRecord, w *auditWriter) {
	result := "ok"
	if w.status >= 300 {
		result = w.code
		if result == "" {
			result = strconv.Itoa(w.status)
		}
	}
	a.log.Info("admin write",
		zap.String("actor", actor(r)),
		zap.String("action", action),
		zap.String("target", rec.target),
		zap.Int("status", w.status),
		zap.String("result", result),
		zap.String("client", r.RemoteAddr))
}

// actor names who made a write: the Basic-auth user name (the token is the password), or
// "token" for a bearer token, or "none". A user name is the client's own text: clipped,
// cleaned as sanitize does (one with refused characters never gets past guard; this is for
// the audit line of a request guard refused), and never the password.
func actor(r *http.Request) string {
	if user, _, ok := r.BasicAuth(); ok {
		if user == "" {
			return "basic"
		}
		return sanitize(clip(user))
	}
	if strings.HasPrefix(r.Header.Get("Authorization"), "Bearer ") {
		return "token"
	}
	return "none"
}

// checkUser refuses a Basic-auth user name that would mislead where it is kept and shown
// (the audit trail, the log, the usage page, gateway quota audit): one holding characters
// freetext refuses, such as a bidi override (U+202E) or a line separator (U+2028).
func checkUser(r *http.Request) *fieldError {
	user, _, ok := r.BasicAuth()
	if !ok {
		return nil
	}
	if err := freetext.Check(user); err != nil {
		return &fieldError{"user", "the Basic-auth user name " + err.Error() + "; sign in again with a plain name"}
	}
	return nil
}

// IsLoopbackListen reports whether a listen address only accepts connections from this host.
func IsLoopbackListen(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip, err := netip.ParseAddr(host)
	return err == nil && ip.IsLoopback()
}
