package notify

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/docsgate/gateway/internal/redistest"
)

// visitorDelivery is a delivery as the gateway writes it for a visitor's crossing: the event's
// JSON as the notifier makes it, bound for one endpoint.
func visitorDelivery(tb testing.TB, i int, at time.Time) Delivery {
	ws := at.Truncate(24 * time.Hour).Format(time.RFC3339)
	ev := Event{Type: "quota.threshold_crossed", ID: NewID(), Time: at.UTC(), Data: map[string]any{
		"limit": "assistant_per_ip", "tenant": fmt.Sprintf("198.51.%d.%d", i/256%256, i%256), "by": "ip",
		"window_start": ws, "used": 8000, "quota": 10000, "threshold": 0.8}}
	body, err := json.Marshal(ev)
	if err != nil {
		tb.Fatal(err)
	}
	return Delivery{Key: DeliveryKey(ev.ID, "billing"), ID: ev.ID, Endpoint: "billing", Type: ev.Type, Body: body,
		Created: at, Next: at, Limit: "assistant_per_ip", Visitor: true}
}

// benchOutboxes runs f on each outbox holding at most max.
func benchOutboxes(b *testing.B, max int, f func(b *testing.B, box Outbox)) {
	b.Run("memory", func(b *testing.B) { f(b, NewMemory(max)) })
	b.Run("redis", func(b *testing.B) {
		srv := redistest.Start(b)
		f(b, NewRedis(srv.Client(b), "gw", max))
	})
}

// BenchmarkOutboxAdd is how many deliveries a second one writer puts into an outbox with
// room, one delivery per call (as before batching) and 128 per call (as the gateway writes).
func BenchmarkOutboxAdd(b *testing.B) {
	for _, batch := range []int{1, 128} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			benchOutboxes(b, 1<<30, func(b *testing.B, box Outbox) {
				benchAdd(b, box, batch)
			})
		})
	}
}

// BenchmarkOutboxAddFull is the same into an outbox at its bound of 100,000: every delivery
// added makes room.
func BenchmarkOutboxAddFull(b *testing.B) {
	for _, batch := range []int{1, 128} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			benchOutboxes(b, 100_000, func(b *testing.B, box Outbox) {
				fill(b, box, 100_000)
				benchAdd(b, box, batch)
			})
		})
	}
}

func fill(b *testing.B, box Outbox, n int) {
	at := time.Now()
	for i := 0; i < n; i += 1000 {
		ds := make([]Delivery, 0, 1000)
		for j := range min(1000, n-i) {
			ds = append(ds, visitorDelivery(b, i+j, at))
		}
		if _, err := box.Add(context.Background(), ds); err != nil {
			b.Fatal(err)
		}
	}
}

func benchAdd(b *testing.B, box Outbox, batch int) {
	ctx := context.Background()
	at := time.Now()
	ds := make([]Delivery, 0, b.N)
	for i := range b.N {
		ds = append(ds, visitorDelivery(b, i, at))
	}
	b.ResetTimer()
	for i := 0; i < len(ds); i += batch {
		if _, err := box.Add(ctx, ds[i:min(i+batch, len(ds))]); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "deliveries/s")
}

// BenchmarkOutboxRedisBytes is what a pending delivery costs Redis: used_memory grown by
// 20,000 visitors' deliveries, per delivery.
func BenchmarkOutboxRedisBytes(b *testing.B) {
	srv := redistest.Start(b)
	c := srv.Client(b)
	box := NewRedis(c, "gw", 100_000)
	before := redistest.InfoInt(b, c, "memory", "used_memory")
	const n = 20_000
	fill(b, box, n)
	after := redistest.InfoInt(b, c, "memory", "used_memory")
	b.ReportMetric(float64(after-before)/n, "bytes/delivery")
}
