package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/docsgate/gateway/internal/stalltest"
)

// Streams that stop moving end (issue 30, finding 3): a client that stops reading a large
// streamed answer holds its streams slot for server.write_stall_timeout at most, and a stream
// that keeps flowing past reserve_ttl keeps its slot and hold counted.

// stallUpstream answers v1 assistant requests with an AI SDK data stream chosen by the body's
// fp: "flood" sends text until a write fails (the gateway closed the connection: reported on
// gone), at most 256 MiB; "slow" a part every 100 ms for 6.5 s; anything else a short answer.
func stallUpstream(t *testing.T) (url string, gone chan struct{}) {
	gone = make(chan struct{}, 16)
	url = serveHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			FP string `json:"fp"`
		}
		_ = json.NewDecoder(r.Body).Decode(&body)
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprint(w, "f:{\"messageId\":\"m\"}\n")
		w.(http.Flusher).Flush()
		part := "0:\"" + strings.Repeat("x", 1000) + "\"\n"
		switch body.FP {
		case "flood":
			for sent := 0; sent < 256<<20; sent += len(part) {
				if _, err := io.WriteString(w, part); err != nil {
					gone <- struct{}{}
					return
				}
			}
		case "slow":
			for end := time.Now().Add(6500 * time.Millisecond); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
				if _, err := io.WriteString(w, part); err != nil {
					return
				}
				w.(http.Flusher).Flush()
			}
		}
		fmt.Fprint(w, "d:{\"finishReason\":\"stop\",\"usage\":{\"promptTokens\":1,\"completionTokens\":1}}\n")
	}))
	return url, gone
}

// stallConfig caps acme at one stream in flight, with a tokens hold beside the slot; ttl, when
// set, is both limits' reserve_ttl.
func stallConfig(transport, ttl string) string {
	extra := ""
	if ttl != "" {
		extra = ", reserve_ttl: " + ttl
	}
	return fmt.Sprintf(`  transport: %s
orgs: {acme: [acme-docs]}
limits:
  acme_streams: {limit: 1, by: org, unit: streams%[2]s}
  acme_tokens: {limit: 1000000, window: month, by: org, unit: tokens, reserve: 100%[2]s}
routes:
  - name: assistant_message
    limits: [assistant_per_key, assistant_per_org, assistant_per_ip, acme_streams, acme_tokens]
`, transport, extra)
}

const stallPath = "/discovery/v1/assistant/acme-docs/message"

// askStream sends one request of acme with fp and returns its status, reading the answer
// whole.
func askStream(t *testing.T, p *proc, fp string) int {
	t.Helper()
	code, err := ask(p, fp)
	if err != nil {
		t.Fatal(err)
	}
	return code
}

// ask is askStream for another goroutine than the test's.
func ask(p *proc, fp string) (int, error) {
	req, _ := http.NewRequest("POST", "http://"+p.public+stallPath, strings.NewReader(`{"fp":"`+fp+`","messages":[]}`))
	req.Header.Set("Authorization", "Bearer svc_dsc_stall")
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	_, err = io.Copy(io.Discard, res.Body)
	return res.StatusCode, err
}

// A client that stops reading a large streamed answer on a route capped at one stream, with
// the default write_stall_timeout (10s), on both upstream transports, over HTTP/1.1 and h2c:
// while the bound runs the slot is taken (429); the slot is back within the bound plus a
// second of the client's last read (a new stream is admitted), the upstream connection is
// closed, and gateway_stream_stalled_total counts it (its series exists at 0 before).
func TestStalledReaderFreesItsSlot(t *testing.T) {
	const bound = 10 * time.Second // the default
	for _, tr := range transports {
		for _, proto := range []string{"h1", "h2c"} {
			// The four at once: each flood costs CPU only until the socket buffers between
			// the client and the gateway are full (milliseconds); after that every stalled
			// stream only waits for its bound, and waiting four times in a row took 40 s.
			t.Run(tr+"/"+proto, func(t *testing.T) {
				t.Parallel()
				up, gone := stallUpstream(t)
				p := startGateway(t, up, stallConfig(tr, ""))
				const series = `gateway_stream_stalled_total{route="assistant_message"}`
				if v, ok := scrape(t, p)[series]; !ok || v != 0 {
					t.Fatalf("%s before any stall: %v %t, want 0", series, v, ok)
				}
				// The gateway's last write that moved happened between asked (no byte could
				// move before the request) and a little after stopped (the buffers filling
				// once the client stops): the slot must stay taken for the bound counted from
				// asked, and come back within the bound and a second counted from stopped.
				asked := time.Now()
				stalltest.StopReading(t, proto, p.public, stallPath, http.Header{
					"Authorization": {"Bearer svc_dsc_stall"}, "Content-Type": {"application/json"},
				}, `{"fp":"flood","messages":[]}`)
				stopped := time.Now()
				if code := askStream(t, p, "short"); code != 429 {
					t.Fatalf("a second stream while the unread one holds the slot: %d, want 429", code)
				}
				for askStream(t, p, "short") != 200 {
					if time.Since(stopped) > bound+time.Second {
						t.Fatalf("the slot is still taken %v after the client stopped reading (bound %v)", time.Since(stopped), bound)
					}
					time.Sleep(100 * time.Millisecond)
				}
				freed := time.Since(stopped)
				if since := time.Since(asked); since < bound {
					t.Fatalf("the slot came back %v after the request, before the bound %v: a client was cut that had not stalled that long", since, bound)
				}
				t.Logf("%s/%s: slot back %v after the client's last read", tr, proto, freed.Round(time.Millisecond))
				select {
				case <-gone:
				case <-time.After(5 * time.Second):
					t.Fatal("the upstream connection of the stalled stream is still open")
				}
				if v := scrape(t, p)[series]; v != 1 {
					t.Fatalf("%s = %v, want 1", series, v)
				}
				if out := p.out.String(); !strings.Contains(out, `"stalled":true`) {
					t.Fatalf("no access-log line says stalled:\n%s", grepLines(out, `"msg":"request"`))
				}
			})
		}
	}
}

// waitSettled waits until p's view of acme's limits holds no stream slot and no token hold,
// and, when spent, shows the tokens of an answer that ended.
func waitSettled(t *testing.T, p *proc, transport, when string, spent bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		tok, slots := acmeUsage(t, p, "acme_tokens"), acmeUsage(t, p, "acme_streams")
		if tok.Reserved == 0 && slots.Used == 0 && (tok.Used > 0 || !spent) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s: tokens %+v, slots %+v; want every hold settled and no slot held", transport, when, tok, slots)
		}
	}
}

// A stream that keeps flowing for more than twice its limits' reserve_ttl (2s) keeps its slot
// and its tokens hold: a second stream is refused with 429 the whole time, on every store and
// both upstream transports (the stream on one replica, the refusals from another sharing the
// store, in process from the same); once it ends the slot and the hold are back.
func TestLiveStreamKeepsItsSlotPastReserveTTL(t *testing.T) {
	t.Parallel()
	for _, st := range everyStore() {
		t.Run(st.name, func(t *testing.T) {
			t.Parallel()
			up, _ := stallUpstream(t)
			store := st.start(t)
			var ps []*proc
			for _, tr := range transports {
				ps = append(ps, startGateway(t, up, stallConfig(tr, "2s")+store))
			}
			for i, p := range ps {
				other := ps[(i+1)%len(ps)]
				if st.name == "memory" {
					other = p // one process: nothing shared between replicas
				}
				// The short stream that ended the previous round settles after its answer:
				// until its slot is back, a count of 1 below would be its slot, not the slow
				// stream's.
				waitSettled(t, other, transports[i], "before the slow stream", false)
				done := make(chan error, 1)
				go func() {
					code, err := ask(p, "slow")
					if err == nil && code != 200 {
						err = fmt.Errorf("status %d", code)
					}
					done <- err
				}()
				// The checks start once the slow stream holds its slot and end 4.5 s later (more
				// than twice reserve_ttl), 2 s before the stream does: on a loaded machine the
				// last check's answer can come a second after it was asked.
				for deadline := time.Now().Add(10 * time.Second); acmeUsage(t, other, "acme_streams").Used != 1; time.Sleep(20 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatalf("%s: the slow stream never took its slot", transports[i])
					}
				}
				for end := time.Now().Add(4500 * time.Millisecond); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
					if code := askStream(t, other, "short"); code != 429 {
						t.Fatalf("%s: a second stream while the first lives past reserve_ttl: %d, want 429", transports[i], code)
					}
				}
				if err := <-done; err != nil {
					t.Fatalf("%s: the slow stream: %v", transports[i], err)
				}
				waitSettled(t, other, transports[i], "after the stream ended", true)
				if code := askStream(t, other, "short"); code != 200 {
					t.Fatalf("%s: a stream after the first ended: %d", transports[i], code)
				}
			}
		})
	}
}
