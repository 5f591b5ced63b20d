package main

import (
	"context"
	"fmt"
	"os"

	"go.uber.org/zap"

	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/metrics"
	"github.com/docsgate/gateway/proxy"
	"github.com/docsgate/gateway/tracing"
)

// newTracing starts OpenTelemetry tracing when the config enables it (and OTEL_SDK_DISABLED
// does not disable it), and fills the proxy's options: the tracer, and an upstream transport
// that makes the client span and sends the trace context to the upstream. The
// returned stop flushes what is queued; nil when tracing is off.
func newTracing(ctx context.Context, cfg *config.Config, m *metrics.Metrics, opts *proxy.Options, log *zap.Logger) (stop func(context.Context) error, err error) {
	t := cfg.Tracing
	if !t.Enabled {
		return nil, nil
	}
	if tracing.Disabled(os.LookupEnv) {
		log.Info("tracing is enabled in the config but OTEL_SDK_DISABLED=true turns it off")
		return nil, nil
	}
	p, err := tracing.New(ctx, tracing.Options{
		Endpoint: t.Endpoint, Protocol: t.Protocol, SampleRatio: t.SampleRatio, ServiceName: t.ServiceName,
		Headers: t.Headers, Insecure: t.Insecure, Version: version, Env: os.LookupEnv,
		Dropped: m.TraceSpansDropped,
	})
	if err != nil {
		return nil, configError{fmt.Errorf("tracing: %w", err)}
	}
	store := ""
	if len(cfg.Redis.Addrs) > 0 {
		store = "redis"
	}
	opts.Tracing = &tracing.Spans{Tracer: p.Tracer, Propagator: p.Propagator, TrustIncoming: t.TrustIncoming == nil || *t.TrustIncoming, Store: store}
	opts.WrapTransport = opts.Tracing.UpstreamTransport
	log.Info("tracing on", zap.String("protocol", t.Protocol), zap.Bool("trust_incoming", opts.Tracing.TrustIncoming))
	return p.Shutdown, nil
}
