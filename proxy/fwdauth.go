package proxy

import (
	"net/http"

	"github.com/docsgate/gateway/apierror"
)

// The forward-auth door (package fwdauth) asks the pipeline about a request another proxy
// (nginx, Caddy, Traefik, Envoy) serves: the same route table, key checks and request limits,
// the same refusals and rate-limit headers, and instead of forwarding, a 200 naming the
// tenant for the proxy to pass on.

// HeaderOrg and HeaderPlan name the tenant in an authorized request's answer, for the proxy
// in front to copy to what it forwards (never the key); answeredHere is the forward-auth
// blocker of what the public listener answers itself.
const (
	HeaderOrg    = "X-Gateway-Org"
	HeaderPlan   = "X-Gateway-Plan"
	answeredHere = "the gateway's public listener answers it itself"
)

// doorWriter marks a request that came through Authorize: serve tells the doors apart by its
// writer's type, which costs the public listener's requests nothing.
type doorWriter struct{ http.ResponseWriter }

// Unwrap lets http.ResponseController reach the connection.
func (w *doorWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Authorize decides r, rebuilt by the forward-auth door from what the proxy in front said of
// the original, as the public listener would (route, method, key, request limits): 200 with the
// rate-limit and tenant headers, or the listener's own refusal. Nothing is forwarded, no body
// read; a route whose body or answer the decision needs (ForwardAuthBlocker) is refused 403.
func (g *Gateway) Authorize(w http.ResponseWriter, r *http.Request) {
	sn := g.snap.Load()
	if !canonicalPath(r.URL.Path) {
		g.serveUnmatched(sn, nil, w, r)
		return
	}
	sn.table.mux.ServeHTTP(&doorWriter{w}, r)
}

// doorRefuses answers a request its door does not serve, and reports whether it did: a route
// served only through forward auth is not found on the public listener, and one whose body or
// answer its decision needs is forbidden through forward auth. So is, through forward auth,
// what the gateway answers itself (CORS preflights, the tenants' usage endpoint: answeredHere):
// a 2xx would tell the proxy in front to pass it to the platform, unchecked.
func doorRefuses(s *scope, fwd bool) bool {
	switch {
	case !fwd && s.route.ForwardAuthOnly:
		s.fail(http.StatusNotFound, apierror.Body{Error: "Not found: no such API endpoint.", Code: apierror.NotFound})
		return true
	case fwd && s.route.fwdBlocker != "":
		s.fail(http.StatusForbidden, apierror.Body{
			Error: "This endpoint is not served through forward auth: " + s.route.fwdBlocker + ".",
			Code:  apierror.Forbidden,
		})
		return true
	}
	return false
}

// authorized answers an admitted forward-auth request: 200, no body, the tenant in headers
// (the rate-limit headers are already set).
func authorized(s *scope) {
	h := s.w.Header()
	if s.org != "" {
		h.Set(HeaderOrg, s.org)
	}
	if s.plan != "" {
		h.Set(HeaderPlan, s.plan)
	}
	h.Set("Content-Length", "0")
	h.Set("Cache-Control", "no-store")
	s.w.WriteHeader(http.StatusOK)
}
