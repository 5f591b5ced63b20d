package proxy

import (
	"context"
	"net"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
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

// startSpan starts the request's server span, named after the route's template (never the
// raw path), and returns the request carrying it.
func (g *Gateway) startSpan(s *scope, r *http.Request) *http.Request {
	t := g.tracing
	carrier := propagation.HeaderCarrier(r.Header)
	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindServer),
		trace.WithTimestamp(s.start),
		trace.WithAttributes(
			attribute.String("http.request.method", r.Method),
			attribute.String("http.route", s.route.path),
			attribute.String("url.scheme", scheme(r)),
			attribute.String("client.address", s.clientIPString()),
			attribute.String("server.address", hostOnly(r.Host)),
			attribute.String("gateway.route", s.route.name),
		),
	}
	if ua := r.UserAgent(); ua != "" {
		opts = append(opts, trace.WithAttributes(attribute.String("user_agent.original", ua)))
	}
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
	if s.route.method == "" || r.Method == http.MethodOptions {
		name = safeMethod(r.Method) // no route: the method alone, as the conventions say
		if s.route.method != "" {
			name += " " + s.route.path // a preflight of a known route
		}
	}
	ctx, s.span = t.Tracer.Start(ctx, name, opts...)
	return r.WithContext(ctx)
}

// endSpan records the outcome on the server span and ends it: for a stream, when the stream
// has ended.
// out is the stream's outcome, nil for other answers.
func (g *Gateway) endSpan(s *scope, status int, out *streamOutcome) {
	span := s.span
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
	if s.cut.by != nil {
		attrs = append(attrs, attribute.String("gateway.cutoff", s.cut.limit()))
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
		if out.reason != "" || out.errored || out.usage {
			ev := []attribute.KeyValue{attribute.String("finish_reason", out.result())}
			if out.usage {
				ev = append(ev, attribute.Int64("gen_ai.usage.input_tokens", out.prompt), attribute.Int64("gen_ai.usage.output_tokens", out.completion))
			}
			at := out.finishAt
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
	if g.tracing == nil {
		return ctx, nil
	}
	return g.tracing.Tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
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
