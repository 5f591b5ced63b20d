package main

import (
	"context"
	"maps"
	"math"
	"time"

	"go.uber.org/zap"

	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/engine"
	"github.com/docsgate/gateway/metrics"
	"github.com/docsgate/gateway/notify"
)

// writeQueued writes the events of writeBatch queued crossings (the tenants' first:
// notify.Queue) into the outbox, and says whether more are queued: run then comes back for
// them after its other work, so that a flood never starves its retries and its log. Only run
// (and close, after it) calls it.
func (nt *notifier) writeQueued(ctx context.Context) (more bool) {
	nt.mu.Lock()
	cs := nt.queue.Pop(writeBatch)
	more = nt.queue.Len() > 0
	nt.mu.Unlock()
	var evs []notify.Event
	for _, c := range cs {
		evs = append(evs, eventsOf(c)...)
	}
	nt.publish(ctx, evs)
	return more
}

// eventsOf are the events of one crossing. Each crossing is detected once (the limits mark
// it in the tenant's counter), so each event gets an id of its own, kept across retries.
func eventsOf(c engine.Crossing) []notify.Event {
	ws := c.WindowStart.Format(time.RFC3339)
	data := map[string]any{"limit": c.Limit, "tenant": c.Tenant, "by": c.By, "unit": c.Unit, "window_start": ws, "used": c.Used, "quota": c.Quota}
	if c.Reserves {
		data["reserved"] = c.Reserved
	}
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
	for i := range evs {
		evs[i].ID, evs[i].Time, evs[i].Share = notify.NewID(), c.Time, shareOf(c)
	}
	return evs
}

// typesOf are the types of the events a crossing makes.
func typesOf(c engine.Crossing) []string {
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

// burn is a forecast's rate (units per hour of the window so far, to three decimals) and when
// the tenant runs out at it.
func burn(c engine.Crossing) (perHour float64, runsOut time.Time) {
	elapsed := max(c.Time.Sub(c.WindowStart), time.Second)
	perHour = math.Round(float64(c.Used)/elapsed.Hours()*1000) / 1000
	left := float64(max(c.Quota-c.Used, 0)) / float64(max(c.Used, 1)) * float64(elapsed)
	return perHour, c.Time.Add(time.Duration(left)).UTC().Truncate(time.Second)
}

// publish writes evs (with their ids) into the outbox, writeBatch at a time. While earlier
// events wait among the unwritten, or when a write fails (Redis unreachable), the events
// join the unwritten, retried in order every retryWrites: their crossings are marked in the
// counters already and will not be detected again. Only run (and close, after it) calls it.
func (nt *notifier) publish(ctx context.Context, evs []notify.Event) {
	for len(evs) > 0 && nt.unwritten.Len() == 0 {
		batch := evs[:min(writeBatch, len(evs))]
		if nt.write(ctx, batch) != nil {
			nt.log.Warn("notifications are not written into the outbox: kept in memory and retried")
			break
		}
		evs = evs[len(batch):]
	}
	for _, ev := range evs {
		if dropped, ok := nt.unwritten.Push(ev); ok {
			nt.dropEvent(dropped, metrics.DropOutboxDown)
		}
	}
}

// write is one bounded write of evs into the outbox, cancelled by nothing but its bound: an
// event taken off the queue is written even while the gateway stops. What the outbox dropped
// to take them is counted and logged.
func (nt *notifier) write(ctx context.Context, evs []notify.Event) error {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
	defer cancel()
	dropped, err := nt.n.Publish(wctx, evs...)
	for _, d := range dropped {
		nt.dropDelivery(d)
	}
	return err
}

// writeUnwritten retries the unwritten in order, writeBatch at a time, until a write fails
// again or ctx ends (run stops; close writes the rest with a context of its own).
func (nt *notifier) writeUnwritten(ctx context.Context) {
	n := 0
	for nt.unwritten.Len() > 0 && ctx.Err() == nil {
		evs := nt.unwritten.Pop(writeBatch)
		if nt.write(ctx, evs) != nil {
			nt.unwritten.PushFront(evs)
			break
		}
		n += len(evs)
	}
	if n > 0 && nt.unwritten.Len() == 0 {
		nt.log.Info("notifications kept in memory are written into the outbox", zap.Int("count", n))
	}
}
