package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/docsgate/gateway/engine"
	"github.com/docsgate/gateway/internal/redistest"
	"github.com/docsgate/gateway/metrics"
	"github.com/docsgate/gateway/notify"
)

// benchNotifier is a started notifier on store ("memory" or "redis") whose one endpoint
// holds every delivery unanswered until the benchmark ends: the replica's delivery loop
// then costs nothing while what is written is measured.
func benchNotifier(b *testing.B, store string) *notifier {
	held := make(chan struct{})
	url := "http://" + serveHeld(b, held)
	body := fmt.Sprintf("upstream: {url: 'http://127.0.0.1:1'}\nlimits:\n  assistant_per_ip: {thresholds: [1.0]}\n"+
		"notifications:\n  webhooks:\n    - {name: h, url: %q, secret: %q, allow_private_addresses: true}\n", url, hookSecret)
	if store == "redis" {
		body = fmt.Sprintf("redis: {addrs: [%q]}\n", redistest.Start(b).Addr) + body
	}
	path := filepath.Join(b.TempDir(), "gateway.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		b.Fatal(err)
	}
	cfg, err := loadConfig(path)
	if err != nil {
		b.Fatal(err)
	}
	nt := newNotifier(cfg, metrics.New(prometheus.NewRegistry()), zap.NewNop())
	ctx, cancel := context.WithCancel(context.Background())
	nt.start(ctx, nil, nil)
	b.Cleanup(func() { close(held); cancel(); nt.close() })
	return nt
}

// serveHeld serves on a free loopback port, answering nothing until held is closed.
func serveHeld(b *testing.B, held chan struct{}) string {
	srv := &http.Server{Handler: http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-held })}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	go srv.Serve(ln)
	b.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// visitorCrossing is the i-th visitor's crossing of one threshold: one event.
func visitorCrossing(i int) engine.Crossing {
	return engine.Crossing{Limit: "assistant_per_ip", Tenant: fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255), By: "ip",
		WindowStart: time.Now().Truncate(24 * time.Hour), Used: 10, Quota: 10, Thresholds: []float64{1}, Time: time.Now()}
}

// BenchmarkNotifierWrites is how many events a second one replica writes into the outbox:
// crossings of one event each handed over as requests do, 1,000 at a time (within the bound
// of any queue, so that none is dropped), each thousand waited for in the outbox.
func BenchmarkNotifierWrites(b *testing.B) {
	for _, store := range []string{"memory", "redis"} {
		b.Run(store, func(b *testing.B) {
			nt := benchNotifier(b, store)
			ctx := context.Background()
			cpu := redisCPU(b, nt)
			b.ResetTimer()
			for i := 0; i < b.N; i += 1000 {
				n := min(1000, b.N-i)
				for j := range n {
					nt.crossed(visitorCrossing(i + j))
				}
				for {
					p, d, err := nt.box.Count(ctx)
					if err != nil {
						b.Fatal(err)
					}
					if p+d >= i+n {
						break
					}
					time.Sleep(200 * time.Microsecond)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
			if store == "redis" {
				b.ReportMetric((redisCPU(b, nt)-cpu)*1e6/float64(b.N), "redis-µs/event")
			}
		})
	}
}

// redisCPU is the CPU seconds the outbox's Redis has used (INFO cpu, user and system); 0 in
// process.
func redisCPU(b *testing.B, nt *notifier) float64 {
	if nt.client == nil {
		return 0
	}
	info, err := nt.client.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	total := 0.0
	for _, line := range strings.Split(info, "\r\n") {
		for _, f := range []string{"used_cpu_user:", "used_cpu_sys:"} {
			if v, ok := strings.CutPrefix(line, f); ok {
				n, err := strconv.ParseFloat(v, 64)
				if err != nil {
					b.Fatal(err)
				}
				total += n
			}
		}
	}
	return total
}

// BenchmarkCrossingHandOver is what handing a crossing over costs the request's path (and
// taking it off, writeBatch at a time, as run does), below the bound: into the notifier's
// queue, against a buffered channel of the same bound (how crossings were handed over
// before).
func BenchmarkCrossingHandOver(b *testing.B) {
	c := visitorCrossing(1)
	b.Run("channel", func(b *testing.B) {
		ch := make(chan engine.Crossing, crossingQueue)
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			select {
			case ch <- c:
			default:
				b.Fatal("dropped")
			}
			if i++; i%writeBatch == 0 {
				for range writeBatch {
					<-ch
				}
			}
		}
	})
	b.Run("queue", func(b *testing.B) {
		nt := &notifier{queue: notify.NewQueue(crossingQueue, shareOf), ready: make(chan struct{}, 1)}
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			nt.crossed(c)
			if i++; i%writeBatch == 0 {
				<-nt.ready
				nt.mu.Lock()
				n := len(nt.queue.Pop(writeBatch))
				nt.mu.Unlock()
				if n != writeBatch {
					b.Fatal(n)
				}
			}
		}
	})
}
