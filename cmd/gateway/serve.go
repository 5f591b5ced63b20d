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
	"runtime"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/docsgate/gateway/admin"
	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/engine"
	"github.com/docsgate/gateway/limits"
	"github.com/docsgate/gateway/metrics"
	"github.com/docsgate/gateway/proxy"
)

// configError marks failures caused by the configuration rather than the environment.
type configError struct{ error }

func (e configError) Unwrap() error { return e.error }

// redacted is err with the secrets of cfgs masked in its message (config.Redact), still a
// configError when err was one; nil stays nil. Config errors quote the values they refuse: a
// secret pasted under the wrong key must reach neither the terminal, nor the log, nor POST
// /reload's answer, nor the usage page.
func redacted(err error, cfgs ...*config.Config) error {
	if err == nil {
		return nil
	}
	var secrets []string
	for _, c := range cfgs {
		if c != nil {
			secrets = append(secrets, c.Secrets()...)
		}
	}
	masked := errors.New(config.Redact(err.Error(), secrets...))
	if errors.As(err, new(configError)) {
		return configError{masked}
	}
	return masked
}

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
	tlsCert, adminCert, err := loadCerts(cfg)
	if err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	p := &process{cfg: cfg, log: log, reg: reg, m: metrics.New(reg), started: time.Now()}
	p.m.Build(version, buildRevision(), runtime.Version())
	client, reader := newRedisClient(cfg.Redis, log), newReaderClient(cfg.Redis)
	if client != nil {
		defer client.Close()
		defer reader.Close()
	}
	p.notes = newNotifier(cfg, p.m, log)
	defer p.notes.close()
	var charged func(limits.Crossed) // what charges of tokens crossed, with notifications on
	if p.notes != nil {
		charged = p.notes.charged
	}
	p.lim = newLimiter(client, reader, cfg.Redis, cfg.Quota, charged, p.m, log)
	keys, err := newRegistry(ctx, client, cfg, log)
	if err != nil {
		return err
	}
	if keys != nil {
		defer keys.Close()
		p.lastUse = auth.NewLastUse(lastUseStore(cfg, client))
		defer p.keepLastUse(cfg.Redis.Timeout * 10)()
	}
	stopTracing, err := p.buildGateway(ctx, keys)
	if err != nil {
		return err
	}
	p.rl = &reloader{path: path, running: cfg, gw: p.gw, level: level, keys: keys, dev: dev, log: log, m: p.m, last: time.Now(), notes: p.notes}
	p.m.ConfigLoaded(true, p.rl.last)

	pubLn, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.Listen, err)
	}
	adminLn, err := net.Listen("tcp", cfg.AdminListen)
	if err != nil {
		pubLn.Close()
		return fmt.Errorf("admin_listen %s: %w", cfg.AdminListen, err)
	}
	rs, err := listenRateLimitService(cfg, p.eng, keys, p.m, log)
	if err != nil {
		pubLn.Close()
		adminLn.Close()
		return err
	}
	p.rl.rls = rs
	logWarnings(log, startWarnings(cfg))
	pub := publicServer(cfg, p.gw, tlsCert, log)
	admin := p.adminServer(keyManager(cfg, keys), adminCert)
	errc := make(chan error, 3)
	stopForwardAuth, err := startForwardAuth(cfg, p.gw, log, errc)
	if err != nil {
		pubLn.Close()
		adminLn.Close()
		return err
	}
	go func() { errc <- serveOn(pub, pubLn) }()
	go func() { errc <- serveOn(admin, adminLn) }()
	rs.serve(errc)
	log.Info("gateway started",
		zap.String("version", version),
		zap.String("listen", pubLn.Addr().String()),
		zap.String("admin_listen", adminLn.Addr().String()),
		zap.String("rate_limit_service", rs.addr()),
		zap.String("upstream", cfg.Upstream.URL),
		zap.Bool("tls", tlsCert != nil),
		zap.Bool("admin_tls", adminCert != nil),
		zap.String("auth_mode", cfg.Auth.Mode))
	// The forward-auth door stops with the public listener: after drain, which closes that.
	defer stopForwardAuth(context.Background())
	if err := p.wait(ctx, errc); err != nil {
		_ = pub.Close()
		_ = admin.Close()
		rs.close()
		return err
	}
	return drain(cfg.Server, pub, admin, rs, p.eng, stopTracing, &p.draining, log)
}

// process is what one running gateway is made of, built by serve.
type process struct {
	cfg      *config.Config
	log      *zap.Logger
	reg      *prometheus.Registry
	m        *metrics.Metrics
	lim      *limiter
	notes    *notifier // nil without notifications.webhooks
	eng      *engine.Engine
	gw       *proxy.Gateway
	rl       *reloader
	lastUse  *auth.LastUse // registry mode: the keys' last uses
	started  time.Time
	draining atomic.Bool
}

// buildGateway builds the public handler on the limiter and the key registry (nil in prefix
// mode), with tracing when configured; it returns the function that stops tracing (or nil).
func (p *process) buildGateway(ctx context.Context, keys auth.Registry) (stopTracing func(context.Context) error, err error) {
	eo := engine.Options{Limiter: p.lim, Quotas: p.lim.quotas, History: p.lim.history, AllowOnError: p.cfg.Redis.OnError == "allow",
		GrowTimeout: p.cfg.Redis.Timeout, Metrics: p.m, Logger: p.log}
	opts := proxy.Options{Config: p.cfg, Logger: p.log, Metrics: p.m}
	if keys != nil {
		opts.Registry, eo.Registry, opts.LastUse = keys, keys, p.lastUse
	}
	if stopTracing, err = newTracing(ctx, p.cfg, p.m, &opts, p.log); err != nil {
		return nil, err
	}
	if p.notes != nil && p.cfg.Notifications.Enabled() {
		// The limits mark what the notifications the gateway starts with take.
		n := p.cfg.Notifications
		eo.Crossings, eo.Notify = p.notes.crossed, &n
	}
	p.eng = engine.New(eo)
	opts.Engine = p.eng
	if p.gw, err = proxy.New(opts); err != nil {
		return nil, configError{err}
	}
	if p.notes != nil {
		p.notes.start(ctx, p.lim.quotas, keys)
	}
	return stopTracing, nil
}

// keyManager is what the admin key endpoints write: the registry, or the keys file (which a
// reload re-reads) when keys live there; nil in prefix mode.
func keyManager(cfg *config.Config, keys auth.Registry) admin.KeyManager {
	if keys == nil {
		return nil
	}
	if mem, ok := keys.(*auth.MemoryRegistry); ok && cfg.Auth.KeysFile != "" {
		return &fileKeys{path: cfg.Auth.KeysFile, mem: mem}
	}
	return keys
}

// keepLastUse writes the keys' last uses once a minute until the returned function is called
// (after the drain, so that the last requests' uses are written too), which writes them a
// last time, within timeout, and returns when that is done.
func (p *process) keepLastUse(timeout time.Duration) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		flushLastUse(ctx, p.lastUse, timeout, func(err error) {
			p.log.Warn("the keys' last uses could not be written; kept for the next try", zap.Error(err))
		})
	}()
	return func() {
		cancel()
		<-done
	}
}

// keyLastUse is what GET /keys reads the last uses from; nil in prefix mode.
func (p *process) keyLastUse() admin.KeyLastUse {
	if p.lastUse == nil {
		return nil
	}
	return p.lastUse
}

// ready is /readyz: whether this process can serve. It answers once the config is loaded and
// both listeners are bound, and turns 503 only while draining. Redis trouble never shows here
// (it shows on /metrics, the usage page and in the log): every replica shares the same Redis,
// so a Redis incident would take every replica out of rotation at once, and clients would get
// connection errors from the load balancer instead of the gateway's 503 limiter_unavailable
// with Retry-After, on routes that need no Redis too.
func (p *process) ready() (bool, string) {
	if p.draining.Load() {
		return false, "draining"
	}
	return true, "ready"
}

// state is the gateway's state as the usage page shows it.
func (p *process) state(context.Context) admin.State {
	last, lastErr := p.rl.lastReload()
	st := admin.State{Version: version, Store: storeKind(p.cfg.Redis), RedisReachable: true,
		LastReload: last, LastReloadError: lastErr, Started: p.started}
	if p.lim.guard != nil {
		st.OpenBreakers = p.lim.openBreakers()
		st.RedisReachable = p.lim.redisReachable(p.cfg.Redis.Timeout*5, 500*time.Millisecond)
	}
	return st
}

// outboxOf is the outbox the admin API lists, retries and drops from; nil (the endpoints off)
// without notifications.
func outboxOf(nt *notifier) admin.NotificationOutbox {
	if nt == nil {
		return nil
	}
	return nt.box
}

// adminServer is the admin listener's server; cert, when set, makes it serve HTTPS.
func (p *process) adminServer(keys admin.KeyManager, cert *tls.Certificate) *http.Server {
	cfg := p.cfg
	srv := &http.Server{
		Handler: admin.Handler(admin.Options{
			Ready:       p.ready,
			Metrics:     metrics.Handler(p.reg),
			Usage:       p.eng,
			Top:         p.eng,
			TopTimeout:  30 * time.Second,
			State:       p.state,
			UIRefresh:   cfg.AdminUIRefresh,
			Reload:      p.rl.reload,
			Keys:        keys,
			KnownPlan:   p.rl.knownPlan,
			RouteKind:   func(name string) (auth.Kind, bool) { return p.eng.Policy().RouteKind(name) },
			KeyLifetime: p.rl.keyLifetime,
			KeyLastUse:  p.keyLastUse(),
			KeyExpiryNotice: func() time.Duration {
				return time.Duration(p.rl.runningConfig().Auth.ExpiryNotice)
			},
			Quotas:       p.eng,
			History:      p.eng,
			MaxExports:   cfg.AdminMaxExports,
			Token:        cfg.AdminToken,
			Hosts:        cfg.AdminHosts,
			FailureLimit: cfg.Auth.FailureLimit,
			IPv6Prefix:   cfg.ClientIP.IPv6Prefix,
			UsageTimeout: cfg.Redis.Timeout * 10,
			Logger:       p.log.Named("admin"),

			Notifications: outboxOf(p.notes),
		}),
		ReadHeaderTimeout: cfg.Server.ReadHeaderTimeout,
		IdleTimeout:       cfg.Server.IdleTimeout,
		ErrorLog:          zap.NewStdLog(p.log.Named("admin")),
	}
	if cert != nil {
		srv.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{*cert}}
	}
	return srv
}

// serveOn serves srv on ln, with TLS when srv has a TLS config.
func serveOn(srv *http.Server, ln net.Listener) error {
	if srv.TLSConfig != nil {
		return srv.ServeTLS(ln, "", "")
	}
	return srv.Serve(ln)
}

// wait reloads on SIGHUP until ctx ends (nil: drain) or a listener fails on its own (its error).
func (p *process) wait(ctx context.Context, errc <-chan error) error {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case err := <-errc:
			return fmt.Errorf("serving: %w", err)
		case <-hup:
			_ = p.rl.reload() // the outcome is logged
		case <-ctx.Done():
			return nil
		}
	}
}

// drain turns /readyz to 503, waits shutdown_delay for load balancers to notice, then closes
// the listeners and gives in-flight requests and streams shutdown_grace to finish, and the
// token debits of the last answers the rest of it.
func drain(sc config.Server, pub, admin *http.Server, rs *rateLimitServer, eng *engine.Engine, stopTracing func(context.Context) error, draining *atomic.Bool, log *zap.Logger) error {
	draining.Store(true)
	log.Info("shutting down", zap.Duration("delay", sc.ShutdownDelay), zap.Duration("grace", sc.ShutdownGrace))
	time.Sleep(sc.ShutdownDelay)

	ctx, cancel := context.WithTimeout(context.Background(), sc.ShutdownGrace)
	defer cancel()
	stopped := make(chan struct{})
	go func() { rs.stop(ctx); close(stopped) }() // beside the public listener: the same grace
	err := pub.Shutdown(ctx)
	<-stopped
	if errors.Is(err, context.DeadlineExceeded) {
		log.Warn("grace period over: closing the remaining connections")
		_ = pub.Close()
	} else if err != nil {
		log.Warn("shutdown", zap.Error(err))
	}
	_ = admin.Close()
	if err := eng.Close(ctx); err != nil {
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
	if d := cfg.Server.WriteStallTimeout; d > 0 {
		// An HTTP/2 connection whose peer takes no byte for this long is closed: a stalled
		// stream's reset cannot reach a client that stopped reading the connection itself
		// (see proxy's stallWatch).
		srv.HTTP2 = &http.HTTP2Config{WriteByteTimeout: d}
	}
	return srv
}

// loadCerts loads the public listener's certificate (nil without tls) and the admin
// listener's, which follows the public one unless admin_tls names its own files.
func loadCerts(cfg *config.Config) (public, admin *tls.Certificate, err error) {
	if public, err = loadCert("tls", cfg.TLS); err != nil {
		return nil, nil, err
	}
	admin = public
	if cfg.AdminTLS != nil {
		if admin, err = loadCert("admin_tls", cfg.AdminTLS); err != nil {
			return nil, nil, err
		}
	}
	return public, admin, nil
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
