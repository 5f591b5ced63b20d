package main

import (
	"encoding/json"
	"maps"
	"slices"
	"sync"

	"go.uber.org/zap"

	"github.com/docsgate/gateway/engine"
	"github.com/docsgate/gateway/metrics"
	"github.com/docsgate/gateway/notify"
)

// dropLogTenants bounds the tenants one drop log line names.
const dropLogTenants = 20

// dropLog gathers the notifications dropped since its last line, for one warning at most
// every retryWrites (a second): a flood drops thousands, and a line each would drown the log.
type dropLog struct {
	log *zap.Logger
	mu  sync.Mutex
	// count is how many were dropped, byReason and byLimit the same split; tenants names
	// the tenants (by project, key or org) whose notifications were dropped, at most
	// dropLogTenants, and more counts the others; visitors counts the visitors' (by ip).
	count    int
	byReason map[string]int
	byLimit  map[string]int
	tenants  []string
	more     int
	visitors int
}

func newDropLog(log *zap.Logger) *dropLog {
	return &dropLog{log: log, byReason: map[string]int{}, byLimit: map[string]int{}}
}

// add records n dropped for reason, of share s; tenant is whose they were (a tenant's id),
// read for tenants' only: a visitor's address is counted, never named.
func (l *dropLog) add(reason string, s notify.Share, n int, tenant func() string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.count += n
	l.byReason[reason] += n
	l.byLimit[s.Limit] += n
	if s.Visitor {
		l.visitors += n
		return
	}
	if t := tenant(); !slices.Contains(l.tenants, t) {
		if len(l.tenants) < dropLogTenants {
			l.tenants = append(l.tenants, t)
		} else {
			l.more++
		}
	}
}

// flush writes one line of what was dropped since the last, if anything was.
func (l *dropLog) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.count == 0 {
		return
	}
	l.log.Warn("notifications dropped, never sent", zap.Int("count", l.count), zap.Any("by_reason", maps.Clone(l.byReason)),
		zap.Any("by_limit", maps.Clone(l.byLimit)), zap.Strings("tenants", l.tenants), zap.Int("tenants_not_named", l.more),
		zap.Int("visitors", l.visitors))
	l.count, l.tenants, l.more, l.visitors = 0, nil, 0, 0
	clear(l.byReason)
	clear(l.byLimit)
}

// dropCrossing counts the events of a crossing dropped for reason.
func (nt *notifier) dropCrossing(c engine.Crossing, reason string) {
	types := typesOf(c)
	for _, typ := range types {
		nt.m.Notification(typ, "", notify.ResultDropped, 0)
	}
	nt.m.NotificationDropped(c.Limit, reason, len(types))
	nt.drops.add(reason, shareOf(c), len(types), func() string { return c.Tenant })
}

// dropEvent counts an event dropped for reason.
func (nt *notifier) dropEvent(ev notify.Event, reason string) {
	nt.m.Notification(ev.Type, "", notify.ResultDropped, 0)
	nt.m.NotificationDropped(ev.Share.Limit, reason, 1)
	nt.drops.add(reason, ev.Share, 1, func() string {
		d, _ := ev.Data.(map[string]any)
		t, _ := d["tenant"].(string)
		return t
	})
}

// dropDelivery counts a delivery the outbox dropped (the notifier reported its result).
func (nt *notifier) dropDelivery(d notify.Delivery) {
	nt.m.NotificationDropped(d.Limit, metrics.DropOutboxFull, 1)
	nt.drops.add(metrics.DropOutboxFull, d.Share(), 1, func() string {
		var ev struct {
			Data struct {
				Tenant string `json:"tenant"`
			} `json:"data"`
		}
		_ = json.Unmarshal(d.Body, &ev) // an event of another shape names no tenant
		return ev.Data.Tenant
	})
}
