package tracing

import (
	"context"
	"os"
	"testing"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// sampled starts n root spans (and one child of a sampled remote parent) on a provider made
// from o, and counts the roots sampled; the child must be sampled whatever the ratio.
func sampled(t *testing.T, o Options, n int) int {
	t.Helper()
	o.Endpoint = "http://127.0.0.1:1" // nothing is exported: no span ends
	p, err := New(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = p.Shutdown(ctx)
	})
	count := 0
	for range n {
		_, span := p.Tracer.Start(context.Background(), "root")
		if span.SpanContext().IsSampled() {
			count++
		}
	}
	parent := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}, TraceFlags: trace.FlagsSampled, Remote: true,
	})
	_, child := p.Tracer.Start(trace.ContextWithRemoteSpanContext(context.Background(), parent), "child")
	if !child.SpanContext().IsSampled() {
		t.Fatal("a sampled parent was not followed")
	}
	return count
}

func TestDefaultSampleRatio(t *testing.T) {
	const n = 5000
	noEnv := func(string) (string, bool) { return "", false }
	// Unset everywhere: one in a hundred (50 expected of 5,000; 20 and 100 are both more
	// than five standard deviations away).
	if got := sampled(t, Options{Env: noEnv}, n); got < 20 || got > 100 {
		t.Fatalf("%d of %d new traces sampled by default, want about %d", got, n, int(n*DefaultSampleRatio))
	}
	one := 1.0
	if got := sampled(t, Options{Env: noEnv, SampleRatio: &one}, n); got != n {
		t.Fatalf("sample_ratio 1: %d of %d sampled", got, n)
	}
	zero := 0.0
	if got := sampled(t, Options{Env: noEnv, SampleRatio: &zero}, n); got != 0 {
		t.Fatalf("sample_ratio 0: %d of %d sampled", got, n)
	}
}

// OTEL_TRACES_SAMPLER applies when the file sets no ratio, and the file's ratio wins over it.
func TestSamplerFromEnvironment(t *testing.T) {
	const n = 1000
	t.Setenv("OTEL_TRACES_SAMPLER", "parentbased_always_on")
	if got := sampled(t, Options{Env: os.LookupEnv}, n); got != n {
		t.Fatalf("OTEL_TRACES_SAMPLER=parentbased_always_on: %d of %d sampled", got, n)
	}
	zero := 0.0
	if got := sampled(t, Options{Env: os.LookupEnv, SampleRatio: &zero}, n); got != 0 {
		t.Fatalf("sample_ratio 0 beside OTEL_TRACES_SAMPLER: %d of %d sampled", got, n)
	}
}
