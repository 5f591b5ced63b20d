package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// notifications are the webhook deliveries' collectors.
type notifications struct {
	total   *prometheus.CounterVec
	pending prometheus.Gauge
	dead    prometheus.Gauge
	latency *prometheus.HistogramVec
}

func newNotifications() notifications {
	return notifications{
		total: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "gateway_notifications_total",
			Help: "Webhook delivery outcomes by event type and result: delivered (2xx), failed (an attempt failed; retried), dead (retried for notifications.retry_for, or answered 410: kept as a dead letter), dropped (the outbox was full: dropped unsent, oldest first).",
		}, []string{"type", "result"}),
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
	return []prometheus.Collector{n.total, n.pending, n.dead, n.latency}
}

// Notification results, the result label of gateway_notifications_total.
var notificationResults = []string{"delivered", "failed", "dead", "dropped"}

// NotificationSeries makes the series of each event type and result, and each endpoint's
// latency histogram, exist at 0.
func (m *Metrics) NotificationSeries(types, endpoints []string) {
	for _, t := range types {
		for _, r := range notificationResults {
			m.notify.total.WithLabelValues(t, r)
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

// NotificationOutbox sets the outbox's pending deliveries and dead letters.
func (m *Metrics) NotificationOutbox(pending, dead int) {
	m.notify.pending.Set(float64(pending))
	m.notify.dead.Set(float64(dead))
}
