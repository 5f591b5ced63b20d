package proxy

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/docsgate/gateway/stream"
)

// Tracing is what the proxy needs to trace requests; nil Options.Tracing turns it off, and
// then no span, context or attribute is made on the request path.
type Tracing struct {
	Tracer     trace.Tracer
	Propagator propagation.TextMapPropagator
	// TrustIncoming continues an incoming traceparent; false starts a new root linked to it.
	TrustIncoming bool
	// Store names the limit store for the ratelimit span's db.system.name ("redis"; "" for
	// the in-process store, which gets no such attribute).
	Store string
}

// Incoming trace context headers: with TrustIncoming false they are dropped before
// forwarding, so the upstream joins the gateway's trace, not the client's.
var traceHeaders = []string{"Traceparent", "Tracestate", "Baggage"}

// Span start options the same for every request, made once: an option made per call is an
// allocation each.
var (
	serverKind = trace.WithSpanKind(trace.SpanKindServer)
	clientKind = trace.WithSpanKind(trace.SpanKindClient)
)

// startSpan starts the request's server span, named after the route's template (never the
// raw path), and returns the request carrying it. Its attributes are set only once the span
// is known to be sampled: the gateway's samplers (parent-based trace-id ratio, or one the
// OTEL_TRACES_SAMPLER variable names) never read attributes, and at the default ratio 99 of
// 100 spans would build them for nothing.
func (g *Gateway) startSpan(s *scope, r *http.Request) *http.Request {
	t := g.tracing
	carrier := propagation.HeaderCarrier(r.Header)
	opts := append(make([]trace.SpanStartOption, 0, 4), serverKind, trace.WithTimestamp(s.start))
	ctx := r.Context()
	if t.TrustIncoming {
		ctx = t.Propagator.Extract(ctx, carrier)
	} else {
		if in := trace.SpanContextFromContext(t.Propagator.Extract(context.Background(), carrier)); in.IsValid() {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: in}))
		}
		opts = append(opts, trace.WithNewRoot())
		for _, h := range traceHeaders {
			r.Header.Del(h)
		}
	}
	name := s.route.spanName()
	if s.route.Method == "" || r.Method == http.MethodOptions {
		name = safeMethod(r.Method) // no route: the method alone, as the conventions say
		if s.route.Method != "" {
			name += " " + s.route.Path // a preflight of a known route
		}
	}
	ctx, s.span = t.Tracer.Start(ctx, name, opts...)
	if s.span.IsRecording() {
		// In one call of one slice: a call per attribute group grew the span's list once each.
		attrs := append(make([]attribute.KeyValue, 0, 7),
			attribute.String("http.request.method", r.Method),
			attribute.String("http.route", s.route.Path),
			attribute.String("url.scheme", scheme(r)),
			attribute.String("client.address", s.clientIPString()),
			attribute.String("server.address", hostOnly(r.Host)),
			attribute.String("gateway.route", s.route.Name),
		)
		if ua := r.UserAgent(); ua != "" {
			attrs = append(attrs, attribute.String("user_agent.original", ua))
		}
		s.span.SetAttributes(attrs...)
	}
	return r.WithContext(ctx)
}

// traceID is the request's trace id in hex when its span is sampled, else "": made once for
// the duration's exemplar and the access log.
func (s *scope) traceID() string {
	if s.traceIDStr == "" && s.span != nil {
		if sc := s.span.SpanContext(); sc.IsSampled() {
			s.traceIDStr = sc.TraceID().String()
		}
	}
	return s.traceIDStr
}

// endSpan records the outcome on the server span and ends it: for a stream, when the stream
// has ended.
// out is the stream's outcome, nil for other answers.
func (g *Gateway) endSpan(s *scope, status int, out *stream.Outcome) {
	span := s.span
	if !span.IsRecording() {
		span.End() // not sampled: no attribute or event would be kept
		return
	}
	attrs := []attribute.KeyValue{
		attribute.Int("http.response.status_code", status),
		attribute.String("gateway.ratelimit.decision", decisionOf(s)),
	}
	if s.org != "" && s.snap.orgLabel(s.org) != otherOrg {
		attrs = append(attrs, attribute.String("gateway.org", s.org))
	}
	if s.deniedBy != "" {
		attrs = append(attrs, attribute.String("gateway.denied_by", s.deniedBy))
	}
	if cut := s.cut.Limit(); cut != "" {
		attrs = append(attrs, attribute.String("gateway.cutoff", cut))
	}
	errType := s.code
	if s.upstreamKind != "" {
		errType = "upstream_" + s.upstreamKind
	}
	if errType != "" {
		attrs = append(attrs, attribute.String("error.type", errType))
	}
	span.SetAttributes(attrs...)
	if status >= 500 {
		span.SetStatus(codes.Error, errType)
	}
	if out != nil {
		if !s.w.firstByte.IsZero() {
			span.AddEvent("first_byte", trace.WithTimestamp(s.w.firstByte))
		}
		// The same event on both protocols: when a finish or an error passed, or usage.
		if out.Reason != "" || out.Errored || out.Usage {
			ev := []attribute.KeyValue{attribute.String("finish_reason", out.Result())}
			if out.Usage {
				ev = append(ev, attribute.Int64("gen_ai.usage.input_tokens", out.Prompt), attribute.Int64("gen_ai.usage.output_tokens", out.Completion))
			}
			at := out.FinishAt
			if at.IsZero() {
				at = time.Now()
			}
			span.AddEvent("finish", trace.WithTimestamp(at), trace.WithAttributes(ev...))
		}
	}
	span.End()
}

// decisionOf is the limits' outcome for the span.
func decisionOf(s *scope) string {
	switch {
	case !s.limited:
		return "none"
	case s.limitErr:
		return "error"
	case s.deniedBy != "":
		return "denied"
	case s.shadowDenied != "":
		return "shadow_denied"
	}
	return "allowed"
}

// childSpan starts a span under the request's, or returns ctx and nil when tracing is off.
func (g *Gateway) childSpan(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if g.tracing == nil || !trace.SpanFromContext(ctx).IsRecording() {
		// Not sampled: every sampler the gateway can have decides a child as it decided its
		// parent (parent-based, or by the trace id they share), so the child would not be
		// recorded either, and starting it only costs allocations.
		return ctx, nil
	}
	return g.tracing.Tracer.Start(ctx, name, clientKind, trace.WithAttributes(attrs...))
}

func scheme(r *http.Request) string {
	if r.TLS != nil {
		return "https"
	}
	return "http"
}

func hostOnly(h string) string {
	if host, _, err := net.SplitHostPort(h); err == nil {
		return host
	}
	return h
}

// UpstreamTransport wraps rt so that every upstream exchange has a client span, a child of the
// request's span, whose context goes to the upstream in traceparent (and whatever else the
// propagator carries), so the platform's traces join. It takes otelhttp's place with the same
// span ("<METHOD> upstream", kind client; http.request.method, server.address, server.port,
// url.full without its query, http.response.status_code, error.type; error status from 400
// up; ended when the answer's body is closed) at a fraction of the cost: otelhttp clones every
// request to add the headers, wraps its context twice and computes its HTTP metrics'
// attributes whether or not a meter records them (BenchmarkGatewayAgentJobTraced).
func (t *Tracing) UpstreamTransport(rt http.RoundTripper) http.RoundTripper {
	return &upstreamSpans{rt: rt, t: t}
}

type upstreamSpans struct {
	rt http.RoundTripper
	t  *Tracing
}

func (u *upstreamSpans) RoundTrip(r *http.Request) (*http.Response, error) {
	if !trace.SpanFromContext(r.Context()).IsRecording() {
		// The request's trace is not sampled, so its client span would not be either (see
		// childSpan): the upstream gets the trace and the request's span, unsampled, and the
		// exchange costs no span.
		u.t.Propagator.Inject(r.Context(), propagation.HeaderCarrier(r.Header))
		return u.rt.RoundTrip(r)
	}
	ctx, span := u.t.Tracer.Start(r.Context(), upstreamSpanName(r.Method), clientKind)
	recording := span.IsRecording()
	if recording {
		port := r.URL.Port()
		if port == "" {
			port = "80"
			if r.URL.Scheme == "https" {
				port = "443"
			}
		}
		n, _ := strconv.Atoi(port)
		span.SetAttributes(
			attribute.String("http.request.method", r.Method),
			attribute.String("server.address", r.URL.Hostname()),
			attribute.Int("server.port", n),
			attribute.String("url.full", r.URL.Scheme+"://"+r.URL.Host+r.URL.EscapedPath()),
		)
	}
	// The request is the reverse proxy's outgoing copy, made for this one exchange: the trace
	// headers go into it directly.
	u.t.Propagator.Inject(ctx, propagation.HeaderCarrier(r.Header))
	res, err := u.rt.RoundTrip(r)
	if err != nil {
		if recording {
			span.SetAttributes(attribute.String("error.type", fmt.Sprintf("%T", err)))
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
		return res, err
	}
	if recording {
		span.SetAttributes(attribute.Int("http.response.status_code", res.StatusCode))
		if res.StatusCode >= 400 {
			span.SetAttributes(attribute.String("error.type", strconv.Itoa(res.StatusCode)))
			span.SetStatus(codes.Error, "")
		}
	}
	res.Body = &spanBody{ReadCloser: res.Body, span: span}
	return res, nil
}

// upstreamSpanName is "<METHOD> upstream", without a concatenation for the usual methods.
func upstreamSpanName(method string) string {
	switch method {
	case http.MethodPost:
		return "POST upstream"
	case http.MethodGet:
		return "GET upstream"
	}
	return safeMethod(method) + " upstream"
}

// spanBody ends the upstream client span when the answer's body is closed (the reverse proxy
// always closes it), recording the first read error other than EOF.
type spanBody struct {
	io.ReadCloser
	span  trace.Span
	ended bool
}

func (b *spanBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && err != io.EOF && !b.ended && b.span.IsRecording() {
		b.span.SetStatus(codes.Error, err.Error())
	}
	return n, err
}

func (b *spanBody) Close() error {
	err := b.ReadCloser.Close()
	if !b.ended {
		b.ended = true
		b.span.End()
	}
	return err
}

// Ready passes on the transport's body's Ready (see modifyResponse): whether the first part
// of a stream came with its headers.
func (b *spanBody) Ready() bool {
	rb, ok := b.ReadCloser.(interface{ Ready() bool })
	return ok && rb.Ready()
}
