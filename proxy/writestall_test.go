package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/internal/redistest"
	"github.com/docsgate/gateway/internal/stalltest"
)

// stuckWriter is a connection's writer whose writes block, once stuck is set, until a write
// deadline in the past is set: what net/http's writer does for a client that stopped reading.
type stuckWriter struct {
	h         http.Header
	mu        sync.Mutex
	stuck     bool
	freed     chan struct{} // closed by a deadline in the past
	deadlines []time.Time
}

func newStuckWriter() *stuckWriter { return &stuckWriter{h: http.Header{}, freed: make(chan struct{})} }

func (w *stuckWriter) Header() http.Header { return w.h }
func (w *stuckWriter) WriteHeader(int)     {}
func (w *stuckWriter) FlushError() error   { _, err := w.Write(nil); return err }

func (w *stuckWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	stuck := w.stuck
	w.mu.Unlock()
	if stuck {
		<-w.freed
		return 0, os.ErrDeadlineExceeded
	}
	return len(p), nil
}

func (w *stuckWriter) SetWriteDeadline(d time.Time) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.deadlines = append(w.deadlines, d)
	if !d.IsZero() && d.Before(time.Now()) {
		select {
		case <-w.freed:
		default:
			close(w.freed)
		}
	}
	return nil
}

func (w *stuckWriter) lastDeadline() (time.Time, int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.deadlines) == 0 {
		return time.Time{}, 0
	}
	return w.deadlines[len(w.deadlines)-1], len(w.deadlines)
}

// A write that does not return within the bound is failed (a deadline in the past), never
// sooner than the bound, and the watch says the stream stalled.
func TestStallWatchEndsAStuckWrite(t *testing.T) {
	const limit = 300 * time.Millisecond
	sw := newStuckWriter()
	w := &responseWriter{ResponseWriter: sw}
	w.watch.Start(limit, sw)
	for range 5 {
		if _, err := w.Write([]byte("part")); err != nil {
			t.Fatal(err)
		}
	}
	sw.mu.Lock()
	sw.stuck = true
	sw.mu.Unlock()
	start := time.Now()
	_, err := w.Write([]byte("part"))
	took := time.Since(start)
	if err == nil || !w.watch.Stalled() {
		t.Fatalf("a stuck write: %v, stalled %t", err, w.watch.Stalled())
	}
	if took < limit || took > limit+2*time.Second {
		t.Fatalf("the stuck write failed after %v, want the bound %v (plus scheduling)", took, limit)
	}
	w.watch.Stop()
	if _, n := sw.lastDeadline(); n != 1 {
		t.Fatalf("%d deadlines set; after a stall stop sets none", n)
	}
}

// Pauses with no write under way (an upstream that thinks) never end a stream, however long;
// writes that return keep it alive past many bounds; stop bounds what net/http writes after
// the handler with a deadline one bound ahead.
func TestStallWatchSparesPauses(t *testing.T) {
	const limit = 200 * time.Millisecond
	sw := newStuckWriter()
	w := &responseWriter{ResponseWriter: sw}
	w.watch.Start(limit, sw)
	if _, err := w.Write([]byte("part")); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * limit) // idle: no write under way
	for end := time.Now().Add(4 * limit); time.Now().Before(end); time.Sleep(limit / 10) {
		if _, err := w.Write([]byte("part")); err != nil {
			t.Fatal(err)
		}
		if err := w.FlushError(); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(2 * limit)
	if w.watch.Stalled() {
		t.Fatal("a stream that accepted every write was ended")
	}
	before := time.Now()
	w.watch.Stop()
	d, n := sw.lastDeadline()
	if n != 1 || d.Before(before.Add(limit)) || d.After(time.Now().Add(limit)) {
		t.Fatalf("%d deadlines, the last %v; want one, a bound after stop", n, d)
	}
}

// stallUpstream streams a UI message stream: with ?mode=long, text until its write fails
// (the gateway closed the connection: reported on gone), up to 64 MiB; with ?mode=slow, a
// part every 100 ms for 3 s; else a short answer.
func stallUpstream(t *testing.T) (*upstream, chan struct{}) {
	gone := make(chan struct{}, 8)
	up := newUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		startUIStream(w)
		part := sse(`{"type":"text-delta","id":"t","delta":"` + strings.Repeat("x", 1000) + `"}`)
		switch r.URL.Query().Get("mode") {
		case "long":
			for sent := 0; sent < 64<<20; sent += len(part) {
				if _, err := io.WriteString(w, part); err != nil {
					gone <- struct{}{}
					return
				}
			}
		case "slow":
			for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
				fmt.Fprint(w, part)
				w.(http.Flusher).Flush()
			}
		}
		fmt.Fprint(w, sse(`{"type":"finish","finishReason":"stop"}`, `[DONE]`))
	})
	return up, gone
}

// startUIStream answers with a UI message stream's headers and its start chunk, flushed.
func startUIStream(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("X-Vercel-Ai-Ui-Message-Stream", "v1")
	w.WriteHeader(200)
	io.WriteString(w, sse(`{"type":"start","messageId":"m"}`))
	w.(http.Flusher).Flush()
}

const stallPath = "/discovery/v2/assistant/acme/message"

// stallLimits caps the v2 route at one stream per org, with a tokens hold beside it.
func stallLimits(reserveTTL time.Duration) gatewayOpt {
	return func(c *cfgT) {
		one, tokens, reserve := int64(1), int64(1_000_000), int64(100)
		c.Limits = map[string]config.Limit{
			"tok":   {Limit: &tokens, Window: "month", By: "org", Unit: "tokens", Reserve: &reserve, ReserveTTL: reserveTTL},
			"slots": {Limit: &one, By: "org", Unit: "streams", ReserveTTL: reserveTTL},
		}
		c.Routes[1].Limits = &[]string{"tok", "slots"}
	}
}

// A client that stops reading a long streamed answer, over HTTP/1.1 and h2c: while the bound
// has not passed its slot is taken (a second stream gets 429); then the gateway ends the
// stream, closes the upstream connection, settles the slot and the token hold as for a client
// that went away (a second stream is admitted), counts the stall and logs it.
func TestStalledClientEndsStream(t *testing.T) {
	stores(t, func(t *testing.T, withStore gatewayOpt, _ *redistest.Server) {
		for _, proto := range []string{"h1", "h2c"} {
			t.Run(proto, func(t *testing.T) {
				up, gone := stallUpstream(t)
				g := newGateway(t, up, withStore, stallLimits(0), func(c *cfgT) { c.Server.WriteStallTimeout = 2 * time.Second })
				stalltest.StopReading(t, proto, g.Listener.Addr().String(), stallPath+"?mode=long", jsonHdr(assistantKey), assistantBody)
				start := time.Now()
				if res, data := g.do(t, "POST", stallPath, jsonHdr(assistantKey), assistantBody); res.StatusCode != 429 {
					t.Fatalf("a second stream while the first is held: %d %s", res.StatusCode, data)
				}
				select {
				case <-gone:
				case <-time.After(15 * time.Second):
					t.Fatal("the upstream connection of a stalled stream was not closed")
				}
				waitSettled(t, g)
				t.Logf("%s: slot back %v after the stream's headers (bound 2s)", proto, time.Since(start).Round(time.Millisecond))
				if res, data := g.do(t, "POST", stallPath, jsonHdr(assistantKey), assistantBody); res.StatusCode != 200 {
					t.Fatalf("a stream after the stalled one: %d %s", res.StatusCode, data)
				}
				if n := g.counter(t, "gateway_stream_stalled_total", "route", "assistant_message_v2"); n != 1 {
					t.Fatalf("gateway_stream_stalled_total %v, want 1", n)
				}
				stalled := 0
				for _, e := range g.logs.FilterMessage("request").All() {
					if m := e.ContextMap(); m["stalled"] == true {
						stalled++
						if m["upstream_error"] != "canceled" {
							t.Fatalf("a stalled stream's log line: %v", m)
						}
					}
				}
				if stalled != 1 {
					t.Fatalf("%d access-log lines say stalled, want 1", stalled)
				}
				// The next protocol's gateway shares the store: the last stream's slot is
				// given back after its client has read the end, so wait for it.
				waitSettled(t, g)
			})
		}
	})
}

// A stream that outlives reserve_ttl keeps its slot and its hold: a second stream is refused
// until the first has ended, on both protocols' usual client (HTTP/1.1 here).
func TestLiveStreamOutlivesReserveTTL(t *testing.T) {
	stores(t, func(t *testing.T, withStore gatewayOpt, _ *redistest.Server) {
		up, _ := stallUpstream(t)
		g := newGateway(t, up, withStore, stallLimits(time.Second))
		done := make(chan error, 1)
		go func() {
			req, _ := http.NewRequest("POST", g.URL+stallPath+"?mode=slow", strings.NewReader(assistantBody))
			req.Header = jsonHdr(assistantKey)
			res, err := g.Client().Do(req)
			if err == nil {
				_, err = io.Copy(io.Discard, res.Body)
				res.Body.Close()
			}
			done <- err
		}()
		time.Sleep(300 * time.Millisecond)
		for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
			if res, data := g.do(t, "POST", stallPath, jsonHdr(assistantKey), assistantBody); res.StatusCode != 429 {
				t.Fatalf("a second stream while the first lives past reserve_ttl: %d %s", res.StatusCode, data)
			}
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		waitSettled(t, g)
		if res, data := g.do(t, "POST", stallPath, jsonHdr(assistantKey), assistantBody); res.StatusCode != 200 {
			t.Fatalf("a stream after the first ended: %d %s", res.StatusCode, data)
		}
	})
}

// waitSettled waits until acme's slot is free and nothing of its tokens is held.
func waitSettled(t *testing.T, g *gateway) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		us, err := g.eng.Usage(context.Background(), "org", "acme")
		if err != nil {
			t.Fatal(err)
		}
		free := 0
		for _, u := range us {
			if u.Name == "slots" && u.Used == 0 || u.Name == "tok" && u.Reserved == 0 {
				free++
			}
		}
		if free == 2 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%+v, want the slot back and nothing held", us)
		}
	}
}
