package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/docsgate/gateway/internal/redistest"
)

// keysCLI runs `gateway keys ...` with the key, if any, on standard input.
func keysCLI(t *testing.T, stdin string, args ...string) string {
	t.Helper()
	cmd := exec.Command(gatewayBin, append([]string{"keys"}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("gateway keys %v: %v\n%s", args, err, errb.String())
	}
	return strings.TrimSpace(out.String())
}

// Keys registered through the CLI work on every replica; revoked ones stop working on another
// replica within a second; invented keys never reach the upstream or consume any quota.
func TestRegistryAcrossReplicas(t *testing.T) {
	srv := redistest.Start(t)
	upURL, upCount := recordingUpstream(t)
	cfg := fmt.Sprintf("redis:\n  addrs: [%q]\nauth:\n  mode: registry\n", srv.Addr)
	a := startGateway(t, upURL, cfg)
	b := startGateway(t, upURL, cfg)
	cfgFile := writeConfig(t, fmt.Sprintf("upstream: {url: %q}\n%s", upURL, cfg))

	const key = "svc_dsc_registered0123456789registered"
	digest := keysCLI(t, key+"\n", "add", "-config", cfgFile, "--kind", "assistant", "--org", "acme", "--domain", "acme-docs")
	if len(digest) != 64 {
		t.Fatalf("keys add printed %q, want a digest", digest)
	}
	asst := `{"fp":"a","messages":[]}`
	for _, p := range []*proc{a, b} {
		if res := send(t, p, "POST", "/discovery/v1/assistant/acme-docs/message", key, asst); res.StatusCode != 201 {
			t.Fatalf("registered key on %s: %d", p.public, res.StatusCode)
		}
		if res := send(t, p, "POST", "/discovery/v1/assistant/other-docs/message", key, asst); res.StatusCode != 403 {
			t.Fatalf("registered key outside its grant: %d", res.StatusCode)
		}
		if res := send(t, p, "POST", "/discovery/v1/assistant/acme-docs/message", "svc_dsc_invented42", asst); res.StatusCode != 401 {
			t.Fatalf("invented key: %d", res.StatusCode)
		}
	}
	if got := upCount(); got != 2 {
		t.Fatalf("upstream saw %d requests, want the 2 registered ones", got)
	}

	// Revoke through replica a's CLI view of Redis; replica b must refuse within a second.
	keysCLI(t, "", "revoke", "-config", cfgFile, digest)
	start := time.Now()
	for {
		if res := send(t, b, "POST", "/discovery/v1/assistant/acme-docs/message", key, asst); res.StatusCode == 401 {
			break
		}
		if time.Since(start) > time.Second {
			t.Fatalf("revoked key still accepted on another replica after %v", time.Since(start))
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("revocation took effect on another replica after %v", time.Since(start))
	if list := keysCLI(t, "", "list", "-config", cfgFile); !strings.Contains(list, digest) || strings.Contains(list, key) {
		t.Fatalf("keys list: %q", list)
	}

	// Invented keys consumed nothing: the only counters are those of the registered key.
	keys, err := srv.Client(t).Keys(t.Context(), "gw:assistant_per_*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if strings.Contains(k, "invented") {
			t.Fatalf("an invented key has a counter: %s", k)
		}
	}
}

// SIGHUP with a good and then a bad file under load: no request is dropped, the good file's
// limits apply, the bad file is refused and logged, and the running config stays.
func TestReloadUnderLoad(t *testing.T) {
	upURL, _ := recordingUpstream(t)
	const token = "reload-admin-token-0123456789"
	p := startGateway(t, upURL, "admin_token: "+token+"\nlimits:\n  agent_job_per_project: {limit: 1000000}\n")
	cfgPath := p.cmd.Args[2]

	var stop atomic.Bool
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	client := &http.Client{Timeout: 10 * time.Second}
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 2000 && !stop.Load(); i++ {
				req, _ := http.NewRequest("POST", "http://"+p.public+fmt.Sprintf("/v2/agent/load%d/job", w), strings.NewReader(`{"prompt":"x"}`))
				req.Header.Set("Authorization", "Bearer svc_reload")
				req.Header.Set("Content-Type", "application/json")
				code := 0
				if res, err := client.Do(req); err == nil {
					res.Body.Close()
					code = res.StatusCode
				}
				mu.Lock()
				codes[code]++
				mu.Unlock()
			}
		}()
	}
	time.Sleep(200 * time.Millisecond)
	cfg, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	good := strings.Replace(string(cfg), "limit: 1000000", "limit: 1000001", 1) + "log:\n  level: warn\n"
	if err := os.WriteFile(cfgPath, []byte(good), 0o600); err != nil {
		t.Fatal(err)
	}
	_ = p.cmd.Process.Signal(syscall.SIGHUP)
	time.Sleep(300 * time.Millisecond)
	if err := os.WriteFile(cfgPath, []byte(good+"bogus_key: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_ = p.cmd.Process.Signal(syscall.SIGHUP)
	time.Sleep(300 * time.Millisecond)
	stop.Store(true)
	wg.Wait()

	if codes[0] != 0 || len(codes) != 1 || codes[201] == 0 {
		t.Fatalf("answers under reload: %v (0 = no answer)", codes)
	}
	out := p.out.String()
	if !strings.Contains(out, "config reloaded") || !strings.Contains(out, "reload rejected") || !strings.Contains(out, "bogus_key") {
		t.Fatalf("reload outcomes not logged:\n%s", out)
	}
	// The good file's limit applies; the log level changed to warn (no more access lines).
	res := send(t, p, "POST", "/v2/agent/after/job", "svc_reload", `{"prompt":"x"}`)
	if res.Header.Get("RateLimit-Limit") != "1000001" {
		t.Fatalf("RateLimit-Limit %q after reload", res.Header.Get("RateLimit-Limit"))
	}

	// POST /reload answers the outcome: the bad file is still in place.
	if code := postReload(t, p, token); code != 422 {
		t.Fatalf("POST /reload with a bad file: %d", code)
	}
	if err := os.WriteFile(cfgPath, []byte(good), 0o600); err != nil {
		t.Fatal(err)
	}
	if code := postReload(t, p, token); code != 200 {
		t.Fatalf("POST /reload with a good file: %d", code)
	}
}

func mustRequest(t *testing.T, method, url string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// Without Redis, keys added through the admin API are written to auth.keys_file, so they
// work at once and survive a reload; a revoked one stops working.
func TestAdminKeysWithKeysFile(t *testing.T) {
	t.Parallel()
	upURL, _ := recordingUpstream(t)
	keysFile := t.TempDir() + "/keys.yaml"
	const token = "keys-admin-token-0123456789"
	p := startGateway(t, upURL, fmt.Sprintf("admin_token: %s\nauth:\n  mode: registry\n  keys_file: %q\n", token, keysFile))
	const key = "svc_viaadmin0123456789viaadmin0123"
	add, _ := http.NewRequest("POST", "http://"+p.admin+"/keys",
		strings.NewReader(`{"key":"`+key+`","kind":"admin","org":"acme","projects":["p1"]}`))
	add.Header.Set("Authorization", "Bearer "+token)
	add.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(add)
	if err != nil || res.StatusCode != 201 {
		t.Fatalf("POST /keys: %v %v", err, res)
	}
	res.Body.Close()
	if r := send(t, p, "POST", "/v2/agent/p1/job", key, `{"prompt":"x"}`); r.StatusCode != 201 {
		t.Fatalf("key added through the admin API: %d", r.StatusCode)
	}
	if data, err := os.ReadFile(keysFile); err != nil || strings.Contains(string(data), key) || !strings.Contains(string(data), "acme") {
		t.Fatalf("keys file: %v %q", err, data)
	}
	_ = p.cmd.Process.Signal(syscall.SIGHUP)
	time.Sleep(300 * time.Millisecond)
	if r := send(t, p, "POST", "/v2/agent/p1/job", key, `{"prompt":"x"}`); r.StatusCode != 201 {
		t.Fatalf("after a reload: %d (the added key was lost)", r.StatusCode)
	}
	del, _ := http.NewRequest("DELETE", "http://"+p.admin+"/keys/"+sha256hex(key), nil)
	del.Header.Set("Authorization", "Bearer "+token)
	if res, err := http.DefaultClient.Do(del); err != nil || res.StatusCode != 200 {
		t.Fatalf("DELETE /keys: %v %v", err, res)
	}
	if r := send(t, p, "POST", "/v2/agent/p1/job", key, `{"prompt":"x"}`); r.StatusCode != 401 {
		t.Fatalf("revoked key: %d", r.StatusCode)
	}
}

func sha256hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// log.buffer batches lines; what is buffered still reaches the log at shutdown.
func TestBufferedLogFlushedAtShutdown(t *testing.T) {
	t.Parallel()
	upURL, _ := recordingUpstream(t)
	p := startGateway(t, upURL, "log:\n  buffer: 65536\n")
	if r := send(t, p, "POST", "/v2/agent/p/job", "svc_buffered", `{"prompt":"x"}`); r.StatusCode != 201 {
		t.Fatal(r.StatusCode)
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.wait(t, 10*time.Second); code != 0 {
		t.Fatalf("exit %d", code)
	}
	if !strings.Contains(p.out.String(), `"path":"/v2/agent/p/job"`) {
		t.Fatalf("the buffered access line was lost:\n%s", p.out.String())
	}
}
