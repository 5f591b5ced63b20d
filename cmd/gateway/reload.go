package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"reflect"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/metrics"
	"github.com/docsgate/gateway/policy"
	"github.com/docsgate/gateway/proxy"
)

// reloader re-reads the config file on SIGHUP and POST /reload: routes, limits, plans, orgs,
// CORS, client IP rules, the keys file and the log level take effect for new requests; a bad
// file is rejected with the reason logged and the running config kept. Requests and streams
// in flight are untouched: they finish with the config they started with.
type reloader struct {
	mu      sync.Mutex // one reload at a time
	path    string
	running *config.Config
	gw      *proxy.Gateway
	level   zap.AtomicLevel
	keys    auth.Registry // nil in prefix mode
	dev     bool          // -dev pins the level at debug
	log     *zap.Logger
	m       *metrics.Metrics // the config reload series
	notes   *notifier        // nil without notifications
	rls     *rateLimitServer // nil without rate_limit_service

	outcome sync.Mutex // guards last and lastErr, read by the usage page
	last    time.Time  // when the running config was loaded
	lastErr string     // why the last reload was rejected; "" when it applied
}

// lastReload reports when the running config was loaded and why a later reload was rejected.
func (rl *reloader) lastReload() (time.Time, string) {
	rl.outcome.Lock()
	defer rl.outcome.Unlock()
	return rl.last, rl.lastErr
}

func (rl *reloader) record(err error) {
	rl.outcome.Lock()
	defer rl.outcome.Unlock()
	if err != nil {
		rl.lastErr = err.Error()
		rl.m.ConfigLoaded(false, time.Time{})
		return
	}
	rl.last, rl.lastErr = time.Now(), ""
	rl.m.ConfigLoaded(true, rl.last)
}

func (rl *reloader) reload() error {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	level, err := rl.apply()
	err = redacted(err, rl.running) // the running config's secrets too: the new file may lack them
	rl.record(err)
	if err != nil {
		rl.log.Error("reload rejected; keeping the running config", zap.String("config", rl.path), zap.Error(err))
		return err
	}
	// Logged before the new level applies, so a reload that raises the level is still seen.
	rl.log.Info("config reloaded", zap.String("config", rl.path), zap.Stringer("log_level", level))
	rl.level.SetLevel(level)
	return nil
}

// apply reloads everything but the log level, which it returns.
func (rl *reloader) apply() (zapcore.Level, error) {
	cfg, err := loadConfig(rl.path)
	if err != nil {
		return rl.level.Level(), err
	}
	level, err := rl.applyConfig(cfg)
	return level, redacted(err, cfg)
}

// applyConfig makes cfg, a loaded config, the running one; it returns the log level cfg asks for.
func (rl *reloader) applyConfig(cfg *config.Config) (zapcore.Level, error) {
	level := rl.level.Level()
	if fixed := fixedChanges(rl.running, cfg); len(fixed) > 0 {
		rl.log.Warn("these settings change only with a restart; the running values stay", zap.Strings("keys", fixed))
	}
	var entries []auth.Entry
	mem, isMem := rl.keys.(*auth.MemoryRegistry)
	if isMem {
		var err error
		if entries, err = loadKeysFile(cfg.Auth.KeysFile); err != nil {
			return level, fmt.Errorf("auth.keys_file: %w", err)
		}
	}
	if err := rl.gw.Reload(cfg); err != nil {
		return level, err
	}
	rl.rls.use(cfg) // its descriptors name limits of the policy just put in force
	if isMem {
		if err := mem.Replace(entries); err != nil {
			return level, fmt.Errorf("auth.keys_file: %w", err)
		}
	}
	if l, err := zapcore.ParseLevel(cfg.Log.Level); err == nil && !rl.dev {
		level = l
	}
	if msg := selfUsageExposure(cfg); msg != "" && msg != selfUsageExposure(rl.running) {
		rl.log.Warn(msg) // what a reload newly exposes, said as at start
	}
	for _, p := range policy.Unused(cfg) {
		rl.log.Warn(config.Redact(p.String(), cfg.Secrets()...))
	}
	rl.running = cfg
	rl.notes.configure(cfg)
	return level, nil
}

// loadKeysFile reads auth.keys_file; no file (or none configured) is no keys yet, so keys
// can be added through the admin API from an empty start.
func loadKeysFile(path string) ([]auth.Entry, error) {
	if path == "" {
		return nil, nil
	}
	entries, err := auth.LoadKeysFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return entries, err
}

// knownPlan tells whether the running config defines plan.
func (rl *reloader) knownPlan(plan string) bool {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	_, ok := rl.running.Plans[plan]
	return ok
}

// runningConfig is the config in force.
func (rl *reloader) runningConfig() *config.Config {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	return rl.running
}

// keyLifetime is the running config's lifetime of the keys of kind k.
func (rl *reloader) keyLifetime(k auth.Kind) auth.Lifetime {
	rl.mu.Lock()
	defer rl.mu.Unlock()
	return keyLifetimes(rl.running).For(k)
}

// fixedChanges names the settings a reload cannot change.
func fixedChanges(old, cfg *config.Config) []string {
	var keys []string
	check := func(key string, a, b any) {
		if !reflect.DeepEqual(a, b) {
			keys = append(keys, key)
		}
	}
	check("listen", old.Listen, cfg.Listen)
	check("admin_listen", old.AdminListen, cfg.AdminListen)
	check("admin_token", old.AdminToken, cfg.AdminToken)
	check("admin_max_exports", old.AdminMaxExports, cfg.AdminMaxExports)
	check("tls", old.TLS, cfg.TLS)
	check("upstream", old.Upstream, cfg.Upstream)
	check("server", old.Server, cfg.Server)
	check("redis", old.Redis, cfg.Redis)
	check("auth.mode", old.Auth.Mode, cfg.Auth.Mode)
	check("quota.audit_max", old.Quota.AuditMax, cfg.Quota.AuditMax)
	check("log.format", old.Log.Format, cfg.Log.Format)
	check("log.sampling", old.Log.Sampling, cfg.Log.Sampling)
	check("notifications", old.Notifications, cfg.Notifications)
	check("rate_limit_service.listen", rateLimitListen(old), rateLimitListen(cfg))
	return keys
}

// newRegistry builds the key registry of auth.mode: registry: in Redis when Redis is
// configured (shared by every replica), else in memory from auth.keys_file.
func newRegistry(ctx context.Context, client redis.UniversalClient, cfg *config.Config, log *zap.Logger) (auth.Registry, error) {
	if cfg.Auth.Mode != "registry" {
		return nil, nil
	}
	if client != nil {
		r, err := auth.NewRedisRegistry(ctx, client, auth.RedisRegistryOptions{
			Prefix: cfg.Redis.KeyPrefix, CacheTTL: cfg.Auth.CacheTTL, Logger: log.Named("keys"),
		})
		if err != nil {
			return nil, fmt.Errorf("key registry: %w", err)
		}
		return r, nil
	}
	entries, err := loadKeysFile(cfg.Auth.KeysFile)
	if err != nil {
		return nil, configError{fmt.Errorf("invalid config: auth.keys_file: %w", err)}
	}
	r, err := auth.NewMemoryRegistry(entries)
	if err != nil {
		return nil, configError{fmt.Errorf("invalid config: auth.keys_file: %w", err)}
	}
	return r, nil
}
