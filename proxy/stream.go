package proxy

import (
	"io"
	"net/http"

	"go.uber.org/zap"

	"github.com/docsgate/gateway/limits"
	"github.com/docsgate/gateway/stream"
)

// identityOnly is the Accept-Encoding of the upstream requests of stream routes, shared
// read-only by all of them: the gateway reads their answers (package stream), so it asks for
// them in clear (one content-coded all the same is decoded as it passes: decodeAnswer).
var identityOnly = []string{"identity"}

// startTap puts the tap the response's protocol calls for on body (the scope holds both
// taps, so a stream allocates none). An answer the gateway cannot read (readable false: a
// content coding it cannot decode) gets an Opaque tap.
func startTap(s *scope, h http.Header, body io.ReadCloser, readable bool) io.ReadCloser {
	var cut *stream.Cutoff
	var check stream.Checker
	if s.cut.Len() > 0 {
		cut, check = &s.cut, &s.tapBody
	}
	switch {
	case !readable:
		s.tap = stream.NewOpaque(check)
	case stream.IsUIMessageStream(h):
		s.uiTap.Reset(check)
		s.tap = &s.uiTap
	default:
		s.dataTap.Reset(check)
		s.tap = &s.dataTap
	}
	s.tapBody.Reset(body, s.tap, cut, s.promptBytes, &s.rw.ended)
	return &s.tapBody
}

// decodeAnswer prepares a streamed answer that names a Content-Encoding for its tap: one in
// codings the gateway knows is decoded from its first read on (its coding headers removed,
// since the client gets it in clear); the answer is counted in gateway_stream_encoded_total.
// It reports whether the tap can read the answer.
func (s *scope) decodeAnswer(res *http.Response) bool {
	cs, label, ok := stream.Codings(res.Header["Content-Encoding"])
	if label != 0 {
		s.route.metrics.StreamEncoded(label.String())
		s.encoding = label
	}
	if !ok {
		return false
	}
	delete(res.Header, "Content-Encoding")
	if len(cs) > 0 {
		// The length, if any, was the encoded one.
		delete(res.Header, "Content-Length")
		res.ContentLength = -1
		s.upBody.ReadCloser = stream.NewDecoder(s.upBody.ReadCloser, cs)
	}
	return true
}

// keepCutoffs records, for a streamed answer, the held tokens limits that have cutoff. Call it
// after keepHeld.
func (q *quota) keepCutoffs(s *scope, set *routeSet) {
	if !s.route.Stream {
		return
	}
	for _, h := range s.adm.Held() {
		for _, l := range set.Limits {
			if l.Cutoff && l.Rule == h.Rule {
				if s.cut.Len() == 0 { // the scope is new: its cutoff was empty
					s.cut.Reset(cutGrower{q, s}, q.allowOnError)
				}
				s.cut.Add(h)
				break
			}
		}
	}
}

// cutGrower grows the holds of one answer with cutoff limits (stream.Grower) through the
// engine, and logs a growth the store could not make.
type cutGrower struct {
	q *quota
	s *scope
}

func (c cutGrower) Grow(h limits.Hit, want int64) (int64, error) {
	got, err := c.q.engine.Grow(&c.s.adm, h, want)
	if err != nil {
		c.q.log.Warn("growing the token hold of an answer in flight failed", zap.String("route", c.s.route.Name),
			zap.String("limit", h.Rule.Name), zap.String("request_id", c.s.requestID), zap.Error(err))
	}
	return got, err
}
