package proxy

import (
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/docsgate/gateway/stream"
)

// finish writes the access-log line and the metrics of a request; it also runs when a stream
// is aborted (the reverse proxy panics with http.ErrAbortHandler), since it is deferred.
func (g *Gateway) finish(s *scope, r *http.Request) {
	m := s.route.metrics
	m.Inflight.Dec()
	elapsed := time.Since(s.start)
	status := s.w.status
	if status == 0 {
		status = 499 // nothing was sent: the client went away first
	}
	m.Request(status)
	m.ObserveDuration(elapsed.Seconds(), s.traceID())
	finish := ""
	var out *stream.Outcome
	if s.tap != nil {
		out = s.tap.Outcome()
		finish = out.Result()
		m.StreamFinished(finish)
		if !s.w.firstByte.IsZero() {
			m.FirstByte.Observe(s.w.firstByte.Sub(s.start).Seconds())
		}
		m.StreamDuration.Observe(elapsed.Seconds())
		if cut := s.cut.Limit(); cut != "" {
			m.StreamCutoff(cut)
		}
	}
	g.quota.settle(s, out)
	if s.span != nil {
		endSpan(s, status, out)
	}
	ce := g.accessLog.Check(zap.InfoLevel, "request")
	if ce == nil {
		return
	}
	fp := g.logFields.Get().(*[]zap.Field)
	defer g.logFields.Put(fp)
	fields := append((*fp)[:0],
		zap.String("route", s.route.Name),
		zap.String("method", r.Method),
		zap.String("path", r.URL.Path),
		zap.Int("status", status),
		zap.Duration("duration", elapsed),
		zap.String("request_id", s.requestID),
		zap.String("client_ip", s.clientIPString()),
		zap.Int("bytes_in", s.bodyBytes),
		zap.Int64("bytes_out", s.w.bytes),
	)
	if s.code != "" {
		fields = append(fields, zap.String("code", s.code))
	}
	if s.field != "" {
		fields = append(fields, zap.String("field", s.field))
	}
	if s.deniedBy != "" {
		fields = append(fields, zap.String("denied_by", s.deniedBy))
	}
	if s.shadowDenied != "" {
		fields = append(fields, zap.String("shadow_denied", s.shadowDenied))
	}
	if s.limitErr {
		fields = append(fields, zap.Bool("limiter_error", true))
	}
	if s.refund != "" {
		fields = append(fields, zap.String("refund", s.refund))
	}
	if s.upstreamStatus != 0 {
		fields = append(fields, zap.Int("upstream_status", s.upstreamStatus), zap.Duration("upstream_time", s.upstreamTime))
	}
	if s.upstreamKind != "" {
		fields = append(fields, zap.String("upstream_error", s.upstreamKind))
	}
	if s.stalled {
		fields = append(fields, zap.Bool("stalled", true))
	}
	if cut := s.cut.Limit(); cut != "" {
		fields = append(fields, zap.String("cutoff", cut))
	}
	if finish != "" {
		fields = append(fields, zap.String("finish_reason", finish))
	}
	if s.encoding != 0 {
		fields = append(fields, zap.String("answer_encoding", s.encoding.String()))
	}
	if s.span != nil {
		if sc := s.span.SpanContext(); sc.IsValid() {
			id := s.traceID() // "" when not sampled: then made here, as before
			if id == "" {
				id = sc.TraceID().String()
			}
			fields = append(fields, zap.String("trace_id", id), zap.String("span_id", sc.SpanID().String()))
		}
	}
	ce.Write(fields...)
}
