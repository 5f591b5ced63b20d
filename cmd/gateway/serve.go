package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/docsgate/gateway/admin"
	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/metrics"
	"github.com/docsgate/gateway/proxy"
)

// configError marks failures caused by the configuration rather than the environment.
type configError struct{ error }

func (e configError) Unwrap() error { return e.error }

func loadConfig(path string) (*config.Config, error) {
	return config.Load(path, os.LookupEnv)
}

// newLogger builds the zap logger, writing to standard error; its level can change on
// reload. With log.buffer set, lines are written in batches (at most a second late), which
// saves a write system call per access-log line under load; stop flushes what is left.
func newLogger(c config.Log, dev bool) (log *zap.Logger, level zap.AtomicLevel, stop func(), err error) {
	zc := zap.NewProductionConfig()
	if dev || c.Format == "console" {
		zc = zap.NewDevelopmentConfig()
	}
	l, err := zapcore.ParseLevel(c.Level)
	if err != nil {
		return nil, level, nil, configError{fmt.Errorf("log.level: %w", err)}
	}
	if dev {
		l = zapcore.DebugLevel
	}
	level = zap.NewAtomicLevelAt(l)
	enc := zapcore.NewJSONEncoder(zc.EncoderConfig)
	if zc.Encoding == "console" {
		enc = zapcore.NewConsoleEncoder(zc.EncoderConfig)
	}
	var sink zapcore.WriteSyncer = zapcore.Lock(os.Stderr)
	stop = func() { _ = sink.Sync() }
	if c.Buffer > 0 {
		buffered := &zapcore.BufferedWriteSyncer{WS: sink, Size: c.Buffer, FlushInterval: time.Second}
		sink, stop = buffered, func() { _ = buffered.Stop() }
	}
	core := zapcore.NewCore(enc, sink, level)
	if c.Sampling.Initial > 0 { // every access-log line is kept unless sampling is configured
		core = zapcore.NewSamplerWithOptions(core, time.Second, c.Sampling.Initial, c.Sampling.Thereafter)
	}
	opts := []zap.Option{zap.AddCaller(), zap.ErrorOutput(zapcore.Lock(os.Stderr))}
	if dev {
		// Stack traces belong to errors: a warning is something to read, not to debug.
		opts = append(opts, zap.Development(), zap.AddStacktrace(zapcore.ErrorLevel))
	}
	return zap.New(core, opts...), level, stop, nil
}

// serve runs the gateway until ctx is cancelled (a signal), then drains it. path is the
// config file, re-read on SIGHUP and POST /reload.
func serve(ctx context.Context, path string, cfg *config.Config, dev bool) error {
	log, level, stopLog, err := newLogger(cfg.Log, dev)
	if err != nil {
		return err
	}
	defer stopLog()

	tlsCert, err := loadCert("tls", cfg.TLS)
	if err != nil {
		return err
	}
	// The admin listener follows the public one unless admin_tls names its own files.
	adminCert := tlsCert
	if cfg.AdminTLS != nil {
		if adminCert, err = loadCert("admin_tls", cfg.AdminTLS); err != nil {
			return err
		}
	}

	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	var draining atomic.Bool
	client := newRedisClient(cfg.Redis, log)
	if client != nil {
		defer client.Close()
	}
	lim := newLimiter(client, cfg.Redis, m, log)
	keys, err := newRegistry(ctx, client, cfg, log)
	if err != nil {
		return err
	}
	if keys != nil {
		defer keys.Close()
	}
	opts := proxy.Options{Config: cfg, Logger: log, Metrics: m, Limiter: lim}
	var keyManager admin.KeyManager
	if keys != nil {
		opts.Registry, keyManager = keys, keys
		if mem, ok := keys.(*auth.MemoryRegistry); ok && cfg.Auth.KeysFile != "" {
			keyManager = &fileKeys{path: cfg.Auth.KeysFile, mem: mem}
		}
	}
	stopTracing, err := newTracing(ctx, cfg, m, &opts, log)
	if err != nil {
		return err
	}
	gw, err := proxy.New(opts)
	if err != nil {
		return configError{err}
	}
	if client == nil {
		log.Warn("redis.addrs is empty: limits are counted in this process only, so each replica admits its own quota; configure Redis when running more than one replica")
	}
	// Readiness says whether this process can serve: it answers once the config is loaded
	// and both listeners are bound, and turns 503 only while draining. Redis trouble never
	// shows here (it shows on /metrics, the usage page and in the log): every replica shares
	// the same Redis, so a Redis incident would take every replica out of rotation at once,
	// and clients would get connection errors from the load balancer instead of the
	// gateway's 503 limiter_unavailable with Retry-After, on routes that need no Redis too.
	ready := func() (bool, string) {
		if draining.Load() {
			return false, "draining"
		}
		return true, "ready"
	}
	rl := &reloader{path: path, running: cfg, gw: gw, level: level, keys: keys, dev: dev, log: log, last: time.Now()}
	started := time.Now()
	state := func(context.Context) admin.State {
		last, lastErr := rl.lastReload()
		st := admin.State{Version: version, Store: storeKind(cfg.Redis), RedisReachable: true,
			LastReload: last, LastReloadError: lastErr, Started: started}
		if lim.guard != nil {
			st.OpenBreakers = lim.openBreakers()
			st.RedisReachable = lim.redisReachable(cfg.Redis.Timeout*5, 500*time.Millisecond)
		}
		return st
	}

	pubLn, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	adminLn, err := net.Listen("tcp", cfg.AdminListen)
	if err != nil {
		pubLn.Close()
		return fmt.Errorf("admin_listen %s: %w", cfg.AdminListen, err)
	}

	warnAdminExposure(cfg, log)
	pub := publicServer(cfg, gw, tlsCert, log)
	admin := &http.Server{
		Handler: admin.Handler(admin.Options{
			Ready:        ready,
			Metrics:      metrics.Handler(reg),
			Usage:        gw,
			Top:          gw,
			TopTimeout:   30 * time.Second,
			State:        state,
			UIRefresh:    cfg.AdminUIRefresh,
			Reload:       rl.reload,
			Keys:         keyManager,
			KnownPlan:    rl.knownPlan,
			Token:        cfg.AdminToken,
			Hosts:        cfg.AdminHosts,
			FailureLimit: cfg.Auth.FailureLimit,
			IPv6Prefix:   cfg.ClientIP.IPv6Prefix,
			UsageTimeout: cfg.Redis.Timeout * 10,
			Logger:       log.Named("admin"),
		}),
		ReadHeaderTimeout: cfg.Server.ReadHeaderTimeout,
		IdleTimeout:       cfg.Server.IdleTimeout,
		ErrorLog:          zap.NewStdLog(log.Named("admin")),
	}

	errc := make(chan error, 2)
	go func() {
		if tlsCert != nil {
			errc <- pub.ServeTLS(pubLn, "", "")
			return
		}
		errc <- pub.Serve(pubLn)
	}()
	go func() {
		if adminCert != nil {
			admin.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{*adminCert}}
			errc <- admin.ServeTLS(adminLn, "", "")
			return
		}
		errc <- admin.Serve(adminLn)
	}()
	log.Info("gateway started",
		zap.String("version", version),
		zap.String("listen", pubLn.Addr().String()),
		zap.String("admin_listen", adminLn.Addr().String()),
		zap.String("upstream", cfg.Upstream.URL),
		zap.Bool("tls", tlsCert != nil),
		zap.Bool("admin_tls", adminCert != nil),
		zap.String("auth_mode", cfg.Auth.Mode))

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case err := <-errc:
			// A listener failed on its own: stop everything.
			_ = pub.Close()
			_ = admin.Close()
			return fmt.Errorf("serving: %w", err)
		case <-hup:
			_ = rl.reload() // the outcome is logged
			continue
		case <-ctx.Done():
		}
		break
	}
	return drain(cfg.Server, pub, admin, gw, stopTracing, &draining, log)
}

// drain turns /readyz to 503, waits shutdown_delay for load balancers to notice, then closes
// the listeners and gives in-flight requests and streams shutdown_grace to finish, and the
// token debits of the last answers the rest of it.
func drain(sc config.Server, pub, admin *http.Server, gw *proxy.Gateway, stopTracing func(context.Context) error, draining *atomic.Bool, log *zap.Logger) error {
	draining.Store(true)
	log.Info("shutting down", zap.Duration("delay", sc.ShutdownDelay), zap.Duration("grace", sc.ShutdownGrace))
	time.Sleep(sc.ShutdownDelay)

	ctx, cancel := context.WithTimeout(context.Background(), sc.ShutdownGrace)
	defer cancel()
	err := pub.Shutdown(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		log.Warn("grace period over: closing the remaining connections")
		_ = pub.Close()
	} else if err != nil {
		log.Warn("shutdown", zap.Error(err))
	}
	_ = admin.Close()
	if err := gw.Close(ctx); err != nil {
		log.Warn("token debits and refunds still under way at the end of the grace period were dropped")
	}
	if stopTracing != nil {
		// The spans still queued are exported within what is left of the grace period.
		if err := stopTracing(ctx); err != nil {
			log.Warn("trace spans still queued at the end of the grace period were dropped", zap.Error(err))
		}
	}
	log.Info("stopped")
	return nil
}

func publicServer(cfg *config.Config, h http.Handler, cert *tls.Certificate, log *zap.Logger) *http.Server {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: cfg.Server.ReadHeaderTimeout,
		IdleTimeout:       cfg.Server.IdleTimeout,
		MaxHeaderBytes:    cfg.Server.MaxHeaderBytes,
		// No ReadTimeout or WriteTimeout: they would cut long streams. The body read is
		// bounded per request (server.read_body_timeout) and the header read here.
		ErrorLog: zap.NewStdLog(log.Named("http")),
	}
	var p http.Protocols
	p.SetHTTP1(true)
	if cert != nil {
		p.SetHTTP2(true)
		srv.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{*cert}}
	} else {
		// h2c with prior knowledge, as load balancers speak it to their backends.
		p.SetUnencryptedHTTP2(true)
	}
	srv.Protocols = &p
	return srv
}

func loadCert(key string, c *config.TLS) (*tls.Certificate, error) {
	if c == nil {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
	if err != nil {
		return nil, configError{fmt.Errorf("invalid config: %s: %w", key, err)}
	}
	return &cert, nil
}

// warnAdminExposure says once, at start, who can reach what when the admin listener accepts
// connections from other hosts without a token.
func warnAdminExposure(cfg *config.Config, log *zap.Logger) {
	if cfg.AdminToken != "" || admin.IsLoopbackListen(cfg.AdminListen) {
		return
	}
	log.Warn("admin_listen accepts connections from other hosts and admin_token is empty: anyone who can reach " +
		cfg.AdminListen + " can read /metrics, the usage endpoints and page (tenants' usage) and /debug/pprof; " +
		"key and reload writes are refused (403 admin_token_required) until admin_token (GATEWAY_ADMIN_TOKEN) is set. " +
		"Set admin_token, or restrict the port with a network policy.")
}

// storeKind names the limit store for the usage page.
func storeKind(c config.Redis) string {
	switch {
	case len(c.Addrs) == 0:
		return "memory"
	case c.MasterName != "":
		return "sentinel"
	case len(c.Addrs) > 1:
		return "cluster"
	}
	return "redis"
}
