package proxy

import (
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/docsgate/gateway/stream"
)

// finish writes the access-log line and the metrics of a request, and settles its account
// with the engine; it also runs when a stream is aborted (the reverse proxy panics with
// http.ErrAbortHandler), since it is deferred.
func (g *Gateway) finish(s *scope, r *http.Request) {
	elapsed := time.Since(s.start)
	status := s.w.status
	if status == 0 {
		status = 499 // nothing was sent: the client went away first
	}
	out := countRequest(s, status, elapsed)
	g.quota.settle(s, out)
	if s.span != nil {
		endSpan(s, status, out)
	}
	if ce := g.accessLog.Check(zap.InfoLevel, "request"); ce != nil {
		fp := g.logFields.Get().(*[]zap.Field)
		ce.Write(logFields((*fp)[:0], s, r, status, elapsed, out)...)
		g.logFields.Put(fp)
	}
}

// countRequest records the request in its route's metrics, a stream's outcome (nil for other
// answers) with them.
func countRequest(s *scope, status int, elapsed time.Duration) *stream.Outcome {
	m := s.route.metrics
	m.Inflight.Dec()
	m.Request(status)
	m.ObserveDuration(elapsed.Seconds(), s.traceID())
	if s.tap == nil {
		return nil
	}
	out := s.tap.Outcome()
	m.StreamFinished(out.Result())
	if !s.w.firstByte.IsZero() {
		m.FirstByte.Observe(s.w.firstByte.Sub(s.start).Seconds())
	}
	m.StreamDuration.Observe(elapsed.Seconds())
	if cut := s.cut.Limit(); cut != "" {
		m.StreamCutoff(cut)
	}
	return out
}

// logFields are the access-log line's fields, appended to fields: those of every request,
// then those that apply.
func logFields(fields []zap.Field, s *scope, r *http.Request, status int, elapsed time.Duration, out *stream.Outcome) []zap.Field {
	fields = append(fields,
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
	fields = decisionFields(fields, s)
	fields = answerFields(fields, s, out)
	if s.span != nil {
		if sc := s.span.SpanContext(); sc.IsValid() {
			id := s.traceID() // "" when not sampled: then made here, as before
			if id == "" {
				id = sc.TraceID().String()
			}
			fields = append(fields, zap.String("trace_id", id), zap.String("span_id", sc.SpanID().String()))
		}
	}
	return fields
}

// decisionFields are the fields of what the gateway decided itself, where they apply.
func decisionFields(fields []zap.Field, s *scope) []zap.Field {
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
	return fields
}

// answerFields are the fields of the upstream's answer and its stream, where they apply.
func answerFields(fields []zap.Field, s *scope, out *stream.Outcome) []zap.Field {
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
	if out != nil {
		fields = append(fields, zap.String("finish_reason", out.Result()))
	}
	if s.encoding != 0 {
		fields = append(fields, zap.String("answer_encoding", s.encoding.String()))
	}
	return fields
}
