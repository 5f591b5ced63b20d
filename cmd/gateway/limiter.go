package main

import (
	"context"
	"crypto/tls"
	"runtime"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/engine"
	"github.com/docsgate/gateway/limits"
	"github.com/docsgate/gateway/metrics"
)

// newRedisClient builds the one Redis client of the process (standalone, Sentinel or Cluster
// through go-redis's UniversalClient), or nil when redis.addrs is empty.
func newRedisClient(c config.Redis, log *zap.Logger) redis.UniversalClient {
	if len(c.Addrs) == 0 {
		return nil
	}
	// go-redis keeps its logger in a package variable; the process has one logger anyway.
	redis.SetLogger(redisLogger{log.Named("redis").Sugar()})
	return redis.NewUniversalClient(redisOptions(c))
}

// readerTimeout bounds one command of the operators' reads (usage history, exports). They
// have deadlines of their own (admin_usage_timeout, admin_top_timeout); this only keeps a
// dead connection from waiting forever.
const readerTimeout = 30 * time.Second

// newReaderClient is a second, small client to the same Redis for the operators' reads: an
// export reads a thousand counters per pipeline, which on a busy Redis takes longer than the
// request path's redis.timeout (100 ms), the bound of every command on the limiter's client.
// nil when redis.addrs is empty.
func newReaderClient(c config.Redis) redis.UniversalClient {
	if len(c.Addrs) == 0 {
		return nil
	}
	opts := redisOptions(c)
	opts.ReadTimeout, opts.WriteTimeout = readerTimeout, readerTimeout
	opts.DialTimeout = max(opts.DialTimeout, time.Second)
	opts.PoolTimeout = readerTimeout
	opts.PoolSize = 4 // the admin listener runs few reads at once (admin_max_exports)
	return redis.NewUniversalClient(opts)
}

// redisOptions are the limiter client's options for c.
func redisOptions(c config.Redis) *redis.UniversalOptions {
	opts := &redis.UniversalOptions{
		Addrs:      c.Addrs,
		MasterName: c.MasterName,
		Username:   c.Username,
		Password:   c.Password,
		DB:         c.DB,
		// A limiter call must never be retried: the script may have run before the error,
		// and a retry would count the request twice.
		MaxRetries:            -1,
		DialerRetries:         1,
		ContextTimeoutEnabled: true,
		DialTimeout:           c.Timeout * 10,
		ReadTimeout:           c.Timeout,
		WriteTimeout:          c.Timeout,
		PoolTimeout:           c.Timeout,
		PoolSize:              c.PoolSize,
	}
	if opts.PoolSize == 0 {
		opts.PoolSize = max(32, 10*runtime.GOMAXPROCS(0))
	}
	if c.TLS {
		opts.TLSConfig = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	return opts
}

// limiter is the store behind the limits: Redis behind a timeout and circuit breaker, or the
// in-process store.
type limiter struct {
	engine.Limiter
	// quotas is the same store without the guard: operators' quota actions are bounded by
	// their own deadlines and must not move the request path's breaker.
	quotas limits.QuotaStore
	// history reads the kept windows (usage history, exports), unguarded like quotas.
	history limits.HistoryStore
	client  redis.UniversalClient // nil for the in-process store
	guard   *limits.Guard         // nil for the in-process store
	store   *limits.Redis

	mu        sync.Mutex // guards the cached reachability probe
	probedAt  time.Time
	reachable bool
}

// newLimiter builds the store; charged, when set, is told what charges of tokens crossed
// (notifications).
func newLimiter(client, reader redis.UniversalClient, c config.Redis, q config.Quota, charged func(limits.Crossed), m *metrics.Metrics, log *zap.Logger) *limiter {
	if client == nil {
		mopts := []limits.MemoryOption{limits.WithAuditMax(q.AuditMax)}
		if charged != nil {
			mopts = append(mopts, limits.WithMemoryCrossings(charged))
		}
		mem := limits.NewMemory(mopts...)
		return &limiter{Limiter: mem, quotas: mem, history: mem}
	}
	opts := []limits.RedisOption{limits.WithRedisAuditMax(q.AuditMax)}
	if charged != nil {
		opts = append(opts, limits.WithCrossings(charged))
	}
	if c.WaitReplicas > 0 {
		// WAIT answers within the call's own bound, so a lagging replica shows as
		// ErrNotReplicated rather than as a timeout.
		opts = append(opts, limits.WithWaitReplicas(c.WaitReplicas, c.Timeout*3/4))
	}
	if c.Coalesce {
		opts = append(opts, limits.WithCoalescing())
	}
	store, err := limits.NewRedis(client, c.KeyPrefix, opts...)
	if err != nil {
		// Coalescing is an optimisation: without it every call still works.
		log.Warn("redis.coalesce is off: the client cannot coalesce", zap.Error(err))
		store, _ = limits.NewRedis(client, c.KeyPrefix, opts[:len(opts)-1]...)
	}
	l := &limiter{client: client, store: store, quotas: store, history: store}
	if reader != nil {
		// Same keys, same prefix: only the client's bounds differ.
		if hs, err := limits.NewRedis(reader, c.KeyPrefix, limits.WithReadsOnly()); err == nil {
			l.history = hs
		}
	}
	l.guard = limits.NewGuard(l.store, limits.GuardOptions{
		Timeout:          c.Timeout,
		FailureThreshold: c.Breaker.Failures,
		Cooldown:         c.Breaker.Cooldown,
		// One breaker per Redis node: a dead Cluster master refuses only its own tenants.
		OnBreaker: func(node string, e limits.BreakerEvent) {
			switch e {
			case limits.NodeSeen:
				m.BreakerOpen(node, false)
			case limits.BreakerOpened:
				m.BreakerOpen(node, true)
				log.Warn("limiter breaker open: a Redis node is failing; the requests whose limits live on it are answered by redis.on_error for a while",
					zap.String("node", node), zap.Duration("cooldown", c.Breaker.Cooldown))
			case limits.BreakerClosed:
				m.BreakerOpen(node, false)
				log.Info("limiter breaker closed: the Redis node answers again", zap.String("node", node))
				// The node may have restarted without our scripts.
				go l.preload(c.Timeout*10, log)
			case limits.NodeGone:
				m.BreakerGone(node)
				log.Info("a Redis node left the layout (failover or resharding): its breaker is dropped", zap.String("node", node))
			}
		},
	})
	l.Limiter = l.guard
	l.preload(c.Timeout*10, log)
	l.closedBreakers(c.Timeout*10, m)
	return l
}

// closedBreakers makes gateway_ratelimit_breaker_open exist at 0 for the nodes the store
// knows at start (the master, or the Cluster's masters), so the dashboard and the breaker
// alert see them before the first decision; a node first called later gets its series then.
func (l *limiter) closedBreakers(timeout time.Duration, m *metrics.Metrics) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	nodes, err := l.store.Nodes(ctx)
	if err != nil {
		return // the layout is unknown yet: the first calls name the nodes
	}
	for _, n := range nodes {
		if n != "" {
			m.BreakerOpen(n, false)
		}
	}
}

// preload loads the limiter scripts, so the first decisions are one round trip each. A
// failure is only logged: decisions fall back to loading the script themselves.
func (l *limiter) preload(timeout time.Duration, log *zap.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if err := l.store.Preload(ctx); err != nil {
		log.Warn("could not preload the limiter scripts", zap.Error(err))
	}
}

// redisReachable reports whether Redis answers a PING (on a Cluster: every master), for the
// usage page; one probe per interval.
func (l *limiter) redisReachable(timeout, interval time.Duration) bool {
	if l.client == nil {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.probedAt.IsZero() && time.Since(l.probedAt) < interval {
		return l.reachable
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if cc, ok := l.client.(*redis.ClusterClient); ok {
		l.reachable = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return c.Ping(ctx).Err() }) == nil
	} else {
		l.reachable = l.client.Ping(ctx).Err() == nil
	}
	l.probedAt = time.Now()
	return l.reachable
}

// openBreakers returns the Redis nodes whose breaker is open, sorted.
func (l *limiter) openBreakers() []string {
	if l.guard == nil {
		return nil
	}
	return l.guard.OpenNodes()
}

// redisLogger sends go-redis's own messages (failed dials, pool trouble) to the structured
// log instead of bare lines on stderr.
type redisLogger struct{ log *zap.SugaredLogger }

func (l redisLogger) Printf(_ context.Context, format string, v ...any) {
	l.log.Warnf(format, v...)
}
