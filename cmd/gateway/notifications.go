package main

import (
	"context"
	"maps"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"

	"github.com/docsgate/gateway/config"
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
}

func newNotifier(cfg *config.Config, m *metrics.Metrics, log *zap.Logger) *notifier {
	if !cfg.Notifications.Enabled() {
		return nil
	}
	nt := &notifier{queue: make(chan proxy.Crossing, crossingQueue), log: log.Named("notifications"), m: m}
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
		eps = append(eps, notify.Endpoint{Name: w.Name, URL: w.URL, Keys: w.Keys, Events: w.Events, Limits: w.Limits})
		names = append(names, w.Name)
	}
	nc := cfg.Notifications
	nt.n = notify.New(nt.box, eps, notify.Options{Timeout: nc.Timeout, MaxBackoff: nc.MaxBackoff, RetryFor: nc.RetryFor, Log: nt.log,
		OnResult: func(d notify.Delivery, result string, latency time.Duration) {
			m.Notification(d.Type, d.Endpoint, result, latency)
		}})
	m.NotificationSeries(config.EventTypes, names)
	return nt
}

// crossed is proxy.Options.Crossings: it queues the crossing, or drops it (logged, counted)
// when the queue is full.
func (nt *notifier) crossed(c proxy.Crossing) {
	select {
	case nt.queue <- c:
	default:
		nt.log.Warn("notification dropped: the queue to the outbox is full", zap.String("limit", c.Limit))
		nt.m.Notification(config.EventThresholdCrossed, "", notify.ResultDropped, 0)
	}
}

// run writes queued crossings into the outbox and delivers from it until ctx ends.
func (nt *notifier) run(ctx context.Context) {
	done := make(chan struct{})
	go func() { nt.n.Run(ctx); close(done) }()
	defer func() { <-done }()
	t := time.NewTicker(outboxPoll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			if n := len(nt.queue); n > 0 {
				nt.log.Warn("notifications not written to the outbox at shutdown", zap.Int("count", n))
			}
			return
		case c := <-nt.queue:
			nt.publish(ctx, c)
		case <-t.C:
			if p, d, err := nt.box.Count(ctx); err == nil {
				nt.m.NotificationOutbox(p, d)
			}
		}
	}
}

// publish writes the events of one crossing. Their ids derive from what they report, so an
// event written twice is stored once.
func (nt *notifier) publish(ctx context.Context, c proxy.Crossing) {
	ws := c.WindowStart.Format(time.RFC3339)
	data := map[string]any{"limit": c.Limit, "tenant": c.Tenant, "by": c.By, "window_start": ws, "used": c.Used, "quota": c.Quota}
	if c.Org != "" {
		data["org"] = c.Org
	}
	var evs []notify.Event
	for _, th := range c.Thresholds {
		d := maps.Clone(data)
		d["threshold"] = th
		evs = append(evs, notify.Event{Type: config.EventThresholdCrossed, Time: c.Time, Data: d,
			ID: notify.StableID(config.EventThresholdCrossed, c.Limit, c.Tenant, ws, strconv.FormatFloat(th, 'g', -1, 64))})
	}
	if c.Exhausted {
		evs = append(evs, notify.Event{Type: config.EventExhausted, Time: c.Time, Data: data,
			ID: notify.StableID(config.EventExhausted, c.Limit, c.Tenant, ws)})
	}
	for _, ev := range evs {
		if err := nt.n.Publish(ctx, ev, c.Limit); err != nil {
			nt.log.Error("notification not written to the outbox", zap.String("type", ev.Type), zap.String("limit", c.Limit), zap.Error(err))
			nt.m.Notification(ev.Type, "", notify.ResultDropped, 0)
		}
	}
}

// close releases the outbox's client.
func (nt *notifier) close() {
	if nt != nil && nt.client != nil {
		_ = nt.client.Close()
	}
}
