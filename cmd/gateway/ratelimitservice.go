package main

import (
	"context"
	"fmt"
	"net"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/engine"
	"github.com/docsgate/gateway/metrics"
	"github.com/docsgate/gateway/rls"
)

// rateLimitServer is Envoy's rate limit service on its own gRPC listener
// (rate_limit_service), with the standard gRPC health service beside it.
type rateLimitServer struct {
	svc    *rls.Service
	srv    *grpc.Server
	ln     net.Listener
	health *health.Server
}

// listenRateLimitService listens on rate_limit_service.listen and builds the service; nil
// when the section is absent.
func listenRateLimitService(cfg *config.Config, eng *engine.Engine, keys auth.Registry, m *metrics.Metrics, log *zap.Logger) (*rateLimitServer, error) {
	if cfg.RateLimitService == nil {
		return nil, nil
	}
	ln, err := net.Listen("tcp", cfg.RateLimitService.Listen)
	if err != nil {
		return nil, fmt.Errorf("rate_limit_service.listen %s: %w", cfg.RateLimitService.Listen, err)
	}
	o := rls.Options{Engine: eng, AllowOnError: cfg.Redis.OnError == "allow", Metrics: m, Logger: log}
	if keys != nil {
		o.Registry = keys
	}
	r := &rateLimitServer{svc: rls.New(o, cfg.RateLimitService), srv: grpc.NewServer(), ln: ln, health: health.NewServer()}
	r.svc.Register(r.srv)
	healthpb.RegisterHealthServer(r.srv, r.health)
	return r, nil
}

// serve serves until stop; its error (a listener that failed on its own) goes to errc.
func (r *rateLimitServer) serve(errc chan<- error) {
	if r == nil {
		return
	}
	go func() {
		if err := r.srv.Serve(r.ln); err != nil {
			errc <- fmt.Errorf("rate_limit_service: %w", err)
		}
	}()
}

// addr is the listener's address ("" when not served).
func (r *rateLimitServer) addr() string {
	if r == nil {
		return ""
	}
	return r.ln.Addr().String()
}

// use puts a reloaded config's mappings in force.
func (r *rateLimitServer) use(cfg *config.Config) {
	if r != nil {
		r.svc.Use(cfg.RateLimitService)
	}
}

// stop says NOT_SERVING, lets the calls under way finish until ctx ends, then closes the rest.
func (r *rateLimitServer) stop(ctx context.Context) {
	if r == nil {
		return
	}
	r.health.Shutdown()
	done := make(chan struct{})
	go func() { r.srv.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		r.srv.Stop()
		<-done
	}
}

// close closes the listener at once (a start that failed after it).
func (r *rateLimitServer) close() {
	if r != nil {
		r.srv.Stop()
		_ = r.ln.Close()
	}
}

// rateLimitListen is rate_limit_service.listen, "" without the section: adding, removing or
// moving the listener needs a restart.
func rateLimitListen(cfg *config.Config) string {
	if cfg.RateLimitService == nil {
		return ""
	}
	return cfg.RateLimitService.Listen
}
