// Package proxy is the gateway's public HTTP pipeline: route, authenticate, validate, ask the engine, forward, account, log, trace.
package proxy

import (
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/docsgate/gateway/apierror"
	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/engine"
	"github.com/docsgate/gateway/internal/hopheaders"
	"github.com/docsgate/gateway/internal/readbound"
	"github.com/docsgate/gateway/metrics"
	"github.com/docsgate/gateway/tracing"
)

// Options wires a Gateway. Config, Logger, Metrics and Engine are required.
type Options struct {
	Config  *config.Config
	Logger  *zap.Logger
	Metrics *metrics.Metrics
	// Engine decides the routes' limits and keeps the tenants' accounts.
	Engine *engine.Engine
	// Transport reaches the upstream; nil builds one tuned from Config.Upstream.
	Transport http.RoundTripper
	// Registry, when set, is the key registry every key must be found in (auth.mode:
	// registry); nil checks keys by prefix alone.
	Registry KeyLookup
	// LastUse, with Registry, records each key's last use (in memory: the caller flushes it).
	LastUse *auth.LastUse
	// Tracing, when set, traces every request (server span, child spans, context to the
	// upstream); WrapTransport should then be Tracing.UpstreamTransport, for the client span.
	Tracing *tracing.Spans
	// WrapTransport, when set, wraps the upstream transport (Tracing.UpstreamTransport).
	WrapTransport func(http.RoundTripper) http.RoundTripper
}

// Gateway is the public handler: the HTTP pipeline of every route, in front of the engine.
type Gateway struct {
	log *zap.Logger
	// accessLog is log without the caller: every access line comes from the same place, and
	// finding it (runtime.Callers) was a tenth of the line's cost.
	accessLog *zap.Logger
	metrics   *metrics.Metrics
	proxy     *httputil.ReverseProxy // routes answering in one piece
	// streamProxy serves stream: true routes, flushing every write.
	streamProxy *httputil.ReverseProxy
	snap        atomic.Pointer[snapshot] // swapped by Reload

	// Fixed for the process lifetime.
	upstream       *url.URL
	writeStall     time.Duration // server.write_stall_timeout; 0: off
	keys           keyCheck
	body           bodyReader
	quota          quota
	logFields      sync.Pool        // *[]zap.Field for access-log lines
	tracing        *tracing.Spans   // nil: off
	selfUsageBound *readbound.Bound // answers of the tenants' usage endpoint, per address and per key
}

var _ http.Handler = (*Gateway)(nil)

// New compiles the config into a ready handler, and puts its policy in force in the engine.
func New(o Options) (*Gateway, error) {
	cfg := o.Config
	up, err := url.Parse(cfg.Upstream.URL)
	if err != nil {
		return nil, fmt.Errorf("proxy: upstream url: %w", err)
	}
	g := &Gateway{
		log:        o.Logger,
		accessLog:  o.Logger.WithOptions(zap.WithCaller(false)),
		metrics:    o.Metrics,
		upstream:   up,
		writeStall: cfg.Server.WriteStallTimeout,
		keys:       keyCheck{registry: o.Registry, lastUse: o.LastUse, failures: auth.NewFailureBudget(time.Now), tracing: o.Tracing, log: o.Logger},
		body:       bodyReader{timeout: cfg.Server.ReadBodyTimeout},
		quota: quota{engine: o.Engine, tracing: o.Tracing, log: o.Logger, allowOnError: cfg.Redis.OnError == "allow",
			states: sync.Pool{New: func() any { return new(limitState) }}},
		selfUsageBound: readbound.New(),
		tracing:        o.Tracing,
		logFields:      sync.Pool{New: func() any { f := make([]zap.Field, 0, 20); return &f }},
	}
	transport := o.Transport
	if transport == nil {
		transport = newTransport(cfg.Upstream, up)
	}
	if o.WrapTransport != nil {
		transport = o.WrapTransport(transport)
	}
	g.proxy = g.newReverseProxy(transport, false)
	g.streamProxy = g.newReverseProxy(transport, true)
	if err := g.Reload(cfg); err != nil {
		return nil, err
	}
	return g, nil
}

// Reload compiles cfg and swaps it in, in the engine and here, for the requests that start
// from now on; requests in flight finish with the config they started with. On error the
// running config is kept. Listeners, upstream, Redis and timeouts are fixed at start and not
// changed here.
func (g *Gateway) Reload(cfg *config.Config) error {
	pol, err := g.quota.engine.Compile(cfg)
	if err != nil {
		return err
	}
	sn, err := g.compile(cfg, pol)
	if err != nil {
		return err
	}
	g.quota.engine.Use(pol)
	g.snap.Store(sn)
	return nil
}

// ServeHTTP matches the request against the route table.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor == 1 && r.Body != nil && r.Body != http.NoBody {
		// The outer bound on what this request may wait for from its client: its body must
		// arrive within server.read_body_timeout of the request. readBody keeps it while it
		// reads and lifts it once the body is in; an answer given before that deals with the
		// body itself (responseWriter.answering) and a shorter deadline. Whatever else may
		// answer without reading the body, now or later, net/http's own read of the rest
		// (up to 256 KiB, before the answer is sent and again after the handler) stops here
		// instead of waiting on the client forever. HTTP/2 resets the stream instead.
		setReadDeadline(w, time.Now().Add(g.body.timeout))
	}
	// Before anything reads a header: the gateway checks what the upstream will receive.
	hopheaders.StripConnectionNamed(r.Header)
	sn := g.snap.Load()
	if !canonicalPath(r.URL.Path) {
		g.serveUnmatched(sn, nil, w, r)
		return
	}
	sn.table.mux.ServeHTTP(w, r)
}

// serve is the whole request path of a routed request, top to bottom.
func (g *Gateway) serve(sn *snapshot, rt *route, w http.ResponseWriter, r *http.Request) {
	s, r := g.begin(sn, rt, w, r)
	defer g.finish(s, r)

	_, fwd := w.(*doorWriter) // asked by the forward-auth door (fwdauth.go)
	if (rt.ForwardAuthOnly || fwd) && doorRefuses(s, fwd) {
		return
	}
	if rt.cors {
		sn.cors.Decorate(s.w.Header(), r)
	}
	if r.Method != rt.Method {
		// ServeMux lets HEAD into GET routes; only the configured method reaches the upstream.
		methodNotAllowed(s, r.Method, rt.Method)
		return
	}
	if upgradeRefused(s, r) {
		return
	}
	if !g.keys.authenticate(s, r) {
		return
	}
	if rt.deprecation != nil {
		rt.metrics.Deprecated(sn.orgLabel(s.org))
	}
	if !fwd && !g.body.read(s, r) {
		return
	}
	if !g.quota.limit(s, r) {
		return
	}
	if fwd {
		authorized(s)
		return
	}
	g.forward(s, r)
}

// methodNotAllowed answers 405. It is kept out of serve, whose stack frame every request
// carries down to the upstream exchange: see responseWriter.WriteHeader.
func methodNotAllowed(s *scope, method, allowed string) {
	s.w.Header().Set("Allow", allowed)
	s.fail(http.StatusMethodNotAllowed, apierror.Body{
		Error: fmt.Sprintf("Method %s is not allowed here; allowed: %s.", safeMethod(method), allowed),
		Code:  apierror.MethodNotAllowed,
	})
}

// servePreflight answers a CORS preflight of an assistant path.
func (g *Gateway) servePreflight(sn *snapshot, rt *route, methods string, w http.ResponseWriter, r *http.Request) {
	s, r := g.begin(sn, rt, w, r)
	defer g.finish(s, r)
	if _, fwd := w.(*doorWriter); fwd && doorRefuses(s, fwd) {
		return
	}
	sn.cors.Preflight(s.w, r, methods)
}

// serveUnmatched answers requests no route takes: 405 with Allow for a known path, else 404.
func (g *Gateway) serveUnmatched(sn *snapshot, t *table, w http.ResponseWriter, r *http.Request) {
	s, r := g.begin(sn, sn.unmatched, w, r)
	defer g.finish(s, r)
	if t != nil {
		if allow := t.allowed(r); allow != "" {
			if strings.Contains(allow, http.MethodOptions) {
				// Only assistant paths answer preflights: the browser must be able to read
				// this error too.
				sn.cors.Decorate(s.w.Header(), r)
			}
			methodNotAllowed(s, r.Method, allow)
			return
		}
	}
	s.fail(http.StatusNotFound, apierror.Body{Error: "Not found: no such API endpoint.", Code: apierror.NotFound})
}

// begin starts a request's scope on route rt, and its span when tracing is on: the request
// returned carries it.
func (g *Gateway) begin(sn *snapshot, rt *route, w http.ResponseWriter, r *http.Request) (*scope, *http.Request) {
	s := &scope{
		snap:      sn,
		route:     rt,
		start:     time.Now(),
		requestID: requestID(r),
		http1:     r.ProtoMajor == 1,
		// Go gives bodiless requests http.NoBody; anything else may still be on the wire.
		bodyUnread: r.Body != nil && r.Body != http.NoBody,
		inBody:     r.Body,
		inLength:   r.ContentLength,
	}
	if len(r.TransferEncoding) > 0 {
		s.inLength = -1
	}
	s.rw.ResponseWriter = w
	s.rw.scope = s
	s.w = &s.rw
	s.clientIP, s.trustedPeer = sn.clientIPs.Resolve(r)
	h := s.w.Header()
	s.header(h, slotRequestID, requestIDHeader, s.requestID)
	for k, v := range rt.deprecation {
		h[k] = v
	}
	rt.metrics.Inflight.Inc()
	if g.tracing != nil {
		r = startSpan(g.tracing, s, r)
	}
	return s, r
}

// safeMethod keeps client-chosen method names out of messages when they are odd.
func safeMethod(m string) string {
	if len(m) > 16 || !isVisibleASCII(m) {
		return "this method"
	}
	return m
}
