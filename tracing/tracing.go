// Package tracing is the gateway's OpenTelemetry tracing: the tracer provider and the request spans.
//
// Tracing builds the gateway's OpenTelemetry tracer provider: OTLP export over
// http/protobuf or gRPC, a parent-based ratio sampler, the standard OTEL_* environment
// variables for whatever the config leaves unset, and a bounded export queue whose dropped
// spans are counted. Nothing here is on the request path but span creation.
package tracing

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// Options are the config file's settings; empty values defer to the environment (see New).
type Options struct {
	Endpoint    string
	Protocol    string // "http/protobuf", "grpc" or "" (environment, then http/protobuf)
	SampleRatio *float64
	ServiceName string
	Headers     map[string]string
	Insecure    bool
	Version     string // service.version
	// Env looks up environment variables (os.LookupEnv in production).
	Env func(string) (string, bool)
	// Dropped counts spans that were not exported: the queue was full, or the export failed.
	Dropped func(n int)
	// QueueSize bounds the spans waiting for export (0: 2048).
	QueueSize int
}

// Provider is a running tracer provider.
type Provider struct {
	tp         *sdktrace.TracerProvider
	Tracer     trace.Tracer
	Propagator propagation.TextMapPropagator
}

// TracerProvider is the SDK provider, for instrumentation that takes one.
func (p *Provider) TracerProvider() trace.TracerProvider { return p.tp }

// Disabled reports whether OTEL_SDK_DISABLED turns tracing off.
func Disabled(env func(string) (string, bool)) bool {
	v, _ := env("OTEL_SDK_DISABLED")
	return strings.EqualFold(strings.TrimSpace(v), "true")
}

// New starts the provider. The file's settings win; what it leaves empty comes from the
// OTEL_* variables as the OpenTelemetry specification defines them (the exporters read
// OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT and _HEADERS themselves, the SDK OTEL_TRACES_SAMPLER
// and _ARG, the resource OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES), then defaults.
func New(ctx context.Context, o Options) (*Provider, error) {
	if o.Env == nil {
		o.Env = func(string) (string, bool) { return "", false }
	}
	if o.Dropped == nil {
		o.Dropped = func(int) {}
	}
	if o.QueueSize <= 0 {
		o.QueueSize = 2048
	}
	exp, err := newExporter(ctx, o)
	if err != nil {
		return nil, err
	}
	res, err := newResource(ctx, o)
	if err != nil {
		return nil, err
	}
	queued := new(atomic.Int64)
	batcher := sdktrace.NewBatchSpanProcessor(&countingExporter{SpanExporter: exp, queued: queued, dropped: o.Dropped},
		// Twice our own bound: the batcher never drops on its own, so every drop is counted
		// by boundedProcessor.
		sdktrace.WithMaxQueueSize(2*o.QueueSize),
		sdktrace.WithMaxExportBatchSize(512),
		sdktrace.WithBatchTimeout(time.Second),
		sdktrace.WithExportTimeout(5*time.Second))
	opts := []sdktrace.TracerProviderOption{
		sdktrace.WithResource(res),
		sdktrace.WithSpanProcessor(&boundedProcessor{SpanProcessor: batcher, max: int64(o.QueueSize), queued: queued, dropped: o.Dropped}),
	}
	if s := sampler(o); s != nil {
		opts = append(opts, sdktrace.WithSampler(s))
	}
	tp := sdktrace.NewTracerProvider(opts...)
	return &Provider{
		tp:         tp,
		Tracer:     tp.Tracer("github.com/docsgate/gateway"),
		Propagator: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
	}, nil
}

// DefaultSampleRatio is the share of new traces sampled when neither the file nor
// OTEL_TRACES_SAMPLER says: one in a hundred, the default of Kong's and Istio's tracing. At 1.0
// (the SDK's own default) the spans of every request, made and exported, cost a busy gateway
// more CPU than proxying it; sampled parents are followed whatever the ratio, so a client that
// asks for a trace still gets one.
const DefaultSampleRatio = 0.01

// sampler is the file's ratio, else nil when OTEL_TRACES_SAMPLER is set (the SDK reads it and
// its _ARG), else DefaultSampleRatio; each parent-based.
func sampler(o Options) sdktrace.Sampler {
	ratio := DefaultSampleRatio
	if o.SampleRatio != nil {
		ratio = *o.SampleRatio
	} else if v, ok := o.Env("OTEL_TRACES_SAMPLER"); ok && v != "" {
		return nil
	}
	return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(ratio))
}

// Shutdown exports what is queued, within ctx, and stops the provider.
func (p *Provider) Shutdown(ctx context.Context) error {
	if err := p.tp.Shutdown(ctx); err != nil {
		return fmt.Errorf("tracing: shutdown: %w", err)
	}
	return nil
}

// protocol is the file's, else the environment's, else http/protobuf.
func protocol(o Options) string {
	if o.Protocol != "" {
		return o.Protocol
	}
	for _, name := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if v, ok := o.Env(name); ok && v != "" {
			return v
		}
	}
	return "http/protobuf"
}

// Exports give up after a few seconds: a dead collector then costs queued spans (dropped and
// counted), never a request's time.
var retry = struct {
	initial, maxInterval, maxElapsed time.Duration
}{200 * time.Millisecond, time.Second, 3 * time.Second}

func newExporter(ctx context.Context, o Options) (sdktrace.SpanExporter, error) {
	switch p := protocol(o); p {
	case "http/protobuf":
		opts := []otlptracehttp.Option{
			otlptracehttp.WithTimeout(5 * time.Second),
			otlptracehttp.WithRetry(otlptracehttp.RetryConfig{Enabled: true, InitialInterval: retry.initial, MaxInterval: retry.maxInterval, MaxElapsedTime: retry.maxElapsed}),
		}
		if o.Endpoint != "" {
			opts = append(opts, otlptracehttp.WithEndpointURL(httpTracesURL(o.Endpoint)))
		}
		if len(o.Headers) > 0 {
			opts = append(opts, otlptracehttp.WithHeaders(o.Headers))
		}
		if o.Insecure {
			opts = append(opts, otlptracehttp.WithInsecure())
		}
		exp, err := otlptracehttp.New(ctx, opts...)
		if err != nil {
			return nil, fmt.Errorf("tracing: otlp http exporter: %w", err)
		}
		return exp, nil
	case "grpc":
		opts := []otlptracegrpc.Option{
			otlptracegrpc.WithTimeout(5 * time.Second),
			otlptracegrpc.WithRetry(otlptracegrpc.RetryConfig{Enabled: true, InitialInterval: retry.initial, MaxInterval: retry.maxInterval, MaxElapsedTime: retry.maxElapsed}),
		}
		if o.Endpoint != "" {
			if strings.Contains(o.Endpoint, "://") {
				opts = append(opts, otlptracegrpc.WithEndpointURL(o.Endpoint))
			} else {
				opts = append(opts, otlptracegrpc.WithEndpoint(o.Endpoint))
			}
		}
		if len(o.Headers) > 0 {
			opts = append(opts, otlptracegrpc.WithHeaders(o.Headers))
		}
		if o.Insecure {
			opts = append(opts, otlptracegrpc.WithInsecure())
		}
		exp, err := otlptracegrpc.New(ctx, opts...)
		if err != nil {
			return nil, fmt.Errorf("tracing: otlp grpc exporter: %w", err)
		}
		return exp, nil
	default:
		return nil, fmt.Errorf("tracing: protocol %q: want http/protobuf or grpc", p)
	}
}

// httpTracesURL adds the signal path /v1/traces to an endpoint given without a path, as the
// specification does for OTEL_EXPORTER_OTLP_ENDPOINT.
func httpTracesURL(endpoint string) string {
	scheme, rest, ok := strings.Cut(endpoint, "://")
	if !ok {
		scheme, rest = "http", endpoint
	}
	if !strings.Contains(rest, "/") || strings.HasSuffix(rest, "/") && strings.Count(rest, "/") == 1 {
		return scheme + "://" + strings.TrimSuffix(rest, "/") + "/v1/traces"
	}
	return scheme + "://" + rest
}

func newResource(ctx context.Context, o Options) (*resource.Resource, error) {
	// Later detectors win: the default name, then the environment, then the file.
	detectors := []resource.Option{
		resource.WithAttributes(semconv.ServiceName("gateway"), semconv.ServiceVersion(o.Version)),
		resource.WithFromEnv(),
	}
	if o.ServiceName != "" {
		detectors = append(detectors, resource.WithAttributes(semconv.ServiceName(o.ServiceName)))
	}
	res, err := resource.New(ctx, detectors...)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("tracing: resource: %w", err)
	}
	return res, nil
}

// boundedProcessor bounds the spans waiting for export. A span that finds the queue full is
// dropped and counted at once: no request ever waits for the exporter, whatever the
// collector does.
type boundedProcessor struct {
	sdktrace.SpanProcessor
	max     int64
	queued  *atomic.Int64
	dropped func(int)
}

func (b *boundedProcessor) OnEnd(s sdktrace.ReadOnlySpan) {
	if !s.SpanContext().IsSampled() {
		return
	}
	if b.queued.Add(1) > b.max {
		b.queued.Add(-1)
		b.dropped(1)
		return
	}
	b.SpanProcessor.OnEnd(s)
}

// countingExporter tells boundedProcessor when spans leave the queue, and counts the spans
// of a failed export (after the exporter's own retries) as dropped.
type countingExporter struct {
	sdktrace.SpanExporter
	queued  *atomic.Int64
	dropped func(int)
}

func (e *countingExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	out := make([]sdktrace.ReadOnlySpan, len(spans))
	for i, s := range spans {
		out[i] = redact(s)
	}
	err := e.SpanExporter.ExportSpans(ctx, out)
	e.queued.Add(-int64(len(spans)))
	if err != nil {
		e.dropped(len(spans))
	}
	return err
}

// redacted keeps query strings out of exported spans: instrumentation such as otelhttp
// records url.full (and may record url.query), and a query string can hold a secret. Spans
// are wrapped on their way to the exporter, so no instrumentation can get one past.
type redacted struct {
	sdktrace.ReadOnlySpan
	attrs []attribute.KeyValue
}

func (r redacted) Attributes() []attribute.KeyValue { return r.attrs }

func redact(s sdktrace.ReadOnlySpan) sdktrace.ReadOnlySpan {
	attrs := s.Attributes()
	var out []attribute.KeyValue
	for i, kv := range attrs {
		v, changed := kv, false
		switch kv.Key {
		case "url.full", "http.url", "http.target", "url.original":
			if u, _, cut := strings.Cut(kv.Value.AsString(), "?"); cut {
				v, changed = kv.Key.String(u), true
			}
		case "url.query":
			v, changed = kv.Key.String("REDACTED"), true
		}
		if changed && out == nil {
			out = append(make([]attribute.KeyValue, 0, len(attrs)), attrs[:i]...)
		}
		if out != nil {
			out = append(out, v)
		}
	}
	if out == nil {
		return s
	}
	return redacted{ReadOnlySpan: s, attrs: out}
}
