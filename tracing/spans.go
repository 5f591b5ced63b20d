package tracing

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// Spans is what the front doors need to trace requests; a nil *Spans turns tracing off, and
// then no span, context or attribute is made on the request path.
type Spans struct {
	Tracer     trace.Tracer
	Propagator propagation.TextMapPropagator
	// TrustIncoming continues an incoming traceparent; false starts a new root linked to it.
	TrustIncoming bool
	// Store names the limit store for the ratelimit span's db.system.name ("redis"; "" for
	// the in-process store, which gets no such attribute).
	Store string
}

// ServerKind and ClientKind are span start options the same for every request, made once: an
// option made per call is an allocation each.
var (
	ServerKind = trace.WithSpanKind(trace.SpanKindServer)
	ClientKind = trace.WithSpanKind(trace.SpanKindClient)
)

// Child starts a span under the request's, or returns ctx and nil when tracing is off (t nil)
// or the request's span is not sampled.
func (t *Spans) Child(ctx context.Context, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if t == nil || !trace.SpanFromContext(ctx).IsRecording() {
		// Not sampled: every sampler the gateway can have decides a child as it decided its
		// parent (parent-based, or by the trace id they share), so the child would not be
		// recorded either, and starting it only costs allocations.
		return ctx, nil
	}
	return t.Tracer.Start(ctx, name, ClientKind, trace.WithAttributes(attrs...))
}

// UpstreamTransport wraps rt so that every upstream exchange has a client span, a child of the
// request's span, whose context goes to the upstream in traceparent (and whatever else the
// propagator carries), so the platform's traces join. It takes otelhttp's place with the same
// span ("<METHOD> upstream", kind client; http.request.method, server.address, server.port,
// url.full without its query, http.response.status_code, error.type; error status from 400
// up; ended when the answer's body is closed) at a fraction of the cost: otelhttp clones every
// request to add the headers, wraps its context twice and computes its HTTP metrics'
// attributes whether or not a meter records them (BenchmarkGatewayAgentJobTraced).
func (t *Spans) UpstreamTransport(rt http.RoundTripper) http.RoundTripper {
	return &upstreamSpans{rt: rt, t: t}
}

type upstreamSpans struct {
	rt http.RoundTripper
	t  *Spans
}

func (u *upstreamSpans) RoundTrip(r *http.Request) (*http.Response, error) {
	if !trace.SpanFromContext(r.Context()).IsRecording() {
		// The request's trace is not sampled, so its client span would not be either (see
		// Child): the upstream gets the trace and the request's span, unsampled, and the
		// exchange costs no span.
		u.t.Propagator.Inject(r.Context(), propagation.HeaderCarrier(r.Header))
		return u.rt.RoundTrip(r)
	}
	ctx, span := u.t.Tracer.Start(r.Context(), upstreamSpanName(r.Method), ClientKind)
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

// Ready passes on the transport's body's Ready: whether the first part of a stream came with
// its headers (the proxy flushes them together).
func (b *spanBody) Ready() bool {
	rb, ok := b.ReadCloser.(interface{ Ready() bool })
	return ok && rb.Ready()
}

// safeMethod keeps client-chosen method names out of span names when they are odd.
func safeMethod(m string) string {
	if len(m) > 16 {
		return "this method"
	}
	for i := 0; i < len(m); i++ {
		if c := m[i]; c <= ' ' || c > '~' || c == '"' || c == '\\' {
			return "this method"
		}
	}
	return m
}
