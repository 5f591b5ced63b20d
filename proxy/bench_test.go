package proxy_test

// Benchmarks of the gateway's handler chain (route match, auth, body read and validation,
// limits on the in-process store, forwarding through httputil.ReverseProxy, metrics and the
// access-log line) with the upstream transport excluded: a RoundTripper answers with a canned
// response without network, and neither the transport nor the ResponseWriter allocates, so
// allocs/op is the gateway's own. `make bench` runs them with GOMAXPROCS=1.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/engine"
	"github.com/docsgate/gateway/limits"
	"github.com/docsgate/gateway/metrics"
	"github.com/docsgate/gateway/proxy"
	"github.com/docsgate/gateway/tracing"
)

// cannedBody is a reusable response body: Reset rewinds it, Close does nothing.
type cannedBody struct{ bytes.Reader }

func (*cannedBody) Close() error { return nil }

// cannedTransport answers every request with one pre-built response, reset on each call.
type cannedTransport struct {
	status int
	text   string
	header http.Header // template
	data   []byte
	resp   http.Response
	body   cannedBody
}

func newCannedTransport(status int, contentType string, data []byte, length int64) *cannedTransport {
	return &cannedTransport{status: status, text: strconv.Itoa(status) + " " + http.StatusText(status), header: http.Header{"Content-Type": {contentType}}, data: data,
		resp: http.Response{ContentLength: length, Header: http.Header{}}}
}

func (t *cannedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body != nil {
		_, _ = io.Copy(io.Discard, req.Body)
		req.Body.Close()
	}
	h := t.resp.Header
	clear(h)
	for k, v := range t.header {
		h[k] = v
	}
	length := t.resp.ContentLength
	t.resp = http.Response{Status: t.text, StatusCode: t.status, Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1,
		Header: h, ContentLength: length, Request: req, Body: &t.body}
	t.body.Reset(t.data)
	return &t.resp, nil
}

// discardWriter is a ResponseWriter that keeps nothing but reuses its header map; it
// supports Flush and read deadlines like the server's own.
type discardWriter struct {
	h      http.Header
	status int
	n      int
}

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) WriteHeader(code int)        { w.status = code }
func (w *discardWriter) Write(p []byte) (int, error) { w.n += len(p); return len(p), nil }
func (w *discardWriter) Flush()                      {}
func (w *discardWriter) SetReadDeadline(time.Time) error {
	return nil
}

// SetWriteDeadline: net/http's writers have it (a stream's stall watch sets one as it ends).
func (w *discardWriter) SetWriteDeadline(time.Time) error { return nil }

func (w *discardWriter) reset() {
	clear(w.h)
	w.status, w.n = 0, 0
}

// replayBody is a request body rewound before every iteration.
type replayBody struct{ bytes.Reader }

func (*replayBody) Close() error { return nil }

func benchGateway(b *testing.B, tr http.RoundTripper) *proxy.Gateway {
	b.Helper()
	return benchGatewayTraced(b, tr, nil, nil)
}

// benchGatewayTraced is benchGateway with tracing (nil: off).
func benchGatewayTraced(b testing.TB, tr http.RoundTripper, tracing *tracing.Spans, tp trace.TracerProvider) *proxy.Gateway {
	b.Helper()
	cfg := config.Defaults()
	cfg.Upstream.URL = "http://upstream.invalid:9000"
	never := int64(1) << 40
	cfg.Limits = map[string]config.Limit{
		"agent_job_per_project": {Limit: &never},
		"assistant_per_key":     {Limit: &never},
		"assistant_per_org":     {Limit: &never},
		"assistant_per_ip":      {Limit: &never},
	}
	if err := cfg.Validate(); err != nil {
		b.Fatal(err)
	}
	// The access log is on, at info, as JSON, into io.Discard: encoding costs what it costs
	// in production, without the write.
	enc := zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig())
	log := zap.New(zapcore.NewCore(enc, zapcore.AddSync(io.Discard), zapcore.InfoLevel))
	m := metrics.New(prometheus.NewRegistry())
	gw, err := proxy.New(proxy.Options{
		Config:    &cfg,
		Logger:    log,
		Metrics:   m,
		Transport: tr,
		Engine:    engine.New(engine.Options{Limiter: limits.NewMemory(), Metrics: m, Logger: log}),
		Tracing:   tracing,
		WrapTransport: func(rt http.RoundTripper) http.RoundTripper {
			if tracing == nil {
				return rt
			}
			return tracing.UpstreamTransport(rt)
		},
	})
	if err != nil {
		b.Fatal(err)
	}
	return gw
}

func runChain(b *testing.B, gw http.Handler, method, path, key string, body []byte, wantStatus int) {
	b.Helper()
	header := http.Header{
		"Authorization": {"Bearer " + key},
		"Content-Type":  {"application/json"},
		"User-Agent":    {"bench"},
	}
	rb := &replayBody{}
	req, err := http.NewRequestWithContext(context.Background(), method, "http://gateway.local"+path, rb)
	if err != nil {
		b.Fatal(err)
	}
	req.RemoteAddr = "203.0.113.7:51234"
	req.RequestURI = path
	w := &discardWriter{h: http.Header{}}
	prepare := func() {
		// The handler may replace or rewrite these; put the originals back each time.
		rb.Reset(body)
		req.Body = rb
		req.ContentLength = int64(len(body))
		clear(req.Header)
		for k, v := range header {
			req.Header[k] = v
		}
		w.reset()
	}
	prepare()
	gw.ServeHTTP(w, req) // warm-up: pools, limit entries
	if w.status != wantStatus {
		b.Fatalf("status %d, want %d", w.status, wantStatus)
	}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		prepare()
		gw.ServeHTTP(w, req)
	}
	b.StopTimer()
	if w.status != wantStatus {
		b.Fatalf("status %d, want %d", w.status, wantStatus)
	}
}

const (
	benchAdminKey     = "svc_benchadmin0123456789abcdef"
	benchAssistantKey = "svc_dsc_benchpublic0123456789abcdef"
)

// BenchmarkGatewayAgentJob is POST /v2/agent/{projectId}/job with a small JSON body,
// answered 201 by the canned transport.
func BenchmarkGatewayAgentJob(b *testing.B) {
	tr := newCannedTransport(http.StatusCreated, "application/json",
		[]byte(`{"id":"job_0123456789","status":"active","createdAt":"2026-01-01T00:00:00Z"}`), -2)
	tr.resp.ContentLength = int64(len(tr.data))
	gw := benchGateway(b, tr)
	body := []byte(`{"prompt":"Write a migration guide from SDK v1 to v2, with code samples for Go and Python.","model":"default","metadata":{"source":"bench"}}`)
	runChain(b, gw, http.MethodPost, "/v2/agent/proj-bench/job", benchAdminKey, body, http.StatusCreated)
}

// BenchmarkGatewayAssistantMessage is the streamed assistant route with a 20-message
// conversation and three limits, answered with a short stream (f:, two 0: parts, e:, d:).
func BenchmarkGatewayAssistantMessage(b *testing.B) {
	tr := newCannedTransport(http.StatusOK, "text/plain; charset=utf-8", v1Stream, -1)
	gw := benchGateway(b, tr)
	runChain(b, gw, http.MethodPost, "/discovery/v1/assistant/bench-docs/message", benchAssistantKey, conversation20(b), http.StatusOK)
}

// BenchmarkGatewayAssistantMessageV2 is the v2 route: the same conversation as an AI SDK 5+
// client sends it, answered with a short UI message stream (two text-delta events and the
// chunks around them, usage in the finish chunk's metadata).
func BenchmarkGatewayAssistantMessageV2(b *testing.B) {
	tr := newCannedTransport(http.StatusOK, "text/event-stream", v2Stream, -1)
	tr.header.Set("X-Vercel-AI-UI-Message-Stream", "v1")
	gw := benchGateway(b, tr)
	runChain(b, gw, http.MethodPost, "/discovery/v2/assistant/bench-docs/message", benchAssistantKey, conversationV2(b), http.StatusOK)
}

// v1Stream is a short answer in the data stream protocol: f:, two 0: parts, e:, d:.
var v1Stream = []byte("f:{\"messageId\":\"msg-0123456789abcdef\"}\n0:\"Here is what the documentation says. \"\n" +
	"0:\"Send it as a Bearer token in the Authorization header. \"\n" +
	"e:{\"finishReason\":\"stop\",\"usage\":{\"promptTokens\":10,\"completionTokens\":17},\"isContinued\":false}\n" +
	"d:{\"finishReason\":\"stop\",\"usage\":{\"promptTokens\":10,\"completionTokens\":17},\"threadId\":\"thread_0123\"}\n")

// v2Stream is a short UI message stream: two text-delta events and the chunks around them,
// usage in the finish chunk's metadata.
var v2Stream = func() []byte {
	ev := func(chunk string) string { return "data: " + chunk + "\n\n" }
	return []byte(ev(`{"type":"start","messageId":"msg-0123456789abcdef"}`) + ev(`{"type":"start-step"}`) +
		ev(`{"type":"text-start","id":"text-1"}`) +
		ev(`{"type":"text-delta","id":"text-1","delta":"Here is what the documentation says. "}`) +
		ev(`{"type":"text-delta","id":"text-1","delta":"Send it as a Bearer token in the Authorization header. "}`) +
		ev(`{"type":"text-end","id":"text-1"}`) + ev(`{"type":"finish-step"}`) +
		ev(`{"type":"finish","finishReason":"stop","messageMetadata":{"threadId":"thread_0123","usage":{"inputTokens":10,"outputTokens":17,"totalTokens":27}}}`) +
		ev(`[DONE]`))
}()

// conversationV2 is conversation20 as an AI SDK 5+ client sends it to v2 (parts, no content).
func conversationV2(b *testing.B) []byte {
	var body map[string]any
	if err := json.Unmarshal(conversation20(b), &body); err != nil {
		b.Fatal(err)
	}
	for _, m := range body["messages"].([]any) {
		delete(m.(map[string]any), "content")
	}
	body["id"], body["trigger"] = "chat-bench", "submit-message"
	v2, err := json.Marshal(body)
	if err != nil {
		b.Fatal(err)
	}
	return v2
}

// BenchmarkGatewayRefusedBadKey is the 401 fast path (a key of neither family).
func BenchmarkGatewayRefusedBadKey(b *testing.B) {
	gw := benchGateway(b, newCannedTransport(http.StatusCreated, "application/json", []byte(`{}`), 2))
	runChain(b, gw, http.MethodPost, "/v2/agent/proj-bench/job", "nope_0123456789abcdef", []byte(`{"prompt":"x"}`), http.StatusUnauthorized)
}

func conversation20(b *testing.B) []byte {
	type part struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	type msg struct {
		ID      string `json:"id"`
		Role    string `json:"role"`
		Content string `json:"content"`
		Parts   []part `json:"parts"`
	}
	var msgs []msg
	for i := 0; i < 20; i++ {
		role, text := "user", fmt.Sprintf("Question %d: how do I rotate an API key without downtime, and does the old key keep working for a while?", i)
		if i%2 == 1 {
			role = "assistant"
			text = fmt.Sprintf("Answer %d: create a second key on the dashboard, deploy it, then revoke the first one; both keys work until you revoke. See the API keys page for details.", i)
		}
		msgs = append(msgs, msg{ID: fmt.Sprintf("msg-%02d", i), Role: role, Content: text, Parts: []part{{Type: "text", Text: text}}})
	}
	out, err := json.Marshal(map[string]any{
		"fp": "anonymous", "threadId": nil, "retrievalPageSize": 5, "filter": nil,
		"currentPath": "/docs/api-keys", "context": []any{}, "messages": msgs,
	})
	if err != nil {
		b.Fatal(err)
	}
	return out
}

// BenchmarkGatewayAgentJobTraced is BenchmarkGatewayAgentJob with tracing on at ratio 1.0
// (server, ratelimit and upstream client spans, into a batch processor and an exporter that
// discards): the CPU and allocations tracing adds per request.
func BenchmarkGatewayAgentJobTraced(b *testing.B) {
	benchAgentJobSampled(b, sdktrace.AlwaysSample())
}

// BenchmarkGatewayAgentJobTracedDefault is BenchmarkGatewayAgentJobTraced at the default
// sampler (parent-based, one new trace in a hundred): what tracing costs as shipped, mostly
// the spans that are not sampled.
func BenchmarkGatewayAgentJobTracedDefault(b *testing.B) {
	benchAgentJobSampled(b, sdktrace.ParentBased(sdktrace.TraceIDRatioBased(tracing.DefaultSampleRatio)))
}

// benchAgentJobSampled runs agent jobs through a gateway traced with sampler.
func benchAgentJobSampled(b *testing.B, sampler sdktrace.Sampler) {
	tr := newCannedTransport(http.StatusCreated, "application/json",
		[]byte(`{"id":"job_0123456789","status":"active","createdAt":"2026-01-01T00:00:00Z"}`), -2)
	tr.resp.ContentLength = int64(len(tr.data))
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discardExporter{}), sdktrace.WithSampler(sampler))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	gw := benchGatewayTraced(b, tr, &tracing.Spans{Tracer: tp.Tracer("bench"), Propagator: propagation.TraceContext{}, TrustIncoming: true}, tp)
	body := []byte(`{"prompt":"Write a migration guide from SDK v1 to v2, with code samples for Go and Python.","model":"default","metadata":{"source":"bench"}}`)
	runChain(b, gw, http.MethodPost, "/v2/agent/proj-bench/job", benchAdminKey, body, http.StatusCreated)
}

type discardExporter struct{}

func (discardExporter) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discardExporter) Shutdown(context.Context) error                             { return nil }

// BenchmarkBareReverseProxyAgentJob is the reference for BenchmarkGatewayAgentJob: the same
// request and canned answer through a plain httputil.ReverseProxy (no auth, validation,
// limits, metrics or log line), so the difference between the two is what the gateway's own
// checks cost per request, transport and network aside.
func BenchmarkBareReverseProxyAgentJob(b *testing.B) {
	tr := newCannedTransport(http.StatusCreated, "application/json",
		[]byte(`{"id":"job_0123456789","status":"active","createdAt":"2026-01-01T00:00:00Z"}`), -2)
	tr.resp.ContentLength = int64(len(tr.data))
	target, err := url.Parse("http://upstream.invalid:9000")
	if err != nil {
		b.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = tr
	rp.BufferPool = &benchBuffers{p: sync.Pool{New: func() any { return new([32 << 10]byte) }}}
	body := []byte(`{"prompt":"Write a migration guide from SDK v1 to v2, with code samples for Go and Python.","model":"default","metadata":{"source":"bench"}}`)
	runChain(b, rp, http.MethodPost, "/v2/agent/proj-bench/job", benchAdminKey, body, http.StatusCreated)
}

// benchBuffers pools fixed-size arrays, so Put does not allocate.
type benchBuffers struct{ p sync.Pool }

func (p *benchBuffers) Get() []byte  { return p.p.Get().(*[32 << 10]byte)[:] }
func (p *benchBuffers) Put(b []byte) { p.p.Put((*[32 << 10]byte)(b)) }

// benchGatewayExample is benchGateway on config.example.yaml (its routes' six limits on the
// streamed routes: requests, tokens with a reserve, hence a hold settled when the answer ends,
// and a streams slot), with every limit raised so that nothing is denied.
func benchGatewayExample(b *testing.B, tr http.RoundTripper) *proxy.Gateway {
	b.Helper()
	cfg, err := config.Load("../config.example.yaml", nil)
	if err != nil {
		b.Fatal(err)
	}
	cfg.Upstream.URL = "http://upstream.invalid:9000"
	never := int64(1) << 40
	for name, l := range cfg.Limits {
		l.Limit = &never
		cfg.Limits[name] = l
	}
	if err := cfg.Validate(); err != nil {
		b.Fatal(err)
	}
	enc := zapcore.NewJSONEncoder(zap.NewProductionEncoderConfig())
	log := zap.New(zapcore.NewCore(enc, zapcore.AddSync(io.Discard), zapcore.InfoLevel))
	m := metrics.New(prometheus.NewRegistry())
	eng := engine.New(engine.Options{Limiter: limits.NewMemory(), Metrics: m, Logger: log})
	gw, err := proxy.New(proxy.Options{
		Config:    cfg,
		Logger:    log,
		Metrics:   m,
		Transport: tr,
		Engine:    eng,
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = eng.Close(context.Background()) })
	return gw
}

// BenchmarkGatewayAssistantMessageExample is BenchmarkGatewayAssistantMessage on the example
// config's limits: the hold, its refresh timer and the settle after the answer included.
func BenchmarkGatewayAssistantMessageExample(b *testing.B) {
	tr := newCannedTransport(http.StatusOK, "text/plain; charset=utf-8", v1Stream, -1)
	gw := benchGatewayExample(b, tr)
	runChain(b, gw, http.MethodPost, "/discovery/v1/assistant/bench-docs/message", benchAssistantKey, conversation20(b), http.StatusOK)
}

// BenchmarkGatewayAssistantMessageV2Example is BenchmarkGatewayAssistantMessageV2 on the
// example config's limits.
func BenchmarkGatewayAssistantMessageV2Example(b *testing.B) {
	tr := newCannedTransport(http.StatusOK, "text/event-stream", v2Stream, -1)
	tr.header.Set("X-Vercel-AI-UI-Message-Stream", "v1")
	gw := benchGatewayExample(b, tr)
	runChain(b, gw, http.MethodPost, "/discovery/v2/assistant/bench-docs/message", benchAssistantKey, conversationV2(b), http.StatusOK)
}
