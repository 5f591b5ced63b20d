package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// notifications are the webhook deliveries' collectors.
type notifications struct {
	total   *prometheus.CounterVec
	dropped *prometheus.CounterVec
	pending prometheus.Gauge
	dead    prometheus.Gauge
	latency *prometheus.HistogramVec
}

func newNotifications() notifications {
	return notifications{
		total: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gateway_notifications_total",
			Help: "Webhook delivery outcomes by event type and result: delivered (2xx), failed (an attempt failed; retried), dead (retried for notifications.retry_for, or answered 410: kept as a dead letter), dropped (never sent: see gateway_notifications_dropped_total).",
		}, []string{"type", "result"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gateway_notifications_dropped_total",
			Help: "Notifications dropped unsent, by limit (empty for an event of none, as key.revoked) and reason: queue_full (events: the replica's queue to the outbox was full), outbox_full (deliveries: the outbox was at its bound), outbox_down (events: the outbox could not be written and the replica's buffer for them was full), shutdown (events: not written into the outbox before the replica stopped). A tenant's is never dropped to make room for a visitor's (a limit by ip).",
		}, []string{"limit", "reason"}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gateway_notifications_pending",
			Help: "Webhook deliveries waiting in the outbox (shared by the replicas on Redis), as last read by this replica.",
		}),
		dead: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gateway_notifications_dead_letters",
			Help: "Webhook deliveries kept as dead letters in the outbox, as last read by this replica.",
		}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "gateway_notifications_delivery_seconds",
			Help:    "Histogram of webhook delivery attempts, request to answer (or to the timeout), by endpoint.",
			Buckets: latencyBuckets,
		}, []string{"endpoint"}),
	}
}

func (n notifications) collectors() []prometheus.Collector {
	return []prometheus.Collector{n.total, n.dropped, n.pending, n.dead, n.latency}
}

// Reasons of gateway_notifications_dropped_total.
const (
	DropQueueFull  = "queue_full"
	DropOutboxFull = "outbox_full"
	DropOutboxDown = "outbox_down"
	DropShutdown   = "shutdown"
)

var dropReasons = []string{DropQueueFull, DropOutboxFull, DropOutboxDown, DropShutdown}

// Notification results, the result label of gateway_notifications_total.
var notificationResults = []string{"delivered", "failed", "dead", "dropped"}

// NotificationSeries makes the series of each event type and result, each endpoint's latency
// histogram, and each limit's drops (limits: those that send events) exist at 0.
func (m *Metrics) NotificationSeries(types, endpoints, limits []string) {
	for _, t := range types {
		for _, r := range notificationResults {
			m.notify.total.WithLabelValues(t, r)
		}
	}
	for _, l := range limits {
		for _, r := range dropReasons {
			m.notify.dropped.WithLabelValues(l, r)
		}
	}
	for _, e := range endpoints {
		m.notify.latency.WithLabelValues(e)
	}
}

// Notification counts one outcome of a delivery of an event of type typ to endpoint; latency
// is the attempt's (0: no attempt, as for a drop).
func (m *Metrics) Notification(typ, endpoint, result string, latency time.Duration) {
	m.notify.total.WithLabelValues(typ, result).Inc()
	if latency > 0 {
		m.notify.latency.WithLabelValues(endpoint).Observe(latency.Seconds())
	}
}

// NotificationDropped counts n events (deliveries for DropOutboxFull) of limit dropped for
// reason (DropQueueFull, DropOutboxFull, DropOutboxDown, DropShutdown).
func (m *Metrics) NotificationDropped(limit, reason string, n int) {
	m.notify.dropped.WithLabelValues(limit, reason).Add(float64(n))
}

// NotificationOutbox sets the outbox's pending deliveries and dead letters.
func (m *Metrics) NotificationOutbox(pending, dead int) {
	m.notify.pending.Set(float64(pending))
	m.notify.dead.Set(float64(dead))
}
