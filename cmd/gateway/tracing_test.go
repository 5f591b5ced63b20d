package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// otlpReceiver is a collector stand-in: it records every span exported to it, and the raw
// bytes that arrived (to search them for secrets), over OTLP/HTTP (protobuf) or OTLP/gRPC.
type otlpReceiver struct {
	coltracepb.UnimplementedTraceServiceServer
	mu    sync.Mutex
	spans []*tracepb.Span
	raw   bytes.Buffer
	addr  string
	stop  func()
}

func (o *otlpReceiver) add(req *coltracepb.ExportTraceServiceRequest, raw []byte) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.raw.Write(raw)
	for _, rs := range req.ResourceSpans {
		for _, ss := range rs.ScopeSpans {
			o.spans = append(o.spans, ss.Spans...)
		}
	}
}

func (o *otlpReceiver) Export(_ context.Context, req *coltracepb.ExportTraceServiceRequest) (*coltracepb.ExportTraceServiceResponse, error) {
	raw, _ := proto.Marshal(req)
	o.add(req, raw)
	return &coltracepb.ExportTraceServiceResponse{}, nil
}

func startOTLPHTTP(t *testing.T) *otlpReceiver {
	o := &otlpReceiver{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
			http.Error(w, "want POST /v1/traces, protobuf", http.StatusBadRequest)
			return
		}
		var req coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		o.add(&req, append(body, []byte(r.Header.Get("X-Collector-Token"))...))
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		_, _ = w.Write(out)
	})}
	go srv.Serve(ln)
	o.addr, o.stop = ln.Addr().String(), func() { srv.Close() }
	t.Cleanup(o.stop)
	return o
}

func startOTLPGRPC(t *testing.T) *otlpReceiver {
	o := &otlpReceiver{}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	coltracepb.RegisterTraceServiceServer(srv, o)
	go srv.Serve(ln)
	o.addr, o.stop = ln.Addr().String(), srv.Stop
	t.Cleanup(o.stop)
	return o
}

func (o *otlpReceiver) all() []*tracepb.Span {
	o.mu.Lock()
	defer o.mu.Unlock()
	return append([]*tracepb.Span(nil), o.spans...)
}

// waitSpans waits until a span satisfies match.
func (o *otlpReceiver) waitSpan(t *testing.T, what string, match func(*tracepb.Span) bool) *tracepb.Span {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, s := range o.all() {
			if match(s) {
				return s
			}
		}
		if time.Now().After(deadline) {
			var names []string
			for _, s := range o.all() {
				names = append(names, s.Name)
			}
			t.Fatalf("no span %s among %v", what, names)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func attr(s *tracepb.Span, key string) *commonpb.AnyValue {
	for _, kv := range s.Attributes {
		if kv.Key == key {
			return kv.Value
		}
	}
	return nil
}

func attrString(s *tracepb.Span, key string) string {
	if v := attr(s, key); v != nil {
		if sv, ok := v.Value.(*commonpb.AnyValue_StringValue); ok {
			return sv.StringValue
		}
		if iv, ok := v.Value.(*commonpb.AnyValue_IntValue); ok {
			return fmt.Sprint(iv.IntValue)
		}
	}
	return ""
}

// traceUpstream records the traceparent each request brings, and streams assistant answers
// part by part, noting when the last part left.
type traceUpstream struct {
	mu       sync.Mutex
	parents  map[string]string // path -> traceparent
	lastPart time.Time
	url      string
}

func newTraceUpstream(t *testing.T) *traceUpstream {
	u := &traceUpstream{parents: map[string]string{}}
	u.url = serveHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		u.mu.Lock()
		u.parents[r.URL.Path] = r.Header.Get("Traceparent")
		u.mu.Unlock()
		if strings.HasPrefix(r.URL.Path, "/discovery/") {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			parts := []string{"f:{\"messageId\":\"m\"}\n", "0:\"a\"\n", "0:\"b\"\n",
				"e:{\"finishReason\":\"stop\",\"usage\":{\"promptTokens\":7,\"completionTokens\":9},\"isContinued\":false}\n",
				"d:{\"finishReason\":\"stop\",\"usage\":{\"promptTokens\":7,\"completionTokens\":9}}\n"}
			if strings.HasPrefix(r.URL.Path, "/discovery/v2/") { // the same answer as a UI message stream
				w.Header().Set("Content-Type", "text/event-stream")
				parts = []string{"data: {\"type\":\"start\"}\n\n", "data: {\"type\":\"text-delta\",\"id\":\"t\",\"delta\":\"a\"}\n\n",
					"data: {\"type\":\"text-delta\",\"id\":\"t\",\"delta\":\"b\"}\n\n",
					"data: {\"type\":\"finish\",\"finishReason\":\"stop\",\"messageMetadata\":{\"usage\":{\"inputTokens\":7,\"outputTokens\":9}}}\n\n",
					"data: [DONE]\n\n"}
			}
			fl := w.(http.Flusher)
			for _, part := range parts {
				fmt.Fprint(w, part)
				fl.Flush()
				time.Sleep(30 * time.Millisecond)
			}
			u.mu.Lock()
			u.lastPart = time.Now()
			u.mu.Unlock()
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(201)
		fmt.Fprint(w, `{"id":"j"}`)
	}))
	return u
}

func (u *traceUpstream) parent(path string) string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.parents[path]
}

const clientTrace = "0af7651916cd43dd8448eb211c80319c"
const clientSpan = "b7ad6b7169203331"

func sendTraced(t *testing.T, p *proc, path, key, body, traceparent string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://"+p.public+path+"?session=query-secret-value", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "trace-test/1.0")
	if traceparent != "" {
		req.Header.Set("Traceparent", traceparent)
		req.Header.Set("Baggage", "tenant=acme")
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res
}

// One trace per request, from the client through the gateway to the upstream, over OTLP/HTTP
// and OTLP/gRPC: names, attributes, parent links, the upstream's traceparent, a stream's span
// ending after its last part, and no key bytes anywhere in what was exported.
func TestTracingEndToEnd(t *testing.T) {
	t.Parallel()
	for _, proto := range []string{"http/protobuf", "grpc"} {
		t.Run(proto, func(t *testing.T) {
			var rcv *otlpReceiver
			endpoint := ""
			if proto == "grpc" {
				rcv = startOTLPGRPC(t)
				endpoint = rcv.addr
			} else {
				rcv = startOTLPHTTP(t)
				endpoint = "http://" + rcv.addr
			}
			up := newTraceUpstream(t)
			p := startGateway(t, up.url, fmt.Sprintf(`tracing:
  enabled: true
  protocol: %s
  endpoint: %q
  insecure: true
  sample_ratio: 1
  headers: {X-Collector-Token: collector-secret-token}
orgs: {acme: [acme-docs]}
`, proto, endpoint))
			const agentKey = "svc_tracedAgentKey0123456789"
			const asstKey = "svc_dsc_tracedAssistantKey012345"
			tp := "00-" + clientTrace + "-" + clientSpan + "-01"
			if res := sendTraced(t, p, "/v2/agent/tproj/job", agentKey, `{"prompt":"trace me"}`, tp); res.StatusCode != 201 {
				t.Fatalf("agent job: %d", res.StatusCode)
			}
			server := rcv.waitSpan(t, "POST /v2/agent/{projectId}/job", func(s *tracepb.Span) bool {
				return s.Name == "POST /v2/agent/{projectId}/job" && s.Kind == tracepb.Span_SPAN_KIND_SERVER
			})
			if hex.EncodeToString(server.TraceId) != clientTrace || hex.EncodeToString(server.ParentSpanId) != clientSpan {
				t.Fatalf("server span not in the client's trace: trace %x parent %x", server.TraceId, server.ParentSpanId)
			}
			for k, want := range map[string]string{
				"http.request.method": "POST", "http.route": "/v2/agent/{projectId}/job", "http.response.status_code": "201",
				"url.scheme": "http", "client.address": "127.0.0.1", "user_agent.original": "trace-test/1.0",
				"server.address": "127.0.0.1", "gateway.route": "agent_job", "gateway.ratelimit.decision": "allowed",
			} {
				if got := attrString(server, k); got != want {
					t.Errorf("server span %s = %q, want %q", k, got, want)
				}
			}
			limit := rcv.waitSpan(t, "ratelimit", func(s *tracepb.Span) bool { return s.Name == "ratelimit" && bytes.Equal(s.TraceId, server.TraceId) })
			if !bytes.Equal(limit.ParentSpanId, server.SpanId) || attr(limit, "gateway.ratelimit.limits") == nil {
				t.Fatalf("ratelimit span: parent %x (server %x), attributes %v", limit.ParentSpanId, server.SpanId, limit.Attributes)
			}
			client := rcv.waitSpan(t, "upstream client", func(s *tracepb.Span) bool {
				return s.Kind == tracepb.Span_SPAN_KIND_CLIENT && bytes.Equal(s.ParentSpanId, server.SpanId) && s.Name != "ratelimit"
			})
			// The upstream's traceparent: the same trace, with the client span as parent.
			want := fmt.Sprintf("00-%s-%x-01", clientTrace, client.SpanId)
			if got := up.parent("/v2/agent/tproj/job"); got != want {
				t.Fatalf("upstream traceparent %q, want %q", got, want)
			}

			// An assistant stream: the span ends after the last part, with its events, the same
			// on v1 (the data stream) and v2 (the UI message stream).
			for _, c := range []struct{ path, route, body string }{
				{"/discovery/v1/assistant/acme-docs/message", "POST /discovery/v1/assistant/{domain}/message", `{"fp":"x","messages":[]}`},
				{"/discovery/v2/assistant/acme-docs/message", "POST /discovery/v2/assistant/{domain}/message",
					`{"fp":"x","messages":[{"id":"1","role":"user","parts":[{"type":"text","text":"hi"}]}]}`},
			} {
				if res := sendTraced(t, p, c.path, asstKey, c.body, ""); res.StatusCode != 200 {
					t.Fatalf("assistant %s: %d", c.path, res.StatusCode)
				}
				stream := rcv.waitSpan(t, "assistant server span", func(s *tracepb.Span) bool {
					return s.Name == c.route && s.Kind == tracepb.Span_SPAN_KIND_SERVER
				})
				up.mu.Lock()
				last := up.lastPart
				up.mu.Unlock()
				if end := time.Unix(0, int64(stream.EndTimeUnixNano)); end.Before(last) {
					t.Fatalf("%s: stream span ended at %v, before the last part at %v", c.path, end, last)
				}
				if attrString(stream, "gateway.org") != "acme" {
					t.Errorf("gateway.org = %q", attrString(stream, "gateway.org"))
				}
				events := map[string]*tracepb.Span_Event{}
				for _, e := range stream.Events {
					events[e.Name] = e
				}
				fin := events["finish"]
				if events["first_byte"] == nil || fin == nil {
					t.Fatalf("%s: stream events %v", c.path, stream.Events)
				}
				got := map[string]string{}
				for _, kv := range fin.Attributes {
					got[kv.Key] = fmt.Sprint(kv.Value.GetStringValue(), kv.Value.GetIntValue())
				}
				if got["finish_reason"] != "stop0" || got["gen_ai.usage.input_tokens"] != "7" || got["gen_ai.usage.output_tokens"] != "9" {
					t.Fatalf("%s: finish event %v", c.path, got)
				}
			}

			// A refusal: error.type and no upstream span.
			if res := sendTraced(t, p, "/v2/agent/tproj/job", "svc_dsc_wrongfamily01234567", `{"prompt":"x"}`, ""); res.StatusCode != 403 {
				t.Fatalf("wrong key: %d", res.StatusCode)
			}
			rcv.waitSpan(t, "refused span", func(s *tracepb.Span) bool {
				return s.Kind == tracepb.Span_SPAN_KIND_SERVER && attrString(s, "error.type") == "wrong_key_type" && attrString(s, "http.response.status_code") == "403"
			})

			// No key, digest of a key or query string in anything exported.
			rcv.mu.Lock()
			raw := rcv.raw.String()
			rcv.mu.Unlock()
			for _, secret := range []string{agentKey, asstKey, "svc_dsc_wrongfamily01234567", sha256hex(agentKey), sha256hex(asstKey), "query-secret-value"} {
				for i := 0; i+12 <= len(secret); i++ {
					if strings.Contains(raw, secret[i:i+12]) {
						t.Fatalf("exported data holds %q (part of a secret)", secret[i:i+12])
					}
				}
			}
			if proto == "http/protobuf" && !strings.Contains(raw, "collector-secret-token") {
				t.Errorf("tracing.headers did not reach the collector")
			}
			// The access log carries the trace and span ids.
			if !strings.Contains(p.out.String(), `"trace_id":"`+clientTrace+`"`) {
				t.Errorf("no trace_id in the access log")
			}
		})
	}
}

// trust_incoming: false starts a new trace and links it to the client's, and the upstream
// joins the gateway's trace, not the client's.
func TestTracingUntrustedIncoming(t *testing.T) {
	t.Parallel()
	rcv := startOTLPHTTP(t)
	up := newTraceUpstream(t)
	p := startGateway(t, up.url, fmt.Sprintf("tracing: {enabled: true, endpoint: %q, trust_incoming: false, sample_ratio: 1}\n", "http://"+rcv.addr))
	sendTraced(t, p, "/v2/agent/untrusted/job", "svc_untrusted0123456789", `{"prompt":"x"}`, "00-"+clientTrace+"-"+clientSpan+"-01")
	s := rcv.waitSpan(t, "server span", func(s *tracepb.Span) bool { return s.Kind == tracepb.Span_SPAN_KIND_SERVER })
	if hex.EncodeToString(s.TraceId) == clientTrace || len(s.ParentSpanId) != 0 {
		t.Fatalf("untrusted context continued: trace %x parent %x", s.TraceId, s.ParentSpanId)
	}
	if len(s.Links) != 1 || hex.EncodeToString(s.Links[0].TraceId) != clientTrace || hex.EncodeToString(s.Links[0].SpanId) != clientSpan {
		t.Fatalf("links %v", s.Links)
	}
	if got := up.parent("/v2/agent/untrusted/job"); !strings.Contains(got, hex.EncodeToString(s.TraceId)) || strings.Contains(got, clientTrace) {
		t.Fatalf("upstream traceparent %q", got)
	}
}

// A collector that dies mid-load changes no answer: every request is served, none waits for
// the exporter, and the spans that could not be exported are counted as dropped.
func TestTracingCollectorDown(t *testing.T) {
	rcv := startOTLPHTTP(t)
	up := newTraceUpstream(t)
	p := startGateway(t, up.url, fmt.Sprintf("tracing: {enabled: true, endpoint: %q, sample_ratio: 1}\n", "http://"+rcv.addr))
	codes := map[int]int{}
	var before, after []time.Duration
	for i := range 400 {
		if i == 100 {
			rcv.stop() // the collector dies
		}
		start := time.Now()
		res := sendTraced(t, p, fmt.Sprintf("/v2/agent/down%d/job", i%10), "svc_collectordown012345", `{"prompt":"x"}`, "")
		if i < 100 {
			before = append(before, time.Since(start))
		} else {
			after = append(after, time.Since(start))
		}
		codes[res.StatusCode]++
	}
	if codes[201] != 400 {
		t.Fatalf("answers with the collector down: %v", codes)
	}
	dropped := waitMetric(t, p, "gateway_trace_spans_dropped_total", 20*time.Second, func(v float64) bool { return v > 0 })
	// Reported, not asserted (timing on a shared machine): no request waits for the exporter.
	median := func(d []time.Duration) time.Duration {
		slices.Sort(d)
		return d[len(d)/2]
	}
	t.Logf("collector down after 100 of 400 requests: all answered 201, %v spans dropped and counted; median answer %v with the collector, %v without",
		dropped, median(before), median(after))
}

// The request histogram carries the trace id as an exemplar when the scraper asks for
// OpenMetrics, and SIGTERM exports the spans still queued before the process exits.
func TestTracingExemplarsAndShutdownFlush(t *testing.T) {
	t.Parallel()
	rcv := startOTLPHTTP(t)
	up := newTraceUpstream(t)
	p := startGateway(t, up.url, fmt.Sprintf("tracing: {enabled: true, endpoint: %q}\n", "http://"+rcv.addr))
	sendTraced(t, p, "/v2/agent/exemplar/job", "svc_exemplar0123456789", `{"prompt":"x"}`, "00-"+clientTrace+"-"+clientSpan+"-01")

	req, _ := http.NewRequest("GET", "http://"+p.admin+"/metrics", nil)
	req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if !strings.Contains(res.Header.Get("Content-Type"), "openmetrics") ||
		!strings.Contains(string(body), `# {trace_id="`+clientTrace+`"}`) {
		t.Fatalf("no exemplar with the trace id in the OpenMetrics exposition (%s)", res.Header.Get("Content-Type"))
	}

	// With no sample_ratio, one new trace in a hundred is sampled: of 300 requests without a
	// traceparent, a few.
	for i := range 300 {
		sendTraced(t, p, fmt.Sprintf("/v2/agent/unsampled%d/job", i%10), "svc_exemplar0123456789", `{"prompt":"x"}`, "")
	}
	// Spans of requests answered just before SIGTERM reach the collector: the batch timeout
	// (1 s) has not passed, so only the shutdown flush can send them. Their clients ask for a
	// trace (a sampled traceparent), which is followed whatever the ratio.
	for i := range 5 {
		sendTraced(t, p, fmt.Sprintf("/v2/agent/flush%d/job", i), "svc_exemplar0123456789", `{"prompt":"x"}`,
			fmt.Sprintf("00-%032x-%s-01", i+1, clientSpan))
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if code := p.wait(t, 30*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	asked, unasked := 0, 0
	for _, s := range rcv.all() {
		if s.Kind != tracepb.Span_SPAN_KIND_SERVER {
			continue
		}
		if len(s.ParentSpanId) > 0 {
			asked++
		} else {
			unasked++
		}
	}
	t.Logf("%d of 300 requests without a traceparent sampled", unasked)
	if asked != 6 || unasked > 30 {
		t.Fatalf("server spans at the collector after shutdown: %d with a sampled parent (want 6), %d of 300 new traces (want about 3)", asked, unasked)
	}
}
