package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Refusals keep the client's connection when the request body is small and arrives at once:
// 401, 403 and 429 with small bodies are all answered on one connection. A large body closes
// it (a slow one too: TestRefusalsWithUnreadBody).
func TestKeepAliveOnRefusals(t *testing.T) {
	up := newBodyUpstream(t)
	p := startGateway(t, up.URL, "limits:\n  agent_job_per_project: {limit: 1, window: hour}\n")
	var dials atomic.Int32
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			dials.Add(1)
			return (&net.Dialer{}).DialContext(ctx, network, addr)
		},
		MaxIdleConnsPerHost: 1,
	}}
	do := func(path, key, body string) int {
		t.Helper()
		req, _ := http.NewRequest("POST", "http://"+p.public+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return res.StatusCode
	}
	small := `{"prompt":"` + strings.Repeat("x", 2000) + `"}`
	for _, c := range []struct {
		name, path, key string
		want            int
	}{
		{"401 no key", "/v2/agent/ka/job", "", 401},
		{"401 unknown family", "/v2/agent/ka/job", "nope_123", 401},
		{"403 wrong key type", "/v2/agent/ka/job", "svc_dsc_browserkey", 403},
		{"201", "/v2/agent/ka/job", "svc_keepalive", 201},
		{"429", "/v2/agent/ka/job", "svc_keepalive", 429},
		{"404", "/v2/nowhere", "svc_keepalive", 404},
		{"401 again", "/v2/agent/ka/job", "", 401},
	} {
		if got := do(c.path, c.key, small); got != c.want {
			t.Fatalf("%s: %d", c.name, got)
		}
	}
	if n := dials.Load(); n != 1 {
		t.Fatalf("%d connections for 7 requests with small bodies, want 1 (kept alive after refusals)", n)
	}
	// A body over 64 KiB on a refusal closes the connection: the next request dials again.
	// (The client may see the 401, or, still writing its body when the connection closes, a
	// reset: the gateway does not read 100 KiB to refuse a request.)
	large := `{"prompt":"` + strings.Repeat("y", 100<<10) + `"}`
	req, _ := http.NewRequest("POST", "http://"+p.public+"/v2/agent/ka/job", strings.NewReader(large))
	req.Header.Set("Content-Type", "application/json")
	if res, err := client.Do(req); err == nil {
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != 401 {
			t.Fatalf("large body: %d", res.StatusCode)
		}
	}
	if got := do("/v2/agent/ka/job", "", small); got != 401 {
		t.Fatalf("after the large body: %d", got)
	}
	if n := dials.Load(); n != 2 {
		t.Fatalf("%d connections after a large refused body, want 2 (it closes its connection)", n)
	}
}

// rawClient is one keep-alive HTTP/1.1 client connection spoken by hand, so the test sees
// exactly which answers share the connection and when the gateway closes it.
type rawClient struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dialRaw(t *testing.T, addr string) *rawClient {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawClient{t: t, c: c, br: bufio.NewReader(c)}
}

// rawHead is the head of a POST with a body of n bytes, without Connection: close.
func rawHead(path, xff, key string, n int, extra ...string) string {
	h := "POST " + path + " HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n" +
		"X-Forwarded-For: " + xff + "\r\nContent-Length: " + strconv.Itoa(n) + "\r\n"
	if key != "" {
		h += "Authorization: Bearer " + key + "\r\n"
	}
	for _, e := range extra {
		h += e + "\r\n"
	}
	return h + "\r\n"
}

// jsonOf is a JSON body of exactly n bytes (n >= 14).
func jsonOf(n int) string {
	return `{"prompt":"` + strings.Repeat("x", n-13) + `"}`
}

// read reads one answer (skipping nothing: a 1xx comes back as it is) with its body.
func (rc *rawClient) read() (*http.Response, string) {
	rc.t.Helper()
	_ = rc.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	res, err := http.ReadResponse(rc.br, nil)
	if err != nil {
		rc.t.Fatalf("reading an answer: %v", err)
	}
	body, err := io.ReadAll(res.Body)
	if err != nil {
		rc.t.Fatalf("reading an answer's body: %v", err)
	}
	return res, string(body)
}

func (rc *rawClient) write(s string) {
	rc.t.Helper()
	if _, err := io.WriteString(rc.c, s); err != nil {
		rc.t.Fatalf("writing: %v", err)
	}
}

// ended reports whether the server closed the connection (EOF or reset) within wait, and
// fails if anything but the end arrives.
func (rc *rawClient) ended(wait time.Duration) bool {
	rc.t.Helper()
	_ = rc.c.SetReadDeadline(time.Now().Add(wait))
	var buf [512]byte
	n, err := rc.br.Read(buf[:])
	if n > 0 {
		rc.t.Fatalf("more bytes after the answer: %q", buf[:n])
	}
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

const keepAliveKey = "svc_keepaliveSECRET"

// keepAliveGateway runs the binary in registry mode (a keys file with one admin key for
// project ka), behind a trusted proxy so each test client can have its own address, with
// auth.failure_limit 3 and a limit of one job an hour.
func keepAliveGateway(t *testing.T) (*proc, *bodyUpstream) {
	t.Helper()
	up := newBodyUpstream(t)
	keys := filepath.Join(t.TempDir(), "keys.yaml")
	entry := fmt.Sprintf("keys:\n  - {digest: %s, kind: admin, org: acme, projects: [ka], created: 2025-01-02}\n", sha256hex(keepAliveKey))
	if err := os.WriteFile(keys, []byte(entry), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startGateway(t, up.URL, fmt.Sprintf(`auth: {mode: registry, keys_file: %q, failure_limit: 3}
client_ip: {trusted_proxies: ["127.0.0.1/32"]}
server: {read_body_timeout: 10s}
limits:
  agent_job_per_project: {limit: 1, window: hour}
`, keys))
	return p, up
}

// Over raw TCP, one keep-alive connection: 401 (no key, invented keys), 403 (a key of the
// other family), 429 rate_limited (after the body was read) and 429 too_many_auth_failures
// (before) with small bodies, whole or arriving in pieces within the drain deadline, and a
// small body sent only after 100 Continue, are all answered on the same connection, none with
// Connection: close.
func TestKeepAliveRawTCP(t *testing.T) {
	p, up := keepAliveGateway(t)
	rc := dialRaw(t, p.public)
	const xff = "198.51.100.10"
	body := jsonOf(2000)
	for i, c := range []struct {
		key  string
		want int
		code string
	}{
		{"", 401, "missing_credentials"},
		{"svc_dsc_otherfamilySECRET", 403, "wrong_key_type"},
		{keepAliveKey, 201, ""},
		{keepAliveKey, 429, "rate_limited"},
		{"svc_invented1SECRET", 401, "invalid_credentials"},
		{"svc_invented2SECRET", 401, "invalid_credentials"}, // the third failure: budget spent
		{"svc_invented3SECRET", 429, "too_many_auth_failures"},
		{keepAliveKey, 429, "too_many_auth_failures"},
	} {
		rc.write(rawHead("/v2/agent/ka/job", xff, c.key, len(body)) + body)
		res, data := rc.read()
		if res.StatusCode != c.want || !strings.Contains(data, `"code":"`+c.code+`"`) && c.code != "" {
			t.Fatalf("request %d on the connection: %d %s, want %d %s", i, res.StatusCode, data, c.want, c.code)
		}
		if res.Close {
			t.Fatalf("request %d (%d %s): the gateway closes the connection", i, res.StatusCode, c.code)
		}
		if c.code == "too_many_auth_failures" && res.Header.Get("Retry-After") == "" {
			t.Fatalf("429 too_many_auth_failures without Retry-After")
		}
	}

	// A small body that arrives in three pieces, 100 ms apart, still within the deadline.
	rc.write(rawHead("/v2/agent/ka/job", xff, "", len(body)))
	for i := range 3 {
		time.Sleep(100 * time.Millisecond)
		rc.write(body[i*len(body)/3 : (i+1)*len(body)/3])
	}
	if res, data := rc.read(); res.StatusCode != 429 || res.Close {
		t.Fatalf("body in pieces: %d %s, close %t", res.StatusCode, data, res.Close)
	}

	// Expect: 100-continue: the gateway asks for the small body, reads it, answers and keeps
	// the connection.
	rc.write(rawHead("/v2/agent/ka/job", xff, "svc_invented4SECRET", len(body), "Expect: 100-continue"))
	if res, _ := rc.read(); res.StatusCode != 100 {
		t.Fatalf("Expect: 100-continue answered %d first, want 100", res.StatusCode)
	}
	rc.write(body)
	if res, data := rc.read(); res.StatusCode != 429 || res.Close {
		t.Fatalf("after 100 Continue: %d %s, close %t", res.StatusCode, data, res.Close)
	}

	// Still the same connection, still open.
	rc.write(rawHead("/v2/agent/ka/job", xff, "", 0))
	if res, _ := rc.read(); res.StatusCode != 429 || res.Close {
		t.Fatalf("last request: %d, close %t", res.StatusCode, res.Close)
	}
	if n := len(up.requests()); n != 1 {
		t.Fatalf("the upstream saw %d requests, want the one admitted", n)
	}
}

// Large, slow or unsent bodies still close the connection after a refusal, 429s included: the
// gateway does not read 100 KiB to refuse a request, nor wait on a body past the drain
// deadline.
func TestRefusalsCloseOnLargeOrSlowBodies(t *testing.T) {
	p, _ := keepAliveGateway(t)
	const spent = "198.51.100.20"
	for i := range 3 { // spend this address's failure budget
		rc := dialRaw(t, p.public)
		rc.write(rawHead("/v2/agent/ka/job", spent, fmt.Sprintf("svc_spend%dSECRET", i), 0))
		if res, _ := rc.read(); res.StatusCode != 401 {
			t.Fatalf("spending the budget: %d", res.StatusCode)
		}
	}
	large := jsonOf(100 << 10)
	small := jsonOf(2000)
	for _, c := range []struct {
		name, xff, key string
		n              int    // declared length
		sent           string // what of the body is sent
		want           int
	}{
		{"401, body over 64 KiB", "198.51.100.21", "", len(large), large, 401},
		{"429, body over 64 KiB", spent, keepAliveKey, len(large), large, 429},
		{"401, small body that stops", "198.51.100.22", "", len(small), small[:100], 401},
		{"403, small body that stops", "198.51.100.23", "svc_dsc_otherfamilySECRET", len(small), small[:100], 403},
		{"429, small body that stops", spent, keepAliveKey, len(small), small[:100], 429},
		{"401, small body never sent", "198.51.100.24", "", len(small), "", 401},
	} {
		t.Run(c.name, func(t *testing.T) {
			rc := dialRaw(t, p.public)
			start := time.Now()
			// The gateway may close while a large body is still being written: write aside.
			go func() { _, _ = io.WriteString(rc.c, rawHead("/v2/agent/ka/job", c.xff, c.key, c.n)+c.sent) }()
			_ = rc.c.SetReadDeadline(time.Now().Add(5 * time.Second))
			res, err := http.ReadResponse(rc.br, nil)
			if err != nil {
				// A large body: the close may reach the client as a reset before the answer.
				if c.n > 64<<10 && !isTimeout(err) {
					t.Logf("no answer, the connection ended: %v", err)
					return
				}
				t.Fatalf("no answer: %v", err)
			}
			_, _ = io.Copy(io.Discard, res.Body)
			if res.StatusCode != c.want || !res.Close {
				t.Fatalf("%d, Connection: close %t; want %d and close", res.StatusCode, res.Close, c.want)
			}
			if !rc.ended(3 * time.Second) {
				t.Fatal("the connection stayed open")
			}
			// The drain deadline (500 ms), not read_body_timeout (10s), ended the wait.
			if took := time.Since(start); took > 3*time.Second {
				t.Fatalf("closed after %v", took)
			}
		})
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
