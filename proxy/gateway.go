// Package proxy is the gateway's public HTTP face: the route table, the request pipeline
// (auth, body validation, limits, forwarding), unbuffered streaming, CORS, client IPs and the
// one error writer.
package proxy

import (
	"fmt"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/metrics"
)

// Options wires a Gateway. Config, Logger and Metrics are required.
type Options struct {
	Config  *config.Config
	Logger  *zap.Logger
	Metrics *metrics.Metrics
	// Transport reaches the upstream; nil builds one tuned from Config.Upstream.
	Transport http.RoundTripper
	// Limiter decides the routes' limits (required when any route applies one).
	Limiter Limiter
}

// Gateway is the public handler.
type Gateway struct {
	log     *zap.Logger
	metrics *metrics.Metrics
	proxy   *httputil.ReverseProxy
	table   atomic.Pointer[table]

	// Settings fixed for the process lifetime.
	upstream    *url.URL
	maxBody     int64
	readTimeout time.Duration
	clientIPs   clientIPs
	cors        *cors

	limiter             Limiter
	limits              []routeLimit // every enabled limit, for usage read-back
	allowOnLimiterError bool
	limitStates         sync.Pool               // *limitState
	orgOf               map[string]string       // assistant domain -> configured org
	orgMetrics          map[string]*metrics.Org // configured org (and "other") -> series; read-only after New
	ipv6Bits            int
}

var _ http.Handler = (*Gateway)(nil)

// New compiles the config into a ready handler.
func New(o Options) (*Gateway, error) {
	cfg := o.Config
	up, err := url.Parse(cfg.Upstream.URL)
	if err != nil {
		return nil, fmt.Errorf("proxy: upstream url: %w", err)
	}
	g := &Gateway{
		log:         o.Logger,
		metrics:     o.Metrics,
		upstream:    up,
		maxBody:     cfg.MaxBodyBytes,
		readTimeout: cfg.Server.ReadBodyTimeout,
		cors:        newCORS(cfg.CORS.AllowedOrigins, cfg.CORS.MaxAge),

		limiter:             o.Limiter,
		allowOnLimiterError: cfg.Redis.OnError == "allow",
		limitStates:         sync.Pool{New: func() any { return new(limitState) }},
		orgOf:               cfg.OrgOf(),
		orgMetrics:          map[string]*metrics.Org{},
		ipv6Bits:            cfg.ClientIP.IPv6Prefix,
	}
	for _, p := range cfg.ClientIP.TrustedProxies {
		prefix, err := config.ParsePrefix(p)
		if err != nil {
			return nil, fmt.Errorf("proxy: trusted proxy %q: %w", p, err)
		}
		g.clientIPs.trusted = append(g.clientIPs.trusted, prefix)
	}
	transport := o.Transport
	if transport == nil {
		transport = newTransport(cfg.Upstream)
	}
	g.proxy = g.newReverseProxy(transport)

	for org := range cfg.Orgs {
		g.orgMetrics[org] = g.metrics.Org(org)
	}
	g.orgMetrics[otherOrg] = g.metrics.Org(otherOrg)

	routes, err := compileRoutes(cfg.Routes)
	if err != nil {
		return nil, err
	}
	for _, rt := range routes {
		rt.metrics = g.metrics.Route(rt.name)
	}
	if g.limits, err = compileLimits(cfg, cfg.Routes, routes); err != nil {
		return nil, err
	}
	for _, rt := range routes {
		if len(rt.limits) > 0 && g.limiter == nil {
			return nil, fmt.Errorf("proxy: route %s applies limits but no limiter is configured", rt.name)
		}
	}
	t, err := g.buildTable(routes)
	if err != nil {
		return nil, err
	}
	g.table.Store(t)
	return g, nil
}

// ServeHTTP matches the request against the route table.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	t := g.table.Load()
	if !canonicalPath(r.URL.Path) {
		g.serveUnmatched(&route{name: unmatchedRoute, metrics: g.metrics.Route(unmatchedRoute)}, nil, w, r)
		return
	}
	t.mux.ServeHTTP(w, r)
}

// serve is the whole request path of a routed request, top to bottom.
func (g *Gateway) serve(rt *route, w http.ResponseWriter, r *http.Request) {
	s := g.begin(rt, w, r)
	defer g.finish(s, r)

	if rt.cors {
		g.cors.decorate(s.w.Header(), r)
	}
	id, reason := auth.Check(r.Header.Get("Authorization"), rt.key)
	if reason != 0 {
		g.rejectAuth(s, reason)
		return
	}
	s.digest = id.Digest
	if !g.readBody(s, r) {
		return
	}
	if !g.limit(s, r) {
		return
	}
	g.forward(s, r)
}

// servePreflight answers a CORS preflight of an assistant path.
func (g *Gateway) servePreflight(rt *route, methods string, w http.ResponseWriter, r *http.Request) {
	s := g.begin(rt, w, r)
	defer g.finish(s, r)
	g.cors.preflight(s.w, r, methods)
}

// serveUnmatched answers requests no route takes: 405 with Allow for a known path, else 404.
func (g *Gateway) serveUnmatched(rt *route, t *table, w http.ResponseWriter, r *http.Request) {
	s := g.begin(rt, w, r)
	defer g.finish(s, r)
	if t != nil {
		if allow := t.allowed(r); allow != "" {
			if strings.Contains(allow, http.MethodOptions) {
				// Only assistant paths answer preflights: the browser must be able to read
				// this error too.
				g.cors.decorate(s.w.Header(), r)
			}
			s.w.Header().Set("Allow", allow)
			s.fail(http.StatusMethodNotAllowed, errorBody{
				Error: fmt.Sprintf("Method %s is not allowed here; allowed: %s.", safeMethod(r.Method), allow),
				Code:  codeMethodNotAllowed,
			})
			return
		}
	}
	s.fail(http.StatusNotFound, errorBody{Error: "Not found: no such API endpoint.", Code: codeNotFound})
}

func (g *Gateway) begin(rt *route, w http.ResponseWriter, r *http.Request) *scope {
	s := &scope{
		route:     rt,
		w:         &responseWriter{ResponseWriter: w},
		start:     time.Now(),
		requestID: requestID(r),
	}
	s.clientIP, s.trustedPeer = g.clientIPs.resolve(r)
	s.w.Header().Set(requestIDHeader, s.requestID)
	rt.metrics.Inflight.Inc()
	return s
}

// finish writes the access-log line and the metrics of a request; it also runs when a stream
// is aborted (the reverse proxy panics with http.ErrAbortHandler), since it is deferred.
func (g *Gateway) finish(s *scope, r *http.Request) {
	m := s.route.metrics
	m.Inflight.Dec()
	elapsed := time.Since(s.start)
	status := s.w.status
	if status == 0 {
		status = 499 // nothing was sent: the client went away first
	}
	m.Request(status)
	m.Duration.Observe(elapsed.Seconds())
	finish := ""
	if s.tap != nil {
		finish = s.tap.result()
		m.StreamFinished(finish)
		if !s.w.firstByte.IsZero() {
			m.FirstByte.Observe(s.w.firstByte.Sub(s.start).Seconds())
		}
		m.StreamDuration.Observe(elapsed.Seconds())
	}
	if ce := g.log.Check(zap.InfoLevel, "request"); ce != nil {
		fields := make([]zap.Field, 0, 14)
		fields = append(fields,
			zap.String("route", s.route.name),
			zap.String("method", r.Method),
			zap.String("path", r.URL.Path),
			zap.Int("status", status),
			zap.Duration("duration", elapsed),
			zap.String("request_id", s.requestID),
			zap.String("client_ip", addrString(s.clientIP)),
			zap.Int("bytes_in", s.bodyBytes),
			zap.Int64("bytes_out", s.w.bytes),
		)
		if s.code != "" {
			fields = append(fields, zap.String("code", s.code))
		}
		if s.field != "" {
			fields = append(fields, zap.String("field", s.field))
		}
		if s.deniedBy != "" {
			fields = append(fields, zap.String("denied_by", s.deniedBy))
		}
		if s.limitErr {
			fields = append(fields, zap.Bool("limiter_error", true))
		}
		if s.upstreamStatus != 0 {
			fields = append(fields, zap.Int("upstream_status", s.upstreamStatus), zap.Duration("upstream_time", s.upstreamTime))
		}
		if s.upstreamKind != "" {
			fields = append(fields, zap.String("upstream_error", s.upstreamKind))
		}
		if finish != "" {
			fields = append(fields, zap.String("finish_reason", finish))
		}
		ce.Write(fields...)
	}
}

func addrString(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}

// safeMethod keeps client-chosen method names out of messages when they are odd.
func safeMethod(m string) string {
	if len(m) > 16 || !isVisibleASCII(m) {
		return "this method"
	}
	return m
}
