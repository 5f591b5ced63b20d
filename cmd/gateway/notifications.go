package main

import (
	"context"
	"maps"
	"math"
	"slices"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/limits"
	"github.com/docsgate/gateway/metrics"
	"github.com/docsgate/gateway/notify"
	"github.com/docsgate/gateway/proxy"
)

const (
	// crossingQueue bounds the crossings waiting to be written into the outbox: the request
	// path hands them over and never waits.
	crossingQueue = 1024
	// outboxMax bounds the outbox: beyond, its oldest deliveries are dropped (logged, counted).
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
	// retried every retryWrites; beyond, the oldest are dropped (logged, counted).
	maxUnwritten = 10_000
	retryWrites  = time.Second
	// writeTimeout bounds one write into the outbox.
	writeTimeout = 5 * time.Second
)

// notifier turns the limits' crossings into webhook events: written into the outbox (the
// Redis the replicas share, else in process) off the request path, then delivered by any
// replica. nil without notifications.webhooks.
type notifier struct {
	n      *notify.Notifier
	box    notify.Outbox
	queue  chan proxy.Crossing
	client redis.UniversalClient // the outbox's own client; nil in process
	log    *zap.Logger
	m      *metrics.Metrics
	// by is what each limit of the config in force counts by (configure), for the crossings
	// of charges, which know only the rule.
	by atomic.Pointer[map[string]string]
	// wants is the config's notifications: what some endpoint takes.
	wants *config.Notifications
	// unwritten are events whose write into the outbox failed, oldest first: the run
	// goroutine's, then close's once run has returned (runDone).
	unwritten []pendingEvent
	running   atomic.Bool
	runDone   chan struct{}
}

// pendingEvent is an event not yet written into the outbox, and the limit it is about.
type pendingEvent struct {
	ev    notify.Event
	limit string
}

func newNotifier(cfg *config.Config, m *metrics.Metrics, log *zap.Logger) *notifier {
	if !cfg.Notifications.Enabled() {
		return nil
	}
	nt := &notifier{queue: make(chan proxy.Crossing, crossingQueue), log: log.Named("notifications"), m: m,
		wants: &cfg.Notifications, runDone: make(chan struct{})}
	// A client of its own, with the operators' bounds: outbox scripts must not wait behind,
	// nor be bounded like, the request path's calls.
	if nt.client = newReaderClient(cfg.Redis); nt.client != nil {
		nt.box = notify.NewRedis(nt.client, cfg.Redis.KeyPrefix, outboxMax)
	} else {
		nt.box = notify.NewMemory(outboxMax)
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
	m.NotificationSeries(config.EventTypes, names)
	nt.configure(cfg)
	return nt
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
}

// charged is the limits' WithCrossings: what a charge of tokens crossed, queued as crossed
// queues a decision's. A charge knows no request: the org is the tenant's own when the limit
// counts by org, else unknown.
func (nt *notifier) charged(x limits.Crossed) {
	c := proxy.CrossingOf(x.Rule, x.Bits)
	c.Tenant, c.By = x.ID, (*nt.by.Load())[x.Rule.Name]
	if c.By == "org" {
		c.Org = x.ID
	}
	c.WindowStart, c.Used, c.Quota, c.Time = time.Unix(x.WindowStart, 0).UTC(), x.Used, x.Allow, time.Now()
	nt.crossed(c)
}

// crossed is proxy.Options.Crossings: it queues the crossing, or drops it (logged, counted)
// when the queue is full.
func (nt *notifier) crossed(c proxy.Crossing) {
	select {
	case nt.queue <- c:
	default:
		nt.log.Warn("notification dropped: the queue to the outbox is full", zap.String("limit", c.Limit))
		for _, typ := range typesOf(c) {
			nt.m.Notification(typ, "", notify.ResultDropped, 0)
		}
	}
}

// typesOf are the types of the events a crossing makes.
func typesOf(c proxy.Crossing) []string {
	var ts []string
	for range c.Thresholds {
		ts = append(ts, config.EventThresholdCrossed)
	}
	if c.Exhausted {
		ts = append(ts, config.EventExhausted)
	}
	if c.Forecast {
		ts = append(ts, config.EventForecast)
	}
	return ts
}

// start runs the notifier until ctx ends: crossings written into the outbox, deliveries,
// overrides' ends and revocations (watch).
func (nt *notifier) start(ctx context.Context, quotas limits.QuotaStore, keys auth.Registry) {
	nt.running.Store(true)
	go nt.run(ctx)
	go nt.watch(ctx, quotas, keys)
}

// run writes queued crossings into the outbox and delivers from it until ctx ends.
func (nt *notifier) run(ctx context.Context) {
	defer close(nt.runDone)
	done := make(chan struct{})
	go func() { nt.n.Run(ctx); close(done) }()
	defer func() { <-done }()
	t := time.NewTicker(outboxPoll)
	defer t.Stop()
	retry := time.NewTicker(retryWrites)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return // close writes what the last requests crossed
		case c := <-nt.queue:
			nt.publish(ctx, c)
		case <-retry.C:
			nt.writeUnwritten(ctx)
		case <-t.C:
			if p, d, err := nt.box.Count(ctx); err == nil {
				nt.m.NotificationOutbox(p, d)
			}
		}
	}
}

// publish writes the events of one crossing. Each crossing is detected once (the limits mark
// it in the tenant's counter), so each event gets an id of its own, kept across retries.
func (nt *notifier) publish(ctx context.Context, c proxy.Crossing) {
	ws := c.WindowStart.Format(time.RFC3339)
	data := map[string]any{"limit": c.Limit, "tenant": c.Tenant, "by": c.By, "window_start": ws, "used": c.Used, "quota": c.Quota}
	if c.Org != "" {
		data["org"] = c.Org
	}
	if c.Label != "" {
		data["label"] = c.Label
	}
	var evs []notify.Event
	for _, th := range c.Thresholds {
		d := maps.Clone(data)
		d["threshold"] = th
		evs = append(evs, notify.Event{Type: config.EventThresholdCrossed, Data: d})
	}
	if c.Exhausted {
		evs = append(evs, notify.Event{Type: config.EventExhausted, Data: data})
	}
	if c.Forecast {
		d := maps.Clone(data)
		rate, at := burn(c)
		d["rate_per_hour"], d["runs_out_at"] = rate, at.Format(time.RFC3339)
		evs = append(evs, notify.Event{Type: config.EventForecast, Data: d})
	}
	for _, ev := range evs {
		ev.Time = c.Time
		nt.publishOne(ctx, ev, c.Limit)
	}
}

// burn is a forecast's rate (units per hour of the window so far, to three decimals) and when
// the tenant runs out at it.
func burn(c proxy.Crossing) (perHour float64, runsOut time.Time) {
	elapsed := max(c.Time.Sub(c.WindowStart), time.Second)
	perHour = math.Round(float64(c.Used)/elapsed.Hours()*1000) / 1000
	left := float64(max(c.Quota-c.Used, 0)) / float64(max(c.Used, 1)) * float64(elapsed)
	return perHour, c.Time.Add(time.Duration(left)).UTC().Truncate(time.Second)
}

// publishOne writes ev into the outbox; when that fails (Redis unreachable) the event waits
// among the unwritten, retried in order every retryWrites: its crossing is marked in the
// counter already and will not be detected again. Only the run goroutine (and close, after
// it) calls it.
func (nt *notifier) publishOne(ctx context.Context, ev notify.Event, limit string) {
	if ev.ID == "" {
		ev.ID = notify.NewID() // before the first try, so every retry writes the same event
	}
	if len(nt.unwritten) > 0 || nt.write(ctx, ev, limit) != nil {
		nt.keep(pendingEvent{ev, limit})
	}
}

// write is one bounded write of ev into the outbox, cancelled by nothing but its bound: an
// event taken off the queue is written even while the gateway stops.
func (nt *notifier) write(ctx context.Context, ev notify.Event, limit string) error {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	return nt.n.Publish(wctx, ev, limit)
}

// keep adds p to the unwritten, dropping the oldest beyond maxUnwritten.
func (nt *notifier) keep(p pendingEvent) {
	if len(nt.unwritten) == 0 {
		nt.log.Warn("notifications are not written into the outbox: kept in memory and retried", zap.String("type", p.ev.Type))
	}
	nt.unwritten = append(nt.unwritten, p)
	if over := len(nt.unwritten) - maxUnwritten; over > 0 {
		for _, d := range nt.unwritten[:over] {
			nt.m.Notification(d.ev.Type, "", notify.ResultDropped, 0)
		}
		nt.log.Error("notifications dropped: too many not written into the outbox", zap.Int("count", over))
		nt.unwritten = slices.Delete(nt.unwritten, 0, over)
	}
}

// writeUnwritten retries the unwritten in order, until one fails again.
func (nt *notifier) writeUnwritten(ctx context.Context) {
	n := 0
	for _, p := range nt.unwritten {
		if nt.write(ctx, p.ev, p.limit) != nil {
			break
		}
		n++
	}
	if n > 0 {
		nt.unwritten = slices.Delete(nt.unwritten, 0, n)
		if len(nt.unwritten) == 0 {
			nt.log.Info("notifications kept in memory are written into the outbox", zap.Int("count", n))
		}
	}
}

// watch announces the ends of overrides (quota.override_expired) and the revocations of keys
// (key.revoked), read every overridesEvery and keysEvery until ctx ends. Every replica reads them; the outbox
// takes each event once (Event.Once with an id derived from what it reports). An override
// is announced when it leaves the list at its expiry (one ended early by an operator is not
// announced); one that expires while no replica runs is not either. keys is nil in prefix
// mode.
func (nt *notifier) watch(ctx context.Context, quotas limits.QuotaStore, keys auth.Registry) {
	var seen map[string]limits.Override // nil until the first read
	announced := map[string]time.Time{} // revocations published, by id, until revokedWithin
	var keysRead time.Time
	if !nt.wants.Wants(config.EventOverrideExpired, "") {
		quotas = nil // read only for an endpoint that takes them
	}
	if !nt.wants.Wants(config.EventKeyRevoked, "") {
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
		if keys != nil && time.Since(keysRead) >= keysEvery {
			nt.keysRevoked(ctx, keys, announced)
			keysRead = time.Now()
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
		nt.publishOne(ctx, notify.Event{Type: config.EventOverrideExpired, Time: o.Expires, Once: true,
			ID: notify.StableID(config.EventOverrideExpired, o.Limit, o.ID, exp),
			Data: map[string]any{"limit": o.Limit, "tenant": o.ID, "by": by[o.Limit], "override": o.Value,
				"expires": o.Expires.UTC().Format(time.RFC3339), "reason": o.Reason}}, o.Limit)
	}
	return inForce, true
}

func (nt *notifier) keysRevoked(ctx context.Context, keys auth.Registry, announced map[string]time.Time) {
	rctx, cancel := context.WithTimeout(ctx, overridesEvery)
	defer cancel()
	list, err := keys.List(rctx)
	if err != nil {
		nt.log.Warn("keys not read for key.revoked", zap.Error(err))
		return
	}
	now := time.Now()
	for id, at := range announced {
		if now.Sub(at) > revokedWithin {
			delete(announced, id)
		}
	}
	for _, e := range list {
		if e.Revoked == nil || e.Revoked.After(now) || now.Sub(*e.Revoked) > revokedWithin {
			continue
		}
		rev := e.Revoked.UTC().Format(time.RFC3339Nano)
		id := notify.StableID(config.EventKeyRevoked, e.Digest, rev)
		if _, ok := announced[id]; ok {
			continue
		}
		announced[id] = *e.Revoked
		data := map[string]any{"key": e.Digest, "tenant": e.Digest, "by": "key", "kind": e.Kind, "org": e.Org, "revoked_at": e.Revoked.UTC().Format(time.RFC3339)}
		if e.Label != "" {
			data["label"] = e.Label
		}
		nt.publishOne(ctx, notify.Event{Type: config.EventKeyRevoked, ID: id, Time: *e.Revoked, Once: true, Data: data}, "")
	}
}

// closeWrite bounds the writes of close.
const closeWrite = 3 * time.Second

// close writes into the outbox what is still queued (the crossings of the requests that ended
// while the gateway drained: serve calls it once they are all done) and what could not be
// written yet, then releases the outbox's client. In process, what it writes is lost with the
// process all the same.
func (nt *notifier) close() {
	if nt == nil {
		return
	}
	deadline := time.Now().Add(closeWrite)
	if nt.running.Load() {
		select { // run owns the unwritten until it returns
		case <-nt.runDone:
		case <-time.After(closeWrite):
			nt.log.Warn("notifications: the delivery loop did not stop in time")
		}
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline.Add(closeWrite))
	defer cancel()
	for done := false; !done; {
		select {
		case c := <-nt.queue:
			nt.publish(ctx, c)
		default:
			done = true
		}
	}
	nt.writeUnwritten(ctx)
	if n := len(nt.unwritten); n > 0 {
		nt.log.Error("notifications lost at shutdown: not written into the outbox", zap.Int("count", n))
		for _, p := range nt.unwritten {
			nt.m.Notification(p.ev.Type, "", notify.ResultDropped, 0)
		}
	}
	if nt.client != nil {
		_ = nt.client.Close()
	}
}
