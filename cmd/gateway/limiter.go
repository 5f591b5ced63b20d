package main

import (
	"context"
	"crypto/tls"
	"io"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/limits"
	"github.com/docsgate/gateway/metrics"
	"github.com/docsgate/gateway/proxy"
)

// limiter is the store behind the limits: Redis (standalone, Sentinel or Cluster, through
// go-redis's UniversalClient) behind a timeout and circuit breaker, or the in-process store.
type limiter struct {
	proxy.Limiter
	guard  *limits.Guard // nil for the in-process store
	closer io.Closer
}

func newLimiter(c config.Redis, m *metrics.Metrics, log *zap.Logger) *limiter {
	if len(c.Addrs) == 0 {
		return &limiter{Limiter: limits.NewMemory(), closer: io.NopCloser(nil)}
	}
	opts := &redis.UniversalOptions{
		Addrs:      c.Addrs,
		MasterName: c.MasterName,
		Username:   c.Username,
		Password:   c.Password,
		DB:         c.DB,
		// A limiter call must never be retried: the script may have run before the error,
		// and a retry would count the request twice.
		MaxRetries:            -1,
		ContextTimeoutEnabled: true,
		DialTimeout:           c.Timeout * 10,
		ReadTimeout:           c.Timeout,
		WriteTimeout:          c.Timeout,
		PoolTimeout:           c.Timeout,
	}
	if c.TLS {
		opts.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	// go-redis keeps its logger in a package variable; the process has one logger anyway.
	redis.SetLogger(redisLogger{log.Named("redis").Sugar()})
	client := redis.NewUniversalClient(opts)
	guard := limits.NewGuard(limits.NewRedis(client, c.KeyPrefix), limits.GuardOptions{
		Timeout:          c.Timeout,
		FailureThreshold: c.Breaker.Failures,
		Cooldown:         c.Breaker.Cooldown,
		OnStateChange: func(open bool) {
			m.BreakerOpen(open)
			if open {
				log.Warn("limiter breaker open: Redis is failing; not calling it for a while", zap.Strings("redis", c.Addrs))
			} else {
				log.Info("limiter breaker closed: Redis answers again")
			}
		},
	})
	return &limiter{Limiter: guard, guard: guard, closer: client}
}

// healthy is false while the breaker is open.
func (l *limiter) healthy() bool {
	return l.guard == nil || !l.guard.Open()
}

// redisLogger sends go-redis's own messages (failed dials, pool trouble) to the structured
// log instead of bare lines on stderr.
type redisLogger struct{ log *zap.SugaredLogger }

func (l redisLogger) Printf(_ context.Context, format string, v ...any) {
	l.log.Warnf(format, v...)
}
