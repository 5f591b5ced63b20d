package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/internal/redistest"
)

// The measure of expiry: two replicas on Redis, a key registered to expire in 30 seconds with
// a notice of 12. Its key.expiring event arrives once, across both replicas, as the notice
// starts; the key is refused (401 key_expired) on every replica within a second of its expiry.
func TestKeyExpiryAcrossReplicas(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	upURL, _ := recordingUpstream(t)
	recv := newHookReceiver(t, hookSecret)
	const notice = 12 * time.Second
	cfg := lcConfig(upURL, fmt.Sprintf("redis: {addrs: [%q], timeout: 2s}\n", srv.Addr), "",
		fmt.Sprintf("notifications:\n  webhooks:\n    - {name: keys, url: %q, secret: %q, events: [key.expiring], allow_private_addresses: true}\n",
			recv.url+"/hooks", hookSecret))
	cfg = strings.Replace(cfg, "auth: {mode: registry}", "auth: {mode: registry, expiry_notice: 12s}", 1)
	gws := []*proc{startGatewayRaw(t, cfg), startGatewayRaw(t, cfg)}

	const key = "svc_dsc_lifecycleExpiringKey0123456789a"
	expires := time.Now().Add(30 * time.Second).UTC().Truncate(time.Second)
	lcAdmin(t, gws[1], "POST", "/keys", `{"key":"`+key+`","kind":"assistant","org":"acme","domains":["acme-docs"],"expires":"`+expires.Format(time.RFC3339)+`"}`, 201)
	for i, p := range gws {
		if code := statusOf(t, p, key); code != 201 {
			t.Fatalf("replica %d before the expiry: %d", i, code)
		}
	}

	// The notice: once, as it starts (the replicas read the keys as a notice starts).
	starts := expires.Add(-notice)
	var arrived time.Time
	for arrived.IsZero() {
		if n, _ := recv.byType(); n[config.EventKeyExpiring] > 0 {
			arrived = time.Now()
			break
		}
		if time.Now().After(starts.Add(5 * time.Second)) {
			t.Fatalf("no key.expiring 5s after its notice started")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if arrived.Before(starts) {
		t.Fatalf("key.expiring arrived %v before its notice started", starts.Sub(arrived))
	}
	t.Logf("key.expiring arrived %v after its notice started", arrived.Sub(starts).Round(time.Millisecond))

	time.Sleep(time.Until(expires.Add(-500 * time.Millisecond)))
	refusedBy(t, gws, key, expires)
	res, body := lcSend(t, gws[0], key)
	if res.StatusCode != 401 || !strings.Contains(body, `"code":"key_expired"`) || !strings.Contains(res.Header.Get("WWW-Authenticate"), "invalid_token") {
		t.Fatalf("an expired key: %d %q %s", res.StatusCode, res.Header.Get("WWW-Authenticate"), body)
	}

	// A few more reads of the keys by both replicas: still one event, delivered once.
	time.Sleep(3 * time.Second)
	n, twice := recv.byType()
	if n[config.EventKeyExpiring] != 1 || twice {
		t.Fatalf("key.expiring events %v (an id delivered twice: %v); want exactly one", n, twice)
	}
	recv.mu.Lock()
	defer recv.mu.Unlock()
	for _, evs := range recv.events {
		d := evs[0].Data.(map[string]any)
		if d["key"] != auth.Digest(key) || d["ends_at"] != expires.Format(time.RFC3339) || d["reason"] != "expires" || d["org"] != "acme" {
			t.Fatalf("key.expiring says %v", d)
		}
	}
}

// Scopes and last use, on Redis: a key scoped to the v2 assistant route gets 403
// out_of_scope on v1; a key's last use shows in GET /keys at once on the replica that served
// it, and after a replica's stop in `gateway keys list`. Recording a use sends Redis nothing on
// the request's path: MONITOR sees one script call per request and no write of last uses.
func TestKeyScopesAndLastUse(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	upURL, _ := recordingUpstream(t)
	cfg := lcConfig(upURL, fmt.Sprintf("redis: {addrs: [%q], timeout: 2s}\n", srv.Addr), "", "")
	path := writeConfig(t, cfg)
	gw := startGatewayRaw(t, cfg)

	const scoped, used, idle = "svc_dsc_lifecycleScopedKey0123456789abc", "svc_dsc_lifecycleUsedKey0123456789abcdef", "svc_dsc_lifecycleIdleKey0123456789abcdef"
	lcAdmin(t, gw, "POST", "/keys", `{"key":"`+scoped+`","kind":"assistant","org":"acme","domains":["acme-docs"],"scopes":["assistant_message_v2"]}`, 201)
	for _, k := range []string{used, idle} {
		lcAdmin(t, gw, "POST", "/keys", `{"key":"`+k+`","kind":"assistant","org":"acme","domains":["acme-docs"]}`, 201)
	}
	if res, body := lcSend(t, gw, scoped); res.StatusCode != 403 || !strings.Contains(body, `"code":"out_of_scope"`) {
		t.Fatalf("a key scoped to the v2 route, on v1: %d %s", res.StatusCode, body)
	}
	if a := adminCall(t, http.DefaultClient, "http://"+gw.admin, "POST", "/keys", map[string]string{"Authorization": "Bearer " + lcToken, "Content-Type": "application/json"},
		`{"digest":"`+auth.Digest("svc_x")+`","kind":"assistant","org":"acme","domains":["d"],"scopes":["agent_job"]}`); a.status != 400 || !strings.Contains(a.body, "scopes") {
		t.Fatalf("a scope naming a route of the other kind: %d %s", a.status, a.body)
	}

	statusOf(t, gw, used) // the key is in the replica's cache, its script loaded
	mon := monitor(t, srv.Addr)
	const n = 50
	for range n {
		if code := statusOf(t, gw, used); code != 201 {
			t.Fatalf("a request of the used key: %d", code)
		}
	}
	cmds := mon.stop()
	evals, lastUse := 0, 0
	for _, c := range cmds {
		switch {
		case strings.Contains(c, "last_used"):
			lastUse++
		case strings.Contains(strings.ToLower(c), `"evalsha"`):
			evals++
		}
	}
	// A replica writes the uses it recorded once a minute: that write may fall within the
	// requests, once.
	if evals != n || lastUse > 1 {
		t.Fatalf("MONITOR during %d requests: %d script calls, %d writes of last uses; want %d and at most the minute's one:\n%s",
			n, evals, lastUse, n, strings.Join(cmds, "\n"))
	}

	keys := listKeys(t, gw, lcToken)
	now := time.Now().UTC().Truncate(time.Minute)
	if u := keys[auth.Digest(used)].LastUsed; u == nil || u.Before(now.Add(-time.Minute)) || u.After(now) {
		t.Fatalf("GET /keys: the used key's last use %v; want this minute", u)
	}
	if u := keys[auth.Digest(idle)].LastUsed; u != nil {
		t.Fatalf("GET /keys: a key never used shows a last use %v", u)
	}
	// A replica that stops writes what it recorded: the CLI reads it from Redis.
	if err := gw.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	gw.wait(t, 30*time.Second)
	list := (&keyCLI{t: t, config: path}).listJSON()
	if u := list[auth.Digest(used)].LastUsed; u == nil || u.Before(now.Add(-time.Minute)) {
		t.Fatalf("keys list after the replica stopped: the used key's last use %v", u)
	}
	if list[auth.Digest(idle)].LastUsed != nil {
		t.Fatal("keys list: a key never used shows a last use")
	}
	out := (&keyCLI{t: t, config: path}).must("", "list", "-config", path)
	if !strings.Contains(out, "LAST USED") || !strings.Contains(out, "assistant_message_v2") {
		t.Fatalf("keys list's table:\n%s", out)
	}
}

// redisMonitor reads a MONITOR connection's lines until stopped.
type redisMonitor struct {
	conn  net.Conn
	lines chan []string
}

func monitor(t *testing.T, addr string) *redisMonitor {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	r := bufio.NewReader(conn)
	if _, err := conn.Write([]byte("MONITOR\r\n")); err != nil {
		t.Fatal(err)
	}
	if line, err := r.ReadString('\n'); err != nil || line != "+OK\r\n" {
		t.Fatalf("MONITOR: %q %v", line, err)
	}
	m := &redisMonitor{conn: conn, lines: make(chan []string, 1)}
	go func() {
		var lines []string
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				m.lines <- lines
				return
			}
			lines = append(lines, strings.TrimSpace(line))
		}
	}()
	return m
}

// stop ends the monitor and returns the commands it saw.
func (m *redisMonitor) stop() []string {
	time.Sleep(200 * time.Millisecond) // the last commands' lines
	_ = m.conn.SetReadDeadline(time.Now())
	return <-m.lines
}

// lcSend sends one assistant request of key to p and returns the answer and its body.
func lcSend(t *testing.T, p *proc, key string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://"+p.public+lcPath, strings.NewReader(lcBody))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, string(data)
}
