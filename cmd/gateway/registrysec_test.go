package main

import (
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/internal/redistest"
)

// The key registry must never lose a revocation, nor read one key family's grants as the
// other's: each case of issue 19 against the built binary.

// plainGateway is the gateway built without the race detector, for tests that start a
// hundred CLI processes at once: a race-detector binary costs ten times the CPU of a plain one
// to start and to parse YAML, and a hundred of them on two cores starve every other process
// for seconds (the gateway under test included). A short-lived CLI process has no concurrency
// for the detector to watch; the gateway those tests talk to stays the race build.
var plainGateway = sync.OnceValues(func() (string, error) {
	bin := filepath.Join(filepath.Dir(gatewayBin), "gateway-plain") // removed with it by TestMain
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bin, nil
})

// 100 concurrent `gateway keys revoke` processes against concurrent POST /keys of the running
// gateway, all writing the same keys file: every CLI that says "revoked" has revoked (the key
// is refused afterwards), and every key the API added is there.
func TestKeysFileConcurrentWriters(t *testing.T) {
	t.Parallel()
	cli, err := plainGateway()
	if err != nil {
		t.Fatal(err)
	}
	upURL, _ := recordingUpstream(t)
	dir := t.TempDir()
	keysFile := filepath.Join(dir, "keys.yaml")
	// 100 revokes by the CLI; 30 adds by the API, each a race-detector gateway's read, change
	// and rewrite of the whole file under the lock (about 0.1 s each on this machine).
	const n, adds = 100, 30
	keyOf := func(kind string, i int) string { return fmt.Sprintf("svc_%s%03d0123456789abcdefghijklmn", kind, i) }
	var seed []auth.Entry
	for i := range n {
		seed = append(seed, auth.Entry{Digest: auth.Digest(keyOf("old", i)), Kind: "admin", Org: "acme", Projects: []string{"p"}, Created: time.Now().UTC()})
	}
	if err := auth.SaveKeysFile(keysFile, seed); err != nil {
		t.Fatal(err)
	}
	const token = "writers-admin-token-0123456789"
	// failure_limit 0: the test sends 100 revoked keys from one address at the end, and wants
	// each one's own 401, not the budget's 429.
	p := startGateway(t, upURL, fmt.Sprintf("admin_token: %q\nauth: {mode: registry, keys_file: %q, failure_limit: 0}\n", token, keysFile))
	cfg := p.cmd.Args[2]
	for i := range n {
		if r := send(t, p, "POST", "/v2/agent/p/job", keyOf("old", i), `{"prompt":"x"}`); r.StatusCode != 201 {
			t.Fatalf("seeded key %d: %d", i, r.StatusCode)
		}
	}

	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	start := make(chan struct{})
	client := &http.Client{Timeout: 60 * time.Second}
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			out, err := exec.Command(cli, "keys", "revoke", "-config", cfg, auth.Digest(keyOf("old", i))).CombinedOutput()
			if err != nil || !strings.Contains(string(out), "revoked "+auth.Digest(keyOf("old", i))) {
				mu.Lock()
				failures = append(failures, fmt.Sprintf("revoke %d: %v %s", i, err, out))
				mu.Unlock()
			}
		}()
	}
	for i := range adds {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			req, _ := http.NewRequest("POST", "http://"+p.admin+"/keys", strings.NewReader(
				`{"digest":"`+auth.Digest(keyOf("new", i))+`","kind":"admin","org":"acme","projects":["p"]}`))
			req.Header.Set("Authorization", "Bearer "+token)
			req.Header.Set("Content-Type", "application/json")
			res, err := client.Do(req)
			if err != nil || res.StatusCode != 201 {
				mu.Lock()
				failures = append(failures, fmt.Sprintf("add %d: %v %v", i, err, res))
				mu.Unlock()
			}
			if res != nil {
				res.Body.Close()
			}
		}()
	}
	close(start)
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d writers failed: %v", len(failures), failures)
	}

	entries, err := auth.LoadKeysFile(keysFile)
	if err != nil {
		t.Fatal(err)
	}
	byDigest := map[string]auth.Entry{}
	for _, e := range entries {
		byDigest[e.Digest] = e
	}
	lost := 0
	for i := range n {
		if e, ok := byDigest[auth.Digest(keyOf("old", i))]; !ok || e.Active() {
			lost++
		}
	}
	for i := range adds {
		if e, ok := byDigest[auth.Digest(keyOf("new", i))]; !ok || !e.Active() {
			t.Errorf("key %d added through the API is missing from the file", i)
		}
	}
	if lost > 0 {
		t.Fatalf("%d of %d revocations the CLI reported were lost", lost, n)
	}
	// The running gateway, after the reload the CLI asks for, refuses every revoked key.
	if a := adminCall(t, http.DefaultClient, "http://"+p.admin, "POST", "/reload", map[string]string{"Authorization": "Bearer " + token}, ""); a.status != 200 {
		t.Fatalf("reload: %d %s", a.status, a.body)
	}
	for i := range n {
		if r := send(t, p, "POST", "/v2/agent/p/job", keyOf("old", i), `{"prompt":"x"}`); r.StatusCode != 401 {
			t.Fatalf("revoked key %d: %d, want 401", i, r.StatusCode)
		}
	}
}

// An entry registered by digest carries the kind its registrant gave. An assistant entry
// granting every domain must not let the svc_ key of that digest create agent jobs in any
// project (domains read as projects): the request path refuses a key whose entry is of the
// other family, on a keys file and on Redis alike.
func TestRegistryKindAgainstFamily(t *testing.T) {
	t.Parallel()
	up, calls := recordingUpstream(t)
	const adminKey = "svc_kindMismatch0123456789abcdefghij"
	const asstKey = "svc_dsc_kindMismatch0123456789abcdefgh"
	keysFile := filepath.Join(t.TempDir(), "keys.yaml")
	if err := auth.SaveKeysFile(keysFile, []auth.Entry{
		{Digest: auth.Digest(adminKey), Kind: "assistant", Org: "acme", Domains: []string{"*"}},
		{Digest: auth.Digest(asstKey), Kind: "admin", Org: "acme", Projects: []string{"*"}},
	}); err != nil {
		t.Fatal(err)
	}
	srv := redistest.Start(t)
	const token = "kind-admin-token-0123456789"
	redisGW := startGateway(t, up, fmt.Sprintf("admin_token: %q\nauth: {mode: registry}\nredis: {addrs: [%q]}\n", token, srv.Addr))
	for _, body := range []string{
		`{"digest":"` + auth.Digest(adminKey) + `","kind":"assistant","org":"acme","domains":["*"]}`,
		`{"digest":"` + auth.Digest(asstKey) + `","kind":"admin","org":"acme","projects":["*"]}`,
	} {
		if a := adminCall(t, http.DefaultClient, "http://"+redisGW.admin, "POST", "/keys", map[string]string{"Authorization": "Bearer " + token, "Content-Type": "application/json"}, body); a.status != 201 {
			t.Fatalf("register by digest: %d %s", a.status, a.body)
		}
	}
	for name, p := range map[string]*proc{
		"keys file": startGateway(t, up, fmt.Sprintf("auth: {mode: registry, keys_file: %q}\n", keysFile)),
		"redis":     redisGW,
	} {
		res := send(t, p, "POST", "/v2/agent/anyproject/job", adminKey, `{"prompt":"x"}`)
		if res.StatusCode != 403 {
			t.Errorf("%s: an svc_ key registered as assistant created a job: %d, want 403 wrong_key_type", name, res.StatusCode)
		}
		res = send(t, p, "POST", "/discovery/v1/assistant/anydomain/message", asstKey, `{"fp":"a","messages":[]}`)
		if res.StatusCode != 403 {
			t.Errorf("%s: an svc_dsc_ key registered as admin sent a message: %d, want 403", name, res.StatusCode)
		}
	}
	if calls() != 0 {
		t.Fatalf("%d requests reached the upstream", calls())
	}
	if _, body := adminGet(t, redisGW, "/metrics", token); !strings.Contains(body, `gateway_auth_rejections_total{reason="wrong_key_type",route="agent_job"} 1`) {
		t.Fatal("wrong_key_type not counted")
	}
	// A registration by value must carry the kind its prefix says.
	a := adminCall(t, http.DefaultClient, "http://"+redisGW.admin, "POST", "/keys", map[string]string{"Authorization": "Bearer " + token, "Content-Type": "application/json"},
		`{"key":"`+adminKey+`","kind":"assistant","org":"acme","domains":["*"]}`)
	if a.status != 400 || a.code != "invalid_request" || strings.Contains(a.body, adminKey) {
		t.Fatalf("registering an svc_ key as assistant: %d %s", a.status, a.body)
	}
}

// Registry mode with neither Redis nor a keys file would lose every key and revocation on the
// next reload: the gateway refuses to start (exit 2), naming both options, as -check-config
// does.
func TestRegistryWithoutStorageRefused(t *testing.T) {
	t.Parallel()
	cfg := writeConfig(t, fmt.Sprintf("listen: %q\nadmin_listen: %q\nupstream: {url: 'http://127.0.0.1:1'}\nauth: {mode: registry}\n", freeAddr(t), freeAddr(t)))
	for _, args := range [][]string{{"-config", cfg}, {"-check-config", "-config", cfg}} {
		out, err := exec.Command(gatewayBin, args...).CombinedOutput()
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "redis.addrs") || !strings.Contains(string(out), "auth.keys_file") {
			t.Fatalf("%v: %v %s", args, err, out)
		}
	}
}

// Re-adding an active key keeps its scheduled revocation and its creation time, unless the
// request sets them; on the keys file and on Redis, through the API and the CLI.
func TestReAddKeepsRevocation(t *testing.T) {
	t.Parallel()
	up, _ := recordingUpstream(t)
	const token = "readd-admin-token-0123456789"
	const key = "svc_readdKey0123456789abcdefghijklm"
	d := auth.Digest(key)
	keysFile := filepath.Join(t.TempDir(), "keys.yaml")
	srv := redistest.Start(t)
	for _, c := range []struct{ name, cfg string }{
		{"keys file", fmt.Sprintf("auth: {mode: registry, keys_file: %q}\n", keysFile)},
		{"redis", fmt.Sprintf("auth: {mode: registry}\nredis: {addrs: [%q]}\n", srv.Addr)},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := startGateway(t, up, fmt.Sprintf("admin_token: %q\n%s", token, c.cfg))
			base := "http://" + p.admin
			hdr := map[string]string{"Authorization": "Bearer " + token, "Content-Type": "application/json"}
			if a := adminCall(t, http.DefaultClient, base, "POST", "/keys", hdr,
				`{"digest":"`+d+`","kind":"admin","org":"acme","projects":["p1"],"created":"2025-01-02","revoked":"2027-01-01"}`); a.status != 201 {
				t.Fatalf("add with a scheduled revocation: %d %s", a.status, a.body)
			}
			check := func(when string, wantCreated, wantRevoked time.Time) {
				t.Helper()
				e := listKeys(t, p, token)[d]
				if !e.Created.Equal(wantCreated) || e.Revoked == nil || !e.Revoked.Equal(wantRevoked) {
					t.Fatalf("%s: created %v revoked %v, want %v and %v", when, e.Created, e.Revoked, wantCreated, wantRevoked)
				}
			}
			created := time.Date(2025, 1, 2, 0, 0, 0, 0, time.UTC)
			revoked := time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC)
			check("after the add", created, revoked)
			// Re-added by value and by digest, with other grants: the times stay.
			if a := adminCall(t, http.DefaultClient, base, "POST", "/keys", hdr, `{"key":"`+key+`","kind":"admin","org":"acme","projects":["p1","p2"]}`); a.status != 201 {
				t.Fatalf("re-add by key: %d %s", a.status, a.body)
			}
			check("after a re-add by key", created, revoked)
			code, out, errOut := keysRun(t, key+"\n", "add", "-config", p.cmd.Args[2], "--kind", "admin", "--org", "acme", "--project", "p3")
			if code != 0 {
				t.Fatalf("CLI re-add: %d %s %s", code, out, errOut)
			}
			check("after a re-add by the CLI", created, revoked)
			// A request that sets the revocation moves it.
			if a := adminCall(t, http.DefaultClient, base, "POST", "/keys", hdr, `{"digest":"`+d+`","kind":"admin","org":"acme","projects":["p1"],"revoked":"2026-12-31T12:00:00Z"}`); a.status != 201 {
				t.Fatalf("re-add with a new revocation: %d %s", a.status, a.body)
			}
			check("after setting revoked", created, time.Date(2026, 12, 31, 12, 0, 0, 0, time.UTC))
			// Still active until then; a revocation now wins over the scheduled one.
			if c.name == "keys file" {
				adminCall(t, http.DefaultClient, base, "POST", "/reload", hdr, "")
			}
			if r := send(t, p, "POST", "/v2/agent/p1/job", key, `{"prompt":"x"}`); r.StatusCode != 201 {
				t.Fatalf("a key revoked in the future: %d", r.StatusCode)
			}
			if a := adminCall(t, http.DefaultClient, base, "DELETE", "/keys/"+d, hdr, ""); a.status != 200 {
				t.Fatalf("revoke: %d %s", a.status, a.body)
			}
			waitFor(t, 3*time.Second, func() bool {
				return send(t, p, "POST", "/v2/agent/p1/job", key, `{"prompt":"x"}`).StatusCode == 401
			})
		})
	}
}

// Keys registered by value must be strong (24 characters of [A-Za-z0-9_-] after the prefix);
// `gateway keys generate` makes one, and with --add registers its digest.
func TestWeakKeysAndGenerate(t *testing.T) {
	t.Parallel()
	up, _ := recordingUpstream(t)
	const token = "weak-admin-token-0123456789"
	keysFile := filepath.Join(t.TempDir(), "keys.yaml")
	p := startGateway(t, up, fmt.Sprintf("admin_token: %q\nauth: {mode: registry, keys_file: %q}\n", token, keysFile))
	hdr := map[string]string{"Authorization": "Bearer " + token, "Content-Type": "application/json"}
	for _, weak := range []string{"svc_1", "svc_short0123456789", "svc_" + strings.Repeat("a", 23), "svc_" + strings.Repeat("a", 30) + "~"} {
		a := adminCall(t, http.DefaultClient, "http://"+p.admin, "POST", "/keys", hdr, `{"key":"`+weak+`","kind":"admin","org":"acme","projects":["p"]}`)
		if a.status != 400 || a.code != "invalid_request" || !strings.Contains(a.body, "24 characters") || strings.Contains(a.body, weak) {
			t.Errorf("weak key %q: %d %s", weak, a.status, a.body)
		}
		if code, _, _ := keysRun(t, weak+"\n", "add", "-config", p.cmd.Args[2], "--kind", "admin", "--org", "acme", "--project", "p"); code != 1 {
			t.Errorf("CLI accepted the weak key %q", weak)
		}
	}
	if len(listKeys(t, p, token)) != 0 {
		t.Fatal("a weak key was registered")
	}

	code, out, errOut := keysRun(t, "", "generate", "--kind", "assistant")
	key := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(key, "svc_dsc_") || len(key) != len("svc_dsc_")+32 || auth.CheckStrength(key, auth.Assistant) != nil {
		t.Fatalf("generate: %d %q %q", code, out, errOut)
	}
	code, out, errOut = keysRun(t, "", "generate", "--kind", "admin", "--add", "-config", p.cmd.Args[2], "--org", "acme", "--project", "p7")
	key = strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(key, "svc_") || strings.Count(out, "\n") != 1 || !strings.Contains(errOut, auth.Digest(key)) {
		t.Fatalf("generate --add: %d %q %q", code, out, errOut)
	}
	adminCall(t, http.DefaultClient, "http://"+p.admin, "POST", "/reload", hdr, "")
	if r := send(t, p, "POST", "/v2/agent/p7/job", key, `{"prompt":"x"}`); r.StatusCode != 201 {
		t.Fatalf("the generated and registered key: %d", r.StatusCode)
	}
	if code, _, errOut := keysRun(t, "", "generate", "--kind", "admin", "--org", "acme"); code != 2 || !strings.Contains(errOut, "--add") {
		t.Fatalf("generate with registration flags but no --add: %d %q", code, errOut)
	}
}

// A password in a URL-like config value never comes back: not in the exit message of a bad
// start, not in POST /reload's 422, not in the error log, not on the usage page.
func TestConfigSecretsRedacted(t *testing.T) {
	t.Parallel()
	const secret = "S3cretRedisPa55word"
	bad := fmt.Sprintf("upstream: {url: 'http://127.0.0.1:1'}\nredis: {addrs: ['redis://default:%s@127.0.0.1:6379']}\n", secret)
	out, err := exec.Command(gatewayBin, "-config", writeConfig(t, bad)).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || strings.Contains(string(out), secret) || !strings.Contains(string(out), "redis.addrs[0]") {
		t.Fatalf("bad start: %v %s", err, out)
	}
	up, _ := recordingUpstream(t)
	const token = "redact-admin-token-0123456789"
	p := startGateway(t, up, fmt.Sprintf("admin_token: %q\n", token))
	cfg := p.cmd.Args[2]
	good, _ := os.ReadFile(cfg)
	for _, broken := range []string{
		fmt.Sprintf("redis: {addrs: ['redis://default:%s@127.0.0.1:6379']}\n", secret),
		fmt.Sprintf("cors: {allowed_origins: ['https://u:%s@docs.example/path']}\n", secret),
		fmt.Sprintf("routes: [{name: a, method: POST, path: /a, key: admin, deprecation: {since: 2025-01-01, link: 'ftp://u:%s@docs'}}]\n", secret),
	} {
		if err := os.WriteFile(cfg, append(append([]byte{}, good...), broken...), 0o600); err != nil {
			t.Fatal(err)
		}
		a := adminCall(t, http.DefaultClient, "http://"+p.admin, "POST", "/reload", map[string]string{"Authorization": "Bearer " + token}, "")
		if a.status != 422 || a.code != "reload_rejected" || strings.Contains(a.body, secret) || !strings.Contains(a.body, "REDACTED") {
			t.Errorf("reload of %q: %d %s", broken, a.status, a.body)
		}
	}
	page := adminCall(t, http.DefaultClient, "http://"+p.admin, "GET", "/ui/", map[string]string{"Authorization": "Bearer " + token}, "")
	if page.status != 200 || strings.Contains(page.body, secret) || !strings.Contains(page.body, "REDACTED") {
		t.Fatalf("usage page: %d, holds the secret: %t", page.status, strings.Contains(page.body, secret))
	}
	if strings.Contains(p.out.String(), secret) {
		t.Fatal("the password reached the log")
	}
}
