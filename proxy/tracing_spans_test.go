package proxy_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/docsgate/gateway/tracing"
)

// countingTracer counts the spans started through it, recorded or not.
type countingTracer struct {
	trace.Tracer
	started atomic.Int64
}

func (c *countingTracer) Start(ctx context.Context, name string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	c.started.Add(1)
	return c.Tracer.Start(ctx, name, opts...)
}

// traceparentUpstream answers 201 and keeps the traceparent it was sent.
type traceparentUpstream struct{ got string }

func (u *traceparentUpstream) RoundTrip(r *http.Request) (*http.Response, error) {
	u.got = r.Header.Get("Traceparent")
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	return &http.Response{StatusCode: http.StatusCreated, Status: "201 Created", Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: http.Header{"Content-Type": {"application/json"}}, Body: io.NopCloser(strings.NewReader(`{"id":"job_1"}`)), ContentLength: 14, Request: r}, nil
}

// An unsampled request (99 in 100 at the default ratio) starts its own span and no other: its
// children would not be recorded either, yet each would cost allocations. The upstream still
// gets the trace, unsampled. A sampled request has its child spans.
func TestUnsampledRequestStartsOnlyItsSpan(t *testing.T) {
	for _, tc := range []struct {
		name    string
		sampler sdktrace.Sampler
		spans   int64 // started per request: server, then ratelimit and upstream when sampled
		flags   string
	}{
		{"unsampled", sdktrace.NeverSample(), 1, "-00"},
		{"sampled", sdktrace.AlwaysSample(), 3, "-01"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(tc.sampler))
			t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
			ct := &countingTracer{Tracer: tp.Tracer("test")}
			up := &traceparentUpstream{}
			gw := benchGatewayTraced(t, up, &tracing.Spans{Tracer: ct, Propagator: propagation.TraceContext{}, TrustIncoming: true}, tp)
			req := httptest.NewRequest(http.MethodPost, "/v2/agent/proj-1/job", bytes.NewReader([]byte(`{"prompt":"Write a migration guide."}`)))
			req.Header.Set("Authorization", "Bearer "+benchAdminKey)
			req.Header.Set("Content-Type", "application/json")
			w := httptest.NewRecorder()
			gw.ServeHTTP(w, req)
			if w.Code != http.StatusCreated {
				t.Fatalf("status %d: %s", w.Code, w.Body)
			}
			if n := ct.started.Load(); n != tc.spans {
				t.Errorf("%d spans started, want %d", n, tc.spans)
			}
			if len(up.got) != 55 || !strings.HasPrefix(up.got, "00-") || !strings.HasSuffix(up.got, tc.flags) {
				t.Errorf("traceparent sent upstream %q, want a %s one", up.got, tc.name)
			}
		})
	}
}
