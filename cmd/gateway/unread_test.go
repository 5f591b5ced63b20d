package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Issue 20, finding 1: every answer the gateway gives before it has read the request's body
// (the CORS preflight, 400, 401, 403, 404, 405, 413, 415, 429) is sent at once when the client
// never sends the body it declared, and the connection closes: nothing waits on a client
// without a bound. The server settings are the defaults (read_body_timeout 30 s,
// idle_timeout 120 s): the answers come from the drain deadline (500 ms).

const earlyKey = "svc_earlySECRET"

// earlyGateway runs the binary in registry mode (one admin key for project ea, so a spent
// auth.failure_limit can be reached), behind a trusted proxy so each case has its own
// client address, on the given upstream transport.
func earlyGateway(t *testing.T, transport string, upURL string) *proc {
	t.Helper()
	keys := filepath.Join(t.TempDir(), "keys.yaml")
	entry := fmt.Sprintf("keys:\n  - {digest: %s, kind: admin, org: acme, projects: [ea], created: 2025-01-02}\n", sha256hex(earlyKey))
	if err := os.WriteFile(keys, []byte(entry), 0o600); err != nil {
		t.Fatal(err)
	}
	return startGateway(t, upURL, fmt.Sprintf(`  transport: %s
auth: {mode: registry, keys_file: %q}
client_ip: {trusted_proxies: ["127.0.0.1/32"]}
`, transport, keys))
}

func TestEarlyAnswersWithUnsentBody(t *testing.T) {
	t.Parallel()
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			up := newRawUpstream(t, nil)
			p := earlyGateway(t, tr, up.URL)
			const spent = "198.51.100.99"
			for i := range 30 { // spend this address's auth.failure_limit (30)
				r := rawExchange(t, p.public, 3*time.Second, 0, []byte(rawHead("/v2/agent/ea/job", spent,
					fmt.Sprintf("svc_invented%dSECRET", i), 0, "Connection: close")))
				if r.status() != 401 {
					t.Fatalf("spending the budget: %d", r.status())
				}
			}
			const agent = "/v2/agent/ea/job"
			post := func(path, xff, key string, extra ...string) string {
				h := "POST " + path + " HTTP/1.1\r\nHost: gw\r\nX-Forwarded-For: " + xff + "\r\n"
				if key != "" {
					h += "Authorization: Bearer " + key + "\r\n"
				}
				for _, e := range extra {
					h += e + "\r\n"
				}
				return h
			}
			json := "Content-Type: application/json"
			for _, c := range []struct {
				name, head string // the head without framing and the blank line
				want       int
				code       string
				chunked    bool // also sent chunked: answered before any byte of the body is needed
				length     int  // declared length
			}{
				{"preflight", "OPTIONS /discovery/v1/assistant/acme/message HTTP/1.1\r\nHost: gw\r\nOrigin: https://docs.example.com\r\n" +
					"Access-Control-Request-Method: POST\r\n", 204, "", true, 1000},
				{"400 upgrade", post(agent, "198.51.100.1", earlyKey, json, "Connection: Upgrade", "Upgrade: websocket"), 400, "upgrade_not_supported", true, 1000},
				{"401", post(agent, "198.51.100.2", "", json), 401, "missing_credentials", true, 1000},
				{"403", post(agent, "198.51.100.3", "svc_dsc_otherSECRET", json), 403, "wrong_key_type", true, 1000},
				{"404", post("/nowhere", "198.51.100.4", earlyKey, json), 404, "not_found", true, 1000},
				{"405", strings.Replace(post(agent, "198.51.100.5", earlyKey, json), "POST", "PUT", 1), 405, "method_not_allowed", true, 1000},
				{"413", post(agent, "198.51.100.6", earlyKey, json), 413, "payload_too_large", false, 2 << 20},
				{"415", post(agent, "198.51.100.7", earlyKey, "Content-Type: text/plain"), 415, "unsupported_media_type", true, 1000},
				{"429", post(agent, spent, earlyKey, json), 429, "too_many_auth_failures", true, 1000},
			} {
				framings := []struct{ name, framing, sent string }{
					{"nothing sent", "Content-Length: " + strconv.Itoa(c.length) + "\r\n\r\n", ""},
					{"one byte sent", "Content-Length: " + strconv.Itoa(c.length) + "\r\n\r\n", "{"},
				}
				if c.chunked {
					framings = append(framings, struct{ name, framing, sent string }{"chunked, unfinished", "Transfer-Encoding: chunked\r\n\r\n", "10\r\n{\"prompt\":"})
				}
				for _, f := range framings {
					t.Run(c.name+"/"+f.name, func(t *testing.T) {
						r := rawExchange(t, p.public, 10*time.Second, 0, []byte(c.head+f.framing+f.sent))
						if r.status() != c.want || !strings.Contains(r.data, c.code) {
							t.Fatalf("status %d, want %d %s: %.300q", r.status(), c.want, c.code, r.data)
						}
						if !r.closed || r.after > 3*time.Second {
							t.Fatalf("closed %t after %v: the answer must come, and the connection close, at once", r.closed, r.after)
						}
					})
				}
			}
			if n, _ := up.received(); n != 0 {
				t.Fatalf("%d bytes reached the upstream", n)
			}
		})
	}
}

// Preflights that declare a body and never send it, held open by their clients: the gateway
// answers and closes every one at once, its goroutines go back to where they were while the
// clients still hold their sockets, and other clients are answered meanwhile: 200 of them,
// and 300 with the gateway limited to 256 open files (the issue's report: accept4 "too many
// open files" and legitimate requests timing out).
func TestHeldPreflightsAreReleased(t *testing.T) {
	t.Run("200", func(t *testing.T) { heldPreflights(t, 200, 0) })
	t.Run("300 within 256 files", func(t *testing.T) { heldPreflights(t, 300, 256) })
}

func heldPreflights(t *testing.T, n, files int) {
	up := newRawUpstream(t, nil)
	p := startGateway(t, up.URL, "")
	if files > 0 {
		prlimit, err := exec.LookPath("prlimit")
		if err != nil {
			t.Skip("no prlimit (util-linux) to limit the gateway's open files")
		}
		lim := fmt.Sprintf("--nofile=%d:%d", files, files)
		if out, err := exec.Command(prlimit, "--pid", strconv.Itoa(p.cmd.Process.Pid), lim).CombinedOutput(); err != nil {
			t.Fatalf("prlimit: %v %s", err, out)
		}
	}
	base := goroutines(t, p)
	conns := make([]net.Conn, n)
	for i := range conns {
		c, err := net.Dial("tcp", p.public)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		conns[i] = c
		if _, err := io.WriteString(c, "OPTIONS /discovery/v1/assistant/acme/message HTTP/1.1\r\nHost: gw\r\n"+
			"Origin: https://docs.example.com\r\nAccess-Control-Request-Method: POST\r\nContent-Length: 1000\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
	}
	// Another client meanwhile.
	req, _ := http.NewRequest("POST", "http://"+p.public+"/v2/agent/other/job", strings.NewReader(`{"prompt":"x"}`))
	req.Header.Set("Authorization", "Bearer svc_otherSECRET")
	req.Header.Set("Content-Type", "application/json")
	res, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil || res.StatusCode != 201 {
		t.Fatalf("another client during the preflights: %v %v", err, res)
	}
	res.Body.Close()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for _, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
			br := bufio.NewReader(c)
			res, err := http.ReadResponse(br, nil)
			if err != nil {
				errs <- fmt.Errorf("no answer: %w", err)
				return
			}
			res.Body.Close()
			if res.StatusCode != 204 {
				errs <- fmt.Errorf("preflight answered %d", res.StatusCode)
				return
			}
			if _, err := br.ReadByte(); err == nil || isTimeout(err) {
				errs <- fmt.Errorf("the gateway kept the connection: %v", err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// The clients still hold their sockets open; the gateway has let go of them.
	deadline := time.Now().Add(5 * time.Second)
	for {
		g := goroutines(t, p)
		if g <= base+20 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines in the gateway with the %d answered preflights still open on the client side, %d before", g, n, base)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// goroutines reads the gateway's goroutine count from its pprof endpoint.
func goroutines(t *testing.T, p *proc) int {
	t.Helper()
	res, err := http.Get("http://" + p.admin + "/debug/pprof/goroutine?debug=1")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	line, _ := bufio.NewReader(res.Body).ReadString('\n')
	var total int
	if _, err := fmt.Sscanf(line, "goroutine profile: total %d", &total); err != nil {
		t.Fatalf("goroutine profile: %q: %v", line, err)
	}
	return total
}
