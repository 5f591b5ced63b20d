package proxy

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/docsgate/gateway/tracing"
)

type answerWith struct {
	status int
	got    *http.Request
}

func (a *answerWith) RoundTrip(r *http.Request) (*http.Response, error) {
	a.got = r
	return &http.Response{StatusCode: a.status, Header: http.Header{}, Body: readyBody{strings.NewReader("ok")}, Request: r}, nil
}

// The upstream client span: a child of the request's span, named "<METHOD> upstream", with the
// HTTP conventions' attributes (url.full without its query), an error status from 400 up,
// ended when the answer's body is closed; its context goes to the upstream in traceparent;
// the body's Ready passes through. A span that is not sampled gets no attribute.
func TestUpstreamTransportSpan(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.AlwaysSample())))
	tr := &tracing.Spans{Tracer: tp.Tracer("test"), Propagator: propagation.TraceContext{}}
	up := &answerWith{status: http.StatusServiceUnavailable}
	rt := tr.UpstreamTransport(up)

	ctx, parent := tr.Tracer.Start(context.Background(), "server")
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://upstream.test:9000/v2/agent/p/job?secret=1", strings.NewReader("{}"))
	res, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	if rb, ok := res.Body.(interface{ Ready() bool }); !ok || !rb.Ready() {
		t.Fatal("the body's Ready did not pass through")
	}
	if len(rec.Ended()) != 0 {
		t.Fatal("the span ended before the body was closed")
	}
	_, _ = io.ReadAll(res.Body)
	res.Body.Close()
	res.Body.Close() // twice: still one span
	parent.End()

	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans ended, want 2", len(spans))
	}
	s := spans[0]
	if s.Name() != "POST upstream" || s.SpanKind() != trace.SpanKindClient || s.Parent().SpanID() != parent.SpanContext().SpanID() {
		t.Fatalf("span %q kind %v parent %v", s.Name(), s.SpanKind(), s.Parent().SpanID())
	}
	want := map[attribute.Key]string{
		"http.request.method": "POST", "server.address": "upstream.test", "server.port": "9000",
		"url.full": "http://upstream.test:9000/v2/agent/p/job", "http.response.status_code": "503", "error.type": "503",
	}
	got := map[attribute.Key]string{}
	for _, kv := range s.Attributes() {
		got[kv.Key] = kv.Value.String()
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	if s.Status().Code != codes.Error {
		t.Errorf("status %v, want Error", s.Status().Code)
	}
	if tp := up.got.Header.Get("Traceparent"); !strings.Contains(tp, s.SpanContext().TraceID().String()) || !strings.Contains(tp, s.SpanContext().SpanID().String()) {
		t.Errorf("traceparent %q does not carry the client span", tp)
	}

	// Not sampled: the request's (unsampled) context still goes to the upstream; no span is
	// recorded.
	never := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(sdktrace.NeverSample()))
	tr = &tracing.Spans{Tracer: never.Tracer("test"), Propagator: propagation.TraceContext{}}
	ctx, server := never.Tracer("test").Start(context.Background(), "server")
	up = &answerWith{status: http.StatusOK}
	req, _ = http.NewRequestWithContext(ctx, http.MethodGet, "http://upstream.test/x", nil)
	res, err = tr.UpstreamTransport(up).RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	server.End()
	if len(rec.Ended()) != 2 {
		t.Fatalf("an unsampled span was recorded")
	}
	sc := server.SpanContext()
	if tp, want := up.got.Header.Get("Traceparent"), "00-"+sc.TraceID().String()+"-"+sc.SpanID().String()+"-00"; tp != want {
		t.Errorf("traceparent of an unsampled request %q, want %q", tp, want)
	}
}
