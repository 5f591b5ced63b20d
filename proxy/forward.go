package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"go.uber.org/zap"

	"github.com/docsgate/gateway/apierror"
	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/h1"
	"github.com/docsgate/gateway/internal/bufpool"
	"github.com/docsgate/gateway/internal/hopheaders"
)

// newTransport is the transport upstream.transport names: the gateway's own HTTP/1.1 pool
// for a cleartext upstream, or net/http's (see newStandardTransport), which an https
// upstream always gets: TLS and HTTP/2 stay the standard library's.
func newTransport(u config.Upstream, upstream *url.URL) http.RoundTripper {
	if u.Transport == "standard" || upstream.Scheme != "http" {
		return newStandardTransport(u)
	}
	return h1.New(h1.Options{
		DialTimeout:           u.DialTimeout,
		ResponseHeaderTimeout: u.Timeout,
		MaxIdleConns:          u.MaxIdleConns,
		IdleConnTimeout:       u.IdleTimeout,
	})
}

// newStandardTransport is a cloned-default transport tuned for one upstream: many idle
// connections, no environment proxies, and no transparent compression, which would re-frame
// streams.
func newStandardTransport(u config.Upstream) *http.Transport {
	return &http.Transport{
		Proxy: nil,
		DialContext: (&net.Dialer{
			Timeout:   u.DialTimeout,
			KeepAlive: 30 * time.Second,
		}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          u.MaxIdleConns,
		MaxIdleConnsPerHost:   u.MaxIdleConns,
		IdleConnTimeout:       u.IdleTimeout,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
		ResponseHeaderTimeout: u.Timeout,
		DisableCompression:    true,
	}
}

// newReverseProxy builds the proxy of stream: true routes (stream) or of the others.
func (g *Gateway) newReverseProxy(t http.RoundTripper, stream bool) *httputil.ReverseProxy {
	p := &httputil.ReverseProxy{
		Rewrite:        g.rewrite,
		Transport:      t,
		BufferPool:     bufpool.NewFixed(copyBufferSize),
		ModifyResponse: g.modifyResponse,
		ErrorHandler:   g.proxyError,
		ErrorLog:       zap.NewStdLog(g.log.Named("reverseproxy")),
	}
	if stream {
		// -1 flushes after every write: a streamed part reaches the client as soon as the
		// upstream sends it, whatever its Content-Type or Content-Length. Other routes keep
		// the default (0), which still flushes answers of unknown length at once but writes
		// a short JSON answer in one go instead of headers and body separately. A stream
		// holds its copy buffer as long as it runs, and its parts are small (a token or a
		// few, a finish part of a hundred bytes): a small buffer keeps idle streams cheap, and
		// a burst larger than the buffer still goes out whole, in more than one write.
		p.FlushInterval = -1
		p.BufferPool = bufpool.NewFixed(streamBufferSize)
	}
	return p
}

// forward hands a validated request to the reverse proxy.
func (g *Gateway) forward(s *scope, r *http.Request) {
	s.forwarded = time.Since(s.start)
	if len(s.adm.Held()) > 0 {
		g.quota.engine.KeepHolds(&s.adm, s.route.Name, s.trackProgress())
	}
	p := g.proxy
	if s.route.Stream {
		p = g.streamProxy
		s.rw.watch.Start(g.writeStall, s.rw.ResponseWriter)
		defer s.rw.watch.Stop() // after bodyBroke, before the handler returns
	}
	defer g.bodyBroke(s, r)
	p.ServeHTTP(s.w, r.WithContext(context.WithValue(r.Context(), scopeKey{}, s)))
}

// bodyBroke handles a response body that failed after the headers were sent, which the
// reverse proxy signals by panicking with http.ErrAbortHandler. The failure is counted and
// logged either way. A stream then ends cleanly: the client keeps every part it got, sees a
// proper end of stream (without a finish part, so the chat SDK knows it is incomplete), and
// the connection stays usable. Any other response is aborted, so a truncated JSON body is
// never mistaken for a whole one.
func (g *Gateway) bodyBroke(s *scope, r *http.Request) {
	p := recover()
	if p == nil {
		return
	}
	if p != http.ErrAbortHandler {
		panic(p)
	}
	switch {
	case s.rw.watch.Stalled():
		// The client stopped reading (server.write_stall_timeout): settled, charged and
		// counted as a client that went away, and counted as a stall.
		s.stalled = true
		s.upstreamKind = "canceled"
		s.route.metrics.StreamStalled()
	case r.Context().Err() != nil || s.upBody.err == nil:
		// The client went away mid-body: its context is cancelled, or writing to it failed
		// while the upstream's body read fine.
		s.upstreamKind = "canceled"
	default:
		s.upstreamKind = "reset"
	}
	s.route.metrics.UpstreamError(s.upstreamKind)
	if !s.route.Stream {
		panic(p)
	}
}

// rewrite targets the upstream: path and query kept, Host set to the upstream's,
// Authorization forwarded, X-Forwarded-* set, X-Request-ID passed on, and what the gateway
// answers or decides itself removed (hopheaders.CleanOutgoing).
func (g *Gateway) rewrite(pr *httputil.ProxyRequest) {
	s := scopeFrom(pr.In.Context())
	pr.SetURL(g.upstream)
	hopheaders.CleanOutgoing(pr.Out.Header)
	s.setXForwarded(pr)
	if !s.route.Stream {
		// ReverseProxy wraps the outgoing body in its own no-op closer, which hides from
		// net/http that readBody's body is in memory: the headers would then be flushed in a
		// write of their own before the body. The body's Close already does nothing, so it
		// goes out unwrapped, headers and body in one write.
		pr.Out.Body = pr.In.Body
	}
	pr.Out.Header[requestIDHeader] = s.hdrValues[slotRequestID : slotRequestID+1 : slotRequestID+1]
	if s.route.Stream {
		// The gateway reads these answers: in clear (encoding.go).
		pr.Out.Header["Accept-Encoding"] = identityOnly
	}
}

// setXForwarded sets X-Forwarded-For, -Host and -Proto as ProxyRequest.SetXForwarded does,
// except that a chain sent by a peer that is not a trusted proxy is dropped, not believed
// and extended; the values live in the scope, so the common case allocates nothing.
func (s *scope) setXForwarded(pr *httputil.ProxyRequest) {
	h := pr.Out.Header
	peer, _, err := net.SplitHostPort(pr.In.RemoteAddr)
	switch {
	case err != nil:
		delete(h, "X-Forwarded-For")
	case s.trustedPeer && len(pr.In.Header["X-Forwarded-For"]) > 0:
		s.header(h, slotForwardedFor, "X-Forwarded-For", strings.Join(pr.In.Header["X-Forwarded-For"], ", ")+", "+peer)
	default:
		s.header(h, slotForwardedFor, "X-Forwarded-For", peer)
	}
	s.header(h, slotForwardedHost, "X-Forwarded-Host", pr.In.Host)
	proto := "http"
	if pr.In.TLS != nil {
		proto = "https"
	}
	s.header(h, slotForwardedProto, "X-Forwarded-Proto", proto)
}

var rateLimitHeaders = [...]string{hdrRateLimit, hdrPolicy, hdrLimit, hdrRemaining, hdrReset}

// accelBufferingNo tells a buffering reverse proxy in front (nginx) to pass a stream on as it
// comes; shared read-only by every stream's answer.
var accelBufferingNo = []string{"no"}

func (g *Gateway) modifyResponse(res *http.Response) error {
	s := scopeFrom(res.Request.Context())
	if s.route.Stream {
		// Whether the first part came with the headers (h1's bodies know; others are taken
		// as not yet there): see responseWriter.FlushError.
		rb, ok := res.Body.(interface{ Ready() bool })
		s.rw.withFirstPart = ok && rb.Ready()
	}
	// Watch the upstream body's reads, so a broken copy can be blamed on the right side.
	s.upBody.ReadCloser = res.Body
	res.Body = &s.upBody
	s.upstreamStatus = res.StatusCode
	s.upstreamTime = time.Since(s.start) - s.forwarded
	if res.StatusCode == http.StatusUnauthorized || res.StatusCode == http.StatusForbidden {
		g.upstreamRefusedKey(s, res.StatusCode)
	}
	s.route.metrics.UpstreamLatency.Observe(s.upstreamTime.Seconds())
	if s.route.cors {
		// The gateway owns CORS for these routes; the upstream's own headers would duplicate
		// ours, and browsers reject duplicates.
		for k := range res.Header {
			if strings.HasPrefix(k, "Access-Control-") {
				delete(res.Header, k)
			}
		}
	}
	// The gateway's request id is the one the client sees; a second one would confuse.
	delete(res.Header, requestIDHeader)
	if s.limited {
		// The gateway's rate-limit headers are already set; the upstream's would contradict them.
		for _, k := range rateLimitHeaders {
			delete(res.Header, k) // canonical keys: no need for Header.Del's canonicalization
		}
	}
	if !s.route.Stream && readWhole(res) {
		if err := s.readAnswer(res); err != nil {
			return err
		}
	}
	if s.route.Stream {
		res.Header["X-Accel-Buffering"] = accelBufferingNo // Set would allocate its slice
		if res.StatusCode/100 == 2 {
			s.rw.firstFlushAside = true
			readable := len(res.Header["Content-Encoding"]) == 0 || s.decodeAnswer(res)
			res.Body = startTap(s, res.Header, res.Body, readable)
		}
	}
	return nil
}

// proxyError maps a failed upstream exchange to the client's answer: 504 when the upstream
// did not answer in time, 502 when it could not be reached or broke off, nothing when the
// client itself went away.
func (g *Gateway) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	s := scopeFrom(r.Context())
	s.upstreamKind = upstreamErrorKind(r.Context(), err)
	s.route.metrics.UpstreamError(s.upstreamKind)
	if ce := g.log.Check(zap.DebugLevel, "upstream error"); ce != nil {
		ce.Write(zap.String("request_id", s.requestID), zap.Error(err))
	}
	switch s.upstreamKind {
	case "canceled":
		return
	case "timeout":
		s.fail(http.StatusGatewayTimeout, apierror.Body{
			Error: "The service took too long to answer. Please try again.",
			Code:  apierror.UpstreamTimeout,
		})
	default:
		s.fail(http.StatusBadGateway, apierror.Body{
			Error: "The service is temporarily unavailable. Please try again.",
			Code:  apierror.UpstreamUnavailable,
		})
	}
}

func upstreamErrorKind(ctx context.Context, err error) string {
	var ne net.Error
	switch {
	case ctx.Err() != nil && errors.Is(err, context.Canceled):
		return "canceled"
	case errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne) && ne.Timeout():
		return "timeout"
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return "reset"
	}
	return "unavailable"
}

// maxBufferedAnswer bounds the non-stream answers read whole before they are sent.
const maxBufferedAnswer = 1 << 20

// readWhole reports whether a non-stream answer is read whole before anything is sent, so an
// upstream that breaks off or mis-frames it mid-body (a reset, a bad chunk size) gets the
// client a clean 502, not a 201 with half a JSON object, and the upstream connection is free
// again at once: one of known length up to maxBufferedAnswer, or one of unknown length
// (chunked, or ending with the connection), read up to that bound and sent as it comes past
// it. Not one with announced trailers, which only a chunked answer can carry to the client.
func readWhole(res *http.Response) bool {
	return res.Body != http.NoBody && res.ContentLength != 0 && res.ContentLength <= maxBufferedAnswer && len(res.Trailer) == 0
}

// readAnswer reads a short answer whole (see readWhole).
func (s *scope) readAnswer(res *http.Response) error {
	var body []byte
	var err error
	if res.ContentLength > 0 {
		body = make([]byte, res.ContentLength)
		_, err = io.ReadFull(res.Body, body)
	} else {
		body, err = io.ReadAll(io.LimitReader(res.Body, maxBufferedAnswer+1))
		if err == nil && len(body) > maxBufferedAnswer {
			// Longer than the bound: what was read goes out first, the rest as it comes.
			res.Body = struct {
				io.Reader
				io.Closer
			}{io.MultiReader(bytes.NewReader(body), res.Body), res.Body}
			return nil
		}
		res.ContentLength = int64(len(body))
		res.Header["Content-Length"] = []string{strconv.Itoa(len(body))}
	}
	res.Body.Close()
	if err != nil {
		return fmt.Errorf("reading the upstream's answer: %w", err)
	}
	s.answer.reset(body, nil)
	res.Body = &s.answer
	return nil
}

// Copy buffer sizes of the two proxies.
const (
	copyBufferSize   = 32 << 10
	streamBufferSize = 2 << 10
)

// upstreamBody records the first failed read of the upstream's response body.
type upstreamBody struct {
	io.ReadCloser
	err error
}

func (b *upstreamBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && err != io.EOF && b.err == nil {
		b.err = err
	}
	return n, err
}
