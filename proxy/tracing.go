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

	"github.com/docsgate/gateway/stream"
	"github.com/docsgate/gateway/tracing"
)

// Incoming trace context headers: with TrustIncoming false they are dropped before
// forwarding, so the upstream joins the gateway's trace, not the client's.
var traceHeaders = []string{"Traceparent", "Tracestate", "Baggage"}

// startSpan starts the request's server span, named after the route's template (never the
// raw path), and returns the request carrying it. Its attributes are set only once the span
// is known to be sampled: the gateway's samplers (parent-based trace-id ratio, or one the
// OTEL_TRACES_SAMPLER variable names) never read attributes, and at the default ratio 99 of
// 100 spans would build them for nothing.
func startSpan(t *tracing.Spans, s *scope, r *http.Request) *http.Request {
	carrier := propagation.HeaderCarrier(r.Header)
	opts := append(make([]trace.SpanStartOption, 0, 4), tracing.ServerKind, trace.WithTimestamp(s.start))
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
func endSpan(s *scope, status int, out *stream.Outcome) {
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
