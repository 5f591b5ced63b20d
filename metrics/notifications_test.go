package metrics

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestNotificationSeries(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := New(reg)
	m.NotificationSeries([]string{"quota.exhausted", "ping"}, []string{"billing"}, []string{"assistant_per_ip"})
	for _, r := range []string{"delivered", "failed", "dead", "dropped"} {
		if got := value(t, reg, "gateway_notifications_total", "type", "ping", "result", r); got != 0 {
			t.Errorf("%s: %v, want a series at 0", r, got)
		}
	}
	if got := value(t, reg, "gateway_notifications_delivery_seconds", "endpoint", "billing"); got != 0 {
		t.Errorf("latency: %v", got)
	}
	m.Notification("quota.exhausted", "billing", "failed", 30*time.Millisecond)
	m.Notification("quota.exhausted", "billing", "delivered", 20*time.Millisecond)
	m.Notification("quota.exhausted", "billing", "dropped", 0)
	if got := value(t, reg, "gateway_notifications_total", "type", "quota.exhausted", "result", "failed"); got != 1 {
		t.Errorf("failed: %v", got)
	}
	if got := value(t, reg, "gateway_notifications_total", "type", "quota.exhausted", "result", "dropped"); got != 1 {
		t.Errorf("dropped: %v", got)
	}
	if got := value(t, reg, "gateway_notifications_delivery_seconds", "endpoint", "billing"); got != 2 {
		t.Errorf("attempts timed: %v, want 2 (a drop is no attempt)", got)
	}
	for _, r := range []string{"queue_full", "outbox_full", "outbox_down", "shutdown"} {
		if got := value(t, reg, "gateway_notifications_dropped_total", "limit", "assistant_per_ip", "reason", r); got != 0 {
			t.Errorf("dropped %s: %v, want a series at 0", r, got)
		}
	}
	m.NotificationDropped("assistant_per_ip", DropOutboxFull, 3)
	m.NotificationDropped("assistant_per_ip", DropOutboxFull, 2)
	if got := value(t, reg, "gateway_notifications_dropped_total", "limit", "assistant_per_ip", "reason", "outbox_full"); got != 5 {
		t.Errorf("dropped: %v, want 5", got)
	}
	m.NotificationOutbox(3, 1)
	if p, d := value(t, reg, "gateway_notifications_pending"), value(t, reg, "gateway_notifications_dead_letters"); p != 3 || d != 1 {
		t.Errorf("outbox: %v pending, %v dead", p, d)
	}
}
