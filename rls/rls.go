// Package rls is Envoy's rate limit service (envoy.service.ratelimit.v3, gRPC) on the quota engine: it maps a call's descriptors to the gateway's limits and tenants and decides them all or nothing.
//
// A call is decided in one engine decision over every mapped descriptor (one script call on
// Redis), so a tenant counts the same whether its requests came through the proxy or through
// Envoy. Where the gateway's rule differs from Envoy's reference service (which counts every
// descriptor whatever the others say), the gateway's holds: a call one descriptor refuses takes
// nothing from the others.
package rls

import (
	"context"
	"sync"
	"sync/atomic"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/engine"
	"github.com/docsgate/gateway/limits"
	"github.com/docsgate/gateway/metrics"
	"github.com/docsgate/gateway/policy"
)

// Engine is what the service asks of the quota engine.
type Engine interface {
	Policy() *policy.Policy
	Decide(ctx context.Context, c *engine.Counts, d *engine.Decision) error
	DebitTokens(ctx context.Context, hits []limits.Hit, n int64) error
}

// KeyLookup finds a registered key by its digest (auth.mode: registry).
type KeyLookup interface {
	Lookup(ctx context.Context, digest string) (auth.Entry, bool, error)
}

// Options wire a Service. Engine, Metrics and Logger are required.
type Options struct {
	Engine Engine
	// Registry resolves descriptors of id key_digest; nil: none is configured (the config
	// refuses such descriptors then).
	Registry KeyLookup
	// AllowOnError is redis.on_error: allow: a call whose store failed is answered OK (and
	// counts nothing); else UNAVAILABLE, and Envoy's failure_mode_deny decides.
	AllowOnError bool
	Metrics      *metrics.Metrics
	Logger       *zap.Logger
}

// Service answers ShouldRateLimit. Use swaps its mappings on reload.
type Service struct {
	rlsv3.UnimplementedRateLimitServiceServer
	o     Options
	table atomic.Pointer[table]
	calls sync.Pool // *call: a call's buffers, reused
}

// New builds the service with cfg's mappings.
func New(o Options, cfg *config.RateLimitService) *Service {
	s := &Service{o: o}
	s.calls.New = func() any { return new(call) }
	s.Use(cfg)
	return s
}

// Use puts cfg's mappings in force for the calls from now on (a reload: the limits they name
// are those of the policy in force when a call comes). The listener's address is not changed.
func (s *Service) Use(cfg *config.RateLimitService) {
	t := compile(cfg)
	s.o.Metrics.RLSDomains(append(t.names, unknownDomain))
	s.table.Store(t)
}

// Register registers the service on g.
func (s *Service) Register(g grpc.ServiceRegistrar) {
	rlsv3.RegisterRateLimitServiceServer(g, s)
}

// unknownDomain is the metrics' label of a domain no mapping names (unbounded values never
// become labels).
const unknownDomain = "unknown"
