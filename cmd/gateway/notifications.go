package main

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/engine"
	"github.com/docsgate/gateway/limits"
	"github.com/docsgate/gateway/metrics"
	"github.com/docsgate/gateway/notify"
)

const (
	// crossingQueue bounds the crossings waiting to be written into the outbox: the request
	// path hands them over and never waits. At the bound, notify.Share's rule drops one: a
	// visitor's first, a tenant's never for a visitor's.
	crossingQueue = 4096
	// writeBatch bounds the events of one write into the outbox (one Redis script call): a
	// flood costs a round trip per writeBatch events, and one call holds Redis, which the
	// limits' decisions share, for about a millisecond.
	writeBatch = 128
	// outboxMax bounds the outbox: beyond, notify.Outbox's rule drops (logged, counted).
	outboxMax = 100_000
	// outboxPoll is how often the outbox's gauges are read.
	outboxPoll = 5 * time.Second
	// overridesEvery and keysEvery are how often overrides and keys are read for their ends
	// and revocations (an override is also read again as it ends). An override that ends
	// less than overridesEvery after it was set may end unseen, and unannounced.
	overridesEvery = 5 * time.Second
	keysEvery      = 15 * time.Second
	// revokedWithin is how far back a revocation is still announced: a replica that starts
	// announces the last hour's (each once, whatever the replicas: Event.Once).
	revokedWithin = time.Hour
	// maxUnwritten bounds the events whose write into the outbox failed (Redis unreachable),
	// retried every retryWrites; beyond, notify.Share's rule drops (logged, counted).
	maxUnwritten = 10_000
	retryWrites  = time.Second
	// writeTimeout bounds one write into the outbox.
	writeTimeout = 5 * time.Second
)

// notifier turns the limits' crossings into webhook events: written into the outbox (the
// Redis the replicas share, else in process) off the request path, in batches, then
// delivered by any replica. nil without notifications.webhooks.
type notifier struct {
	n      *notify.Notifier
	box    notify.Outbox
	client redis.UniversalClient // the outbox's own client; nil in process
	log    *zap.Logger
	m      *metrics.Metrics
	drops  *dropLog
	// queue holds the crossings handed over by requests (crossed), guarded by mu; ready
	// tells run there are some.
	mu    sync.Mutex
	queue *notify.Queue[engine.Crossing]
	ready chan struct{}
	// events are the watch's events (override ends, revocations), for run to write.
	events chan notify.Event
	// by is what each limit of the config in force counts by (configure), for the crossings
	// of charges, which know only the rule.
	by atomic.Pointer[map[string]string]
	// notice is auth.expiry_notice of the config in force (configure): how long before a
	// key's end key.expiring is sent.
	notice atomic.Int64
	// marks remember the key.expiring events announced, over the days of a notice.
	marks notify.Marks
	// wants is the config's notifications: what some endpoint takes.
	wants *config.Notifications
	// unwritten are events whose write into the outbox failed, oldest first by share: the
	// run goroutine's, then close's once run has returned (runDone).
	unwritten *notify.Queue[notify.Event]
	running   atomic.Bool
	runDone   chan struct{}
	// deliverDone is closed when the deliveries (notify's Run) have ended.
	deliverDone chan struct{}
}

// shareOf is whose a crossing's events are: a limit by ip counts visitors.
func shareOf(c engine.Crossing) notify.Share {
	return notify.Share{Limit: c.Limit, Visitor: c.By == "ip"}
}

func newNotifier(cfg *config.Config, m *metrics.Metrics, log *zap.Logger) *notifier {
	if !cfg.Notifications.Enabled() {
		return nil
	}
	nt := &notifier{log: log.Named("notifications"), m: m, wants: &cfg.Notifications, runDone: make(chan struct{}), deliverDone: make(chan struct{}),
		queue: notify.NewQueue(crossingQueue, shareOf), ready: make(chan struct{}, 1), events: make(chan notify.Event, 64),
		unwritten: notify.NewQueue(maxUnwritten, func(ev notify.Event) notify.Share { return ev.Share })}
	nt.drops = newDropLog(nt.log)
	// A client of its own, with the operators' bounds: outbox scripts must not wait behind,
	// nor be bounded like, the request path's calls.
	if nt.client = newReaderClient(cfg.Redis); nt.client != nil {
		nt.box = notify.NewRedis(nt.client, cfg.Redis.KeyPrefix, outboxMax)
		nt.marks = notify.NewRedisMarks(nt.client, cfg.Redis.KeyPrefix)
	} else {
		nt.box = notify.NewMemory(outboxMax)
		nt.marks = &notify.MemoryMarks{}
	}
	var eps []notify.Endpoint
	var names []string
	for _, w := range cfg.Notifications.Webhooks {
		eps = append(eps, notify.Endpoint{Name: w.Name, URL: w.URL, Keys: w.Keys, Events: w.Events, Limits: w.Limits, AllowPrivate: w.AllowPrivateAddresses})
		names = append(names, w.Name)
	}
	nc := cfg.Notifications
	nt.n = notify.New(nt.box, eps, notify.Options{Timeout: nc.Timeout, MaxBackoff: nc.MaxBackoff, RetryFor: nc.RetryFor, Log: nt.log,
		OnResult: func(d notify.Delivery, result string, latency time.Duration) {
			m.Notification(d.Type, d.Endpoint, result, latency)
		}})
	m.NotificationSeries(config.EventTypes, names, sendingLimits(cfg))
	nt.configure(cfg)
	return nt
}

// sendingLimits are the limits that send quota events in some plan, and "" (events of no
// limit): those whose events may be dropped.
func sendingLimits(cfg *config.Config) []string {
	names := []string{""}
	plans := []string{""}
	for p := range cfg.Plans {
		plans = append(plans, p)
	}
	for _, p := range plans {
		for _, s := range cfg.PlanLimits(p) {
			if len(s.Events) > 0 && !slices.Contains(names, s.Name) {
				names = append(names, s.Name)
			}
		}
	}
	return names
}

// configure records what the limits of cfg count by (at start and on every reload).
func (nt *notifier) configure(cfg *config.Config) {
	if nt == nil {
		return
	}
	by := map[string]string{}
	for _, s := range cfg.ResolvedLimits() {
		by[s.Name] = s.By
	}
	nt.by.Store(&by)
	nt.notice.Store(int64(cfg.Auth.ExpiryNotice))
}

// charged is the limits' WithCrossings: what a charge of tokens crossed, queued as crossed
// queues a decision's. A charge knows no request: the org is the tenant's own when the limit
// counts by org, else unknown.
func (nt *notifier) charged(x limits.Crossed) {
	c := engine.CrossingOf(x.Rule, x.Bits)
	c.Tenant, c.By = x.ID, (*nt.by.Load())[x.Rule.Name]
	if c.By == "org" {
		c.Org = x.ID
	}
	c.WindowStart, c.Used, c.Reserved, c.Quota, c.Time = time.Unix(x.WindowStart, 0).UTC(), x.Used, x.Held, x.Allow, time.Now()
	nt.crossed(c)
}

// crossed is proxy.Options.Crossings, on the request's path: it queues the crossing for run,
// never waiting. At the queue's bound one crossing is dropped by notify.Share's rule (logged
// at most once a second, counted).
func (nt *notifier) crossed(c engine.Crossing) {
	nt.mu.Lock()
	dropped, ok := nt.queue.Push(c)
	nt.mu.Unlock()
	nt.wake()
	if ok {
		nt.dropCrossing(dropped, metrics.DropQueueFull)
	}
}

// wake tells run that crossings are queued.
func (nt *notifier) wake() {
	select {
	case nt.ready <- struct{}{}:
	default:
	}
}

// start runs the notifier until ctx ends: crossings written into the outbox, deliveries,
// overrides' ends and revocations (watch).
func (nt *notifier) start(ctx context.Context, quotas limits.QuotaStore, keys auth.Registry) {
	nt.running.Store(true)
	go nt.run(ctx)
	go nt.watch(ctx, quotas, keys)
}

// run writes queued crossings and the watch's events into the outbox, and delivers from it,
// until ctx ends; every retryWrites it retries the unwritten and logs what was dropped.
func (nt *notifier) run(ctx context.Context) {
	go func() { nt.n.Run(ctx); close(nt.deliverDone) }()
	// The queues are close's once this loop returns: runDone says so at once, without waiting
	// for deliveries in flight (close waits for those before it releases the client).
	defer close(nt.runDone)
	t := time.NewTicker(outboxPoll)
	defer t.Stop()
	retry := time.NewTicker(retryWrites)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return // close writes what the last requests crossed
		case <-nt.ready:
			if nt.writeQueued(ctx) {
				nt.wake()
			}
		case ev := <-nt.events:
			nt.publish(ctx, []notify.Event{ev})
		case <-retry.C:
			nt.writeUnwritten(ctx)
			nt.drops.flush()
		case <-t.C:
			if p, d, err := nt.box.Count(ctx); err == nil {
				nt.m.NotificationOutbox(p, d)
			}
		}
	}
}

// watch announces the ends of overrides (quota.override_expired) and the keys' events
// (key.revoked, key.rotated, key.expiring: keyevents.go), read every overridesEvery and
// keysEvery until ctx ends. Every replica reads them; the outbox takes each event once
// (Event.Once with an id derived from what it reports). An override is announced when it
// leaves the list at its expiry (one ended early by an operator is not announced); one that
// expires while no replica runs is not either. keys is nil in prefix mode.
func (nt *notifier) watch(ctx context.Context, quotas limits.QuotaStore, keys auth.Registry) {
	var seen map[string]limits.Override // nil until the first read
	ke := &keyEvents{nt: nt, announced: map[string]time.Time{}}
	var keysNext time.Time
	if !nt.wants.Wants(config.EventOverrideExpired, "") {
		quotas = nil // read only for an endpoint that takes them
	}
	if !ke.wanted() {
		keys = nil
	}
	if quotas == nil && keys == nil {
		return
	}
	for {
		wait := overridesEvery
		if quotas != nil {
			var ok bool
			if seen, ok = nt.overridesEnded(ctx, quotas, seen); ok {
				// The next read: in overridesEvery, or as the first override seen ends (never
				// sooner than a second: Redis' clock may lag this replica's).
				for _, o := range seen {
					wait = min(wait, max(time.Until(o.Expires)+50*time.Millisecond, time.Second))
				}
			}
		}
		if keys != nil && !time.Now().Before(keysNext) {
			keysNext = ke.read(ctx, keys)
		}
		if keys != nil {
			wait = min(wait, max(time.Until(keysNext), 50*time.Millisecond))
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
	}
}

// overridesEnded reads the overrides in force and announces those of before that reached
// their expiry since; false when they could not be read (before is returned).
func (nt *notifier) overridesEnded(ctx context.Context, quotas limits.QuotaStore, before map[string]limits.Override) (map[string]limits.Override, bool) {
	rctx, cancel := context.WithTimeout(ctx, overridesEvery)
	defer cancel()
	list, err := quotas.Overrides(rctx)
	if err != nil {
		nt.log.Warn("overrides not read for quota.override_expired", zap.Error(err))
		return before, false
	}
	now := time.Now()
	by := *nt.by.Load()
	inForce := map[string]limits.Override{}
	for _, o := range list {
		inForce[o.Limit+"\x00"+o.ID] = o
	}
	for k, o := range before {
		if cur, ok := inForce[k]; ok && cur.Expires.Equal(o.Expires) || o.Expires.After(now) {
			continue // still in force, or ended (or replaced) before its expiry
		}
		exp := o.Expires.UTC().Format(time.RFC3339Nano)
		nt.submit(ctx, notify.Event{Type: config.EventOverrideExpired, Time: o.Expires, Once: true,
			ID:    notify.StableID(config.EventOverrideExpired, o.Limit, o.ID, exp),
			Share: notify.Share{Limit: o.Limit, Visitor: by[o.Limit] == "ip"},
			Data: map[string]any{"limit": o.Limit, "tenant": o.ID, "by": by[o.Limit], "override": o.Value,
				"expires": o.Expires.UTC().Format(time.RFC3339), "reason": o.Reason}})
	}
	return inForce, true
}

// submit hands the watch's ev to run, waiting for room (the watch is on no request's path);
// false when ctx ended first (the event is announced again by the next replica's read).
func (nt *notifier) submit(ctx context.Context, ev notify.Event) bool {
	select {
	case nt.events <- ev:
		return true
	case <-ctx.Done():
		return false
	}
}

// closeWrite bounds the writes of close.
const closeWrite = 3 * time.Second

// close writes into the outbox what is still queued (the crossings of the requests that ended
// while the gateway drained: serve calls it once they are all done) and what could not be
// written yet, counts what is left as dropped, then releases the outbox's client. In
// process, what it writes is lost with the process all the same.
func (nt *notifier) close() {
	if nt == nil {
		return
	}
	deadline := time.Now().Add(closeWrite)
	if nt.running.Load() {
		select { // run owns the queue and the unwritten until it returns
		case <-nt.runDone:
		case <-time.After(closeWrite):
			// Never touched from two goroutines: what is still queued is lost with the process.
			nt.log.Warn("notifications: the writing loop did not stop in time; what it holds is not written")
			nt.release(deadline.Add(closeWrite))
			return
		}
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline.Add(closeWrite))
	defer cancel()
	for nt.writeQueued(ctx) {
	}
	for more := true; more; {
		select {
		case ev := <-nt.events:
			nt.publish(ctx, []notify.Event{ev})
		default:
			more = false
		}
	}
	nt.writeUnwritten(ctx)
	for _, ev := range nt.unwritten.Pop(nt.unwritten.Len()) {
		nt.dropEvent(ev, metrics.DropShutdown)
	}
	nt.drops.flush()
	nt.release(deadline.Add(closeWrite))
}

// release waits (until deadline) for the deliveries in flight, which end with run's context,
// then closes the outbox's client.
func (nt *notifier) release(deadline time.Time) {
	if nt.running.Load() {
		select {
		case <-nt.deliverDone:
		case <-time.After(time.Until(deadline)):
			nt.log.Warn("notifications: deliveries in flight did not end in time")
		}
	}
	if nt.client != nil {
		_ = nt.client.Close()
	}
}
