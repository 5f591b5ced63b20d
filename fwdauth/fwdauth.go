// Package fwdauth is the forward-auth door: it answers nginx (auth_request), Caddy (forward_auth), Traefik (ForwardAuth) and Envoy (ext_authz over HTTP) about the requests they serve, through the public pipeline's own decision.
package fwdauth

import (
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"strings"

	"github.com/docsgate/gateway/apierror"
	"github.com/docsgate/gateway/clientip"
	"github.com/docsgate/gateway/config"
)

// Authorizer decides a request as the public listener would, without forwarding it
// (proxy.Gateway): 2xx with the rate-limit headers and the tenant, or the refusal.
type Authorizer interface {
	Authorize(w http.ResponseWriter, r *http.Request)
}

// The headers the proxies in front name the original request with: nginx's (which its
// config sets), and those Caddy, Traefik and others send.
const (
	hdrOriginalURI     = "X-Original-Uri"
	hdrOriginalMethod  = "X-Original-Method"
	hdrForwardedURI    = "X-Forwarded-Uri"
	hdrForwardedMethod = "X-Forwarded-Method"
	hdrForwardedHost   = "X-Forwarded-Host"
	hdrForwardedFor    = "X-Forwarded-For"
)

// maxURI bounds the original URI a proxy may name (the public listener's header limit bounds
// all of them together).
const maxURI = 8 << 10

// Handler is the forward-auth listener's handler.
type Handler struct {
	path string
	// peers are forward_auth.trusted_proxies: the only peers answered.
	peers []netip.Prefix
	// chain finds the client in X-Forwarded-For: the trusted proxies and client_ip's.
	chain clientip.Resolver
	door  Authorizer
}

var _ http.Handler = (*Handler)(nil)

// New builds the handler of fa in front of door; clientProxies is client_ip.trusted_proxies,
// whose X-Forwarded-For entries are believed too (a load balancer in front of the proxy).
func New(fa config.ForwardAuth, clientProxies []string, door Authorizer) (*Handler, error) {
	h := &Handler{path: fa.Path, door: door}
	for _, p := range fa.TrustedProxies {
		prefix, err := config.ParsePrefix(p)
		if err != nil {
			return nil, fmt.Errorf("fwdauth: trusted proxy %q: %w", p, err)
		}
		h.peers = append(h.peers, prefix)
	}
	h.chain.Trusted = append(h.chain.Trusted, h.peers...)
	for _, p := range clientProxies {
		prefix, err := config.ParsePrefix(p)
		if err != nil {
			return nil, fmt.Errorf("fwdauth: client_ip trusted proxy %q: %w", p, err)
		}
		h.chain.Trusted = append(h.chain.Trusted, prefix)
	}
	return h, nil
}

// ServeHTTP answers a trusted proxy about the original request it names, and refuses anyone
// else: a client that reaches this listener directly could otherwise name any address, method
// or path it likes.
func (h *Handler) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	w := &refusalWriter{ResponseWriter: rw} // every refusal's body in X-Gateway-Error too
	defer w.flush()
	if !h.trusted(clientip.Peer(r)) {
		apierror.Write(w, http.StatusForbidden, apierror.Body{
			Error: "The forward-auth endpoint answers only its trusted proxies (forward_auth.trusted_proxies).",
			Code:  apierror.Forbidden,
		})
		return
	}
	method, uri, ok := h.original(r)
	if !ok {
		apierror.Write(w, http.StatusNotFound, apierror.Body{Error: "Not found: no such API endpoint.", Code: apierror.NotFound})
		return
	}
	out, problem := h.rebuild(r, method, uri)
	if problem != "" {
		apierror.Write(w, http.StatusBadRequest, apierror.Body{Error: "Bad forward-auth request: " + problem + ".", Code: apierror.InvalidRequest})
		return
	}
	h.door.Authorize(w, out)
}

func (h *Handler) trusted(a netip.Addr) bool {
	for _, p := range h.peers {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// original is the original request's method and URI: from the headers at the door's path,
// or, below it, the request's own (Envoy's ext_authz appends the original path to its
// path_prefix and keeps the method). ok is false for any other path.
func (h *Handler) original(r *http.Request) (method, uri string, ok bool) {
	p := r.URL.Path
	if p == h.path {
		return oneOf(r.Header, hdrOriginalMethod, hdrForwardedMethod), oneOf(r.Header, hdrOriginalURI, hdrForwardedURI), true
	}
	if strings.HasPrefix(p, h.path+"/") {
		return r.Method, strings.TrimPrefix(r.URL.RequestURI(), h.path), true
	}
	return "", "", false
}

// oneOf is the value the headers a and b agree on: "" when both are absent; "\x00" (refused
// by rebuild) when either is repeated or the two differ, since the gateway would then have
// to guess which one the proxy meant.
func oneOf(hdr http.Header, a, b string) string {
	va, vb := hdr.Values(a), hdr.Values(b)
	switch {
	case len(va) > 1 || len(vb) > 1:
		return "\x00"
	case len(va) == 1 && len(vb) == 1 && va[0] != vb[0]:
		return "\x00"
	case len(va) == 1:
		return va[0]
	case len(vb) == 1:
		return vb[0]
	}
	return ""
}

// rebuild is the original request as the public pipeline reads it: its method, URI and client
// address, the headers the proxy passed on (the key among them), no body. problem says what is
// wrong with what the proxy sent.
func (h *Handler) rebuild(r *http.Request, method, uri string) (*http.Request, string) {
	if !validMethod(method) {
		return nil, "X-Original-Method or X-Forwarded-Method must name the method once, in upper case"
	}
	if len(uri) > maxURI || !strings.HasPrefix(uri, "/") || strings.HasPrefix(uri, "//") {
		return nil, "X-Original-URI or X-Forwarded-Uri must name the path once (starting with a single /, at most 8 KiB)"
	}
	u, err := url.ParseRequestURI(uri)
	if err != nil {
		return nil, "X-Original-URI or X-Forwarded-Uri is not a request URI"
	}
	client, _ := h.chain.Resolve(r)
	out := r.Clone(r.Context())
	out.Method, out.URL, out.RequestURI = method, u, uri
	out.Body, out.ContentLength, out.TransferEncoding = http.NoBody, 0, nil
	out.RemoteAddr = netip.AddrPortFrom(client, 0).String()
	for _, k := range []string{hdrOriginalURI, hdrOriginalMethod, hdrForwardedURI, hdrForwardedMethod, hdrForwardedFor, hdrForwardedHost} {
		delete(out.Header, k) // the client address is out.RemoteAddr now
	}
	return out, ""
}

// validMethod accepts the upper-case methods routes name (config's routes[].method).
func validMethod(m string) bool {
	if m == "" || len(m) > 20 {
		return false
	}
	for i := 0; i < len(m); i++ {
		if m[i] < 'A' || m[i] > 'Z' {
			return false
		}
	}
	return true
}
