package main

import (
	"context"
	"fmt"
	"net"
	"net/http"

	"go.uber.org/zap"

	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/fwdauth"
	"github.com/docsgate/gateway/proxy"
)

// startForwardAuth runs the forward-auth listener when forward_auth.listen is set, its
// failure sent to errc; stop shuts it down within ctx (a no-op when it is off). Its listener,
// path and trusted proxies are fixed at start; the decisions follow reloads with the gateway.
func startForwardAuth(cfg *config.Config, gw *proxy.Gateway, log *zap.Logger, errc chan<- error) (stop func(context.Context), err error) {
	fa := cfg.ForwardAuth
	if !fa.Enabled() {
		return func(context.Context) {}, nil
	}
	h, err := fwdauth.New(fa, cfg.ClientIP.TrustedProxies, gw)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", fa.Listen)
	if err != nil {
		return nil, fmt.Errorf("forward_auth.listen %s: %w", fa.Listen, err)
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: cfg.Server.ReadHeaderTimeout,
		IdleTimeout:       cfg.Server.IdleTimeout,
		MaxHeaderBytes:    cfg.Server.MaxHeaderBytes,
		ErrorLog:          zap.NewStdLog(log.Named("forward_auth")),
	}
	go func() { errc <- srv.Serve(ln) }()
	log.Info("forward auth listening", zap.String("forward_auth_listen", ln.Addr().String()), zap.String("path", fa.Path))
	return func(ctx context.Context) {
		if err := srv.Shutdown(ctx); err != nil {
			_ = srv.Close()
		}
	}, nil
}
