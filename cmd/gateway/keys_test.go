package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/internal/redistest"
)

// keysRun runs the built binary as `gateway keys args...` with stdin, bounded in time.
func keysRun(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	return cliRun(t, nil, stdin, append([]string{"keys"}, args...)...)
}

// keyCLI runs the CLI and remembers every output, to check later that no key ever appeared.
type keyCLI struct {
	t       *testing.T
	config  string
	outputs []string
}

func (k *keyCLI) run(stdin string, args ...string) (int, string, string) {
	k.t.Helper()
	code, out, errOut := keysRun(k.t, stdin, args...)
	k.outputs = append(k.outputs, out, errOut)
	return code, out, errOut
}

func (k *keyCLI) must(stdin string, args ...string) string {
	k.t.Helper()
	code, out, errOut := k.run(stdin, args...)
	if code != 0 {
		k.t.Fatalf("gateway keys %v: exit %d\nstdout: %s\nstderr: %s", args, code, out, errOut)
	}
	return out
}

func (k *keyCLI) listJSON() map[string]auth.Entry {
	k.t.Helper()
	out := k.must("", "list", "-config", k.config, "-json")
	m := map[string]auth.Entry{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if line == "" {
			continue
		}
		var e auth.Entry
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			k.t.Fatalf("list -json line %q: %v", line, err)
		}
		m[e.Digest] = e
	}
	return m
}

// Secrets used in these tests: the part after the prefix must never show up anywhere.
const (
	cliAssistantKey = "svc_dsc_Qx7cliAssistantSecret-0123456789"
	cliAdminKey     = "svc_Qx7cliAdminSecret_0123456789abcdef"
	secretMark      = "Qx7cli"
)

// exerciseKeysCLI adds, lists and revokes keys through the binary, whatever the store.
func exerciseKeysCLI(t *testing.T, k *keyCLI) {
	cfg := k.config
	d := k.must(cliAssistantKey+"\n", "add", "-config", cfg, "--kind", "assistant", "--org", "acme",
		"--domain", "acme-docs", "--domain", "acme-blog", "--plan", "enterprise", "--label", "docs site")
	if d != auth.Digest(cliAssistantKey)+"\n" {
		t.Fatalf("add printed %q, want the digest", d)
	}
	// Spaces around the key are trimmed; the flags may follow the subcommand in any order.
	d2 := k.must("  "+cliAdminKey+"  \n", "add", "--kind", "admin", "--org", "acme", "-config", cfg, "--project", "p1,p2")
	if d2 != auth.Digest(cliAdminKey)+"\n" {
		t.Fatalf("add printed %q", d2)
	}
	list := k.listJSON()
	a, ok := list[auth.Digest(cliAssistantKey)]
	if len(list) != 2 || !ok || a.Kind != "assistant" || a.Org != "acme" || a.Plan != "enterprise" || a.Label != "docs site" ||
		strings.Join(a.Domains, ",") != "acme-docs,acme-blog" || a.Created.IsZero() || !a.Active() {
		t.Fatalf("list: %+v", list)
	}
	if p := list[auth.Digest(cliAdminKey)]; strings.Join(p.Projects, ",") != "p1,p2" || p.Kind != "admin" {
		t.Fatalf("admin entry: %+v", p)
	}
	table := k.must("", "list", "-config", cfg)
	if !strings.HasPrefix(table, "DIGEST") || !strings.Contains(table, auth.Digest(cliAssistantKey)) ||
		!strings.Contains(table, "domains=acme-docs,acme-blog") || !strings.Contains(table, "projects=p1,p2") {
		t.Fatalf("table:\n%s", table)
	}

	// Refusals, each without touching the store.
	refusals := []struct {
		stdin string
		args  []string
		code  int
	}{
		{"", []string{"add", "-config", cfg, "--kind", "assistant", "--org", "acme", "--domain", "d"}, 1},                           // no key
		{"\n\n", []string{"add", "-config", cfg, "--kind", "assistant", "--org", "acme", "--domain", "d"}, 1},                       // blank line
		{"svc_dsc_" + secretMark + "x\n", []string{"add", "-config", cfg, "--kind", "admin", "--org", "acme", "--project", "p"}, 1}, // other family
		{"pk_" + secretMark + "\n", []string{"add", "-config", cfg, "--kind", "assistant", "--org", "acme", "--domain", "d"}, 1},    // no family
		{"svc_dsc_" + secretMark + " y\n", []string{"add", "-config", cfg, "--kind", "assistant", "--org", "acme", "--domain", "d"}, 1},
		{strings.Repeat("svc_dsc_"+secretMark, 600) + "\n", []string{"add", "-config", cfg, "--kind", "assistant", "--org", "acme", "--domain", "d"}, 1},
		{"", []string{"add", "-config", cfg, "--kind", "assistant", "--org", "acme", "--domain", "d", "svc_dsc_" + secretMark}, 2}, // key in argv
		{"svc_dsc_" + secretMark + "z\n", []string{"add", "-config", cfg, "--kind", "assistant", "--org", "acme", "--domain", "d", "--label", "svc_dsc_" + secretMark}, 2},
		{"svc_dsc_" + secretMark + "z\n", []string{"add", "-config", cfg, "--kind", "assistant", "--org", "acme"}, 2},                   // no domain
		{"svc_dsc_" + secretMark + "z\n", []string{"add", "-config", cfg, "--kind", "assistant", "--org", "acme", "--project", "p"}, 2}, // project on assistant
		{"svc_dsc_" + secretMark + "z\n", []string{"add", "-config", cfg, "--kind", "root", "--org", "acme", "--domain", "d"}, 2},
		{"svc_dsc_" + secretMark + "z\n", []string{"add", "--kind", "assistant", "--org", "acme", "--domain", "d"}, 2},                // no -config
		{"svc_dsc_" + secretMark + "\n", []string{"add", "-config", cfg, "--kind", "assistant", "--org", "acme", "--domain", "d"}, 1}, // weak
		{"svc_1\n", []string{"add", "-config", cfg, "--kind", "admin", "--org", "acme", "--project", "p"}, 1},                         // weak
		{"", []string{"revoke", "-config", cfg}, 2},
		{"", []string{"revoke", "-config", cfg, "svc_dsc_" + secretMark}, 2},
		{"", []string{"revoke", "-config", cfg, auth.Digest("svc_nobody")}, 1},
		{"", []string{"frobnicate"}, 2},
		{"", nil, 2},
		{"", []string{"list", "-config", filepath.Join(t.TempDir(), "missing.yaml")}, 2},
	}
	for i, r := range refusals {
		code, out, errOut := k.run(r.stdin, r.args...)
		if code != r.code || errOut == "" || out != "" {
			t.Errorf("refusal %d (%v): exit %d, want %d\nstdout: %q\nstderr: %q", i, r.args, code, r.code, out, errOut)
		}
	}
	if n := len(k.listJSON()); n != 2 {
		t.Fatalf("refused commands changed the store: %d entries", n)
	}

	// Revoke (DIGEST before or after the flags).
	if out := k.must("", "revoke", auth.Digest(cliAssistantKey), "-config", cfg); !strings.Contains(out, auth.Digest(cliAssistantKey)) {
		t.Fatalf("revoke printed %q", out)
	}
	list = k.listJSON()
	ra, rb := list[auth.Digest(cliAssistantKey)], list[auth.Digest(cliAdminKey)]
	if ra.Active() || !rb.Active() {
		t.Fatalf("after revoke: %+v", list)
	}
	first := list[auth.Digest(cliAssistantKey)].Revoked
	k.must("", "revoke", "-config", cfg, auth.Digest(cliAssistantKey)) // again: fine, time kept
	if again := k.listJSON()[auth.Digest(cliAssistantKey)].Revoked; !again.Equal(*first) {
		t.Fatalf("second revoke moved the time: %v -> %v", first, again)
	}
	if table := k.must("", "list", "-config", cfg); !strings.Contains(table, first.UTC().Format(time.RFC3339)) {
		t.Fatalf("table lacks the revocation time:\n%s", table)
	}
	if code, out, _ := k.run("", "-h"); code != 0 || !strings.Contains(out, "gateway keys add") {
		t.Fatalf("help: %d %q", code, out)
	}

	for _, o := range k.outputs {
		if strings.Contains(o, secretMark) {
			t.Fatalf("a key appeared in the output: %q", o)
		}
	}
}

func TestKeysCLIKeysFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	keysFile := filepath.Join(dir, "keys.yaml")
	cfg := writeConfig(t, fmt.Sprintf("upstream: {url: 'http://127.0.0.1:1'}\nauth: {mode: registry, keys_file: %q}\nplans: {enterprise: {}}\n", keysFile))
	k := &keyCLI{t: t, config: cfg}
	if got := k.listJSON(); len(got) != 0 { // no file yet: no keys
		t.Fatalf("list without a file: %v", got)
	}
	exerciseKeysCLI(t, k)

	data, err := os.ReadFile(keysFile)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(data, []byte(secretMark)) {
		t.Fatalf("a key is in the keys file:\n%s", data)
	}
	fi, _ := os.Stat(keysFile)
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("keys file mode %v", fi.Mode())
	}
	// What the gateway will load.
	entries, err := auth.LoadKeysFile(keysFile)
	if err != nil || len(entries) != 2 {
		t.Fatalf("LoadKeysFile: %v %v", entries, err)
	}
	// Beside it only its writers' lock file (kept, so that two writers never lock two files).
	if ents, _ := os.ReadDir(dir); len(ents) != 2 || ents[0].Name() != "keys.yaml" || ents[1].Name() != "keys.yaml.lock" {
		t.Fatalf("stray files next to the keys file: %v", ents)
	}

	// Neither Redis nor a keys file: nowhere to keep keys.
	bare := writeConfig(t, "upstream: {url: 'http://127.0.0.1:1'}\n")
	if code, _, errOut := keysRun(t, "", "list", "-config", bare); code != 1 || !strings.Contains(errOut, "keys_file") {
		t.Fatalf("no store: %d %q", code, errOut)
	}
	// A keys file holding a raw key is refused, and the key is not repeated.
	os.WriteFile(keysFile, []byte("keys:\n  - key: svc_dsc_"+secretMark+"\n"), 0o600)
	if code, out, errOut := keysRun(t, "", "list", "-config", cfg); code != 1 || strings.Contains(out+errOut, secretMark) || !strings.Contains(errOut, "raw keys") {
		t.Fatalf("raw key in file: %d %q %q", code, out, errOut)
	}
}

func TestKeysCLIRedis(t *testing.T) {
	srv := redistest.Start(t)
	cfg := writeConfig(t, fmt.Sprintf("upstream: {url: 'http://127.0.0.1:1'}\nauth: {mode: registry}\nredis: {addrs: [%q], key_prefix: clitest}\nplans: {enterprise: {}}\n", srv.Addr))
	rc := srv.Client(t)
	ctx := context.Background()

	// A running replica, with its cache, watching the same Redis.
	replica, err := auth.NewRedisRegistry(ctx, redis.NewClient(&redis.Options{Addr: srv.Addr}), auth.RedisRegistryOptions{Prefix: "clitest", CacheTTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	defer replica.Close()
	d := auth.Digest(cliAssistantKey)
	if _, ok, err := replica.Lookup(ctx, d); ok || err != nil {
		t.Fatalf("before add: %v %v", ok, err)
	}

	k := &keyCLI{t: t, config: cfg}
	exerciseKeysCLI(t, k)

	// The replica saw the add and then the revocation, through its cache.
	e, ok, err := replica.Lookup(ctx, d)
	if err != nil || !ok || e.Active() {
		t.Fatalf("replica: %+v %v %v", e, ok, err)
	}
	e, ok, _ = replica.Lookup(ctx, auth.Digest(cliAdminKey))
	if !ok || !e.Active() || !e.Allows("p2") || e.Allows("p3") {
		t.Fatalf("replica admin key: %+v %v", e, ok)
	}

	// A revocation through the CLI reaches a replica that has the key cached within a second.
	d3 := strings.TrimSpace(k.must("svc_dsc_"+secretMark+"Third-0123456789abcdef\n", "add", "-config", cfg, "--kind", "assistant", "--org", "acme", "--domain", "d"))
	if e, ok, _ := replica.Lookup(ctx, d3); !ok || !e.Active() {
		t.Fatalf("replica before revoke: %+v %v", e, ok)
	}
	k.must("", "revoke", "-config", cfg, d3)
	revoked := time.Now() // the CLI has exited: the revocation is written and published
	for {
		if e, _, _ := replica.Lookup(ctx, d3); !e.Active() {
			break
		}
		if time.Since(revoked) > time.Second {
			t.Fatal("replica still accepts a key revoked through the CLI a second ago")
		}
		time.Sleep(time.Millisecond)
	}
	t.Logf("replica saw the CLI's revocation %v after the CLI exited", time.Since(revoked))

	// Nothing in Redis holds a key: every key name and every value.
	keys, err := scanAll(ctx, rc)
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) != 4 { // three entries and the index
		t.Fatalf("redis keys: %v", keys)
	}
	for _, name := range keys {
		var val string
		switch typ, _ := rc.Type(ctx, name).Result(); typ {
		case "string":
			val, err = rc.Get(ctx, name).Result()
		case "set":
			var m []string
			m, err = rc.SMembers(ctx, name).Result()
			val = strings.Join(m, ",")
		default:
			t.Fatalf("unexpected %s key %s", typ, name)
		}
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(name+val, secretMark) || strings.Contains(name+val, "svc_") {
			t.Fatalf("a key is stored in Redis: %s = %s", name, val)
		}
	}
	for _, o := range k.outputs {
		if strings.Contains(o, secretMark) {
			t.Fatalf("a key appeared in the output: %q", o)
		}
	}
}

func scanAll(ctx context.Context, rc *redis.Client) ([]string, error) {
	var all []string
	var cursor uint64
	for {
		keys, next, err := rc.Scan(ctx, cursor, "*", 100).Result()
		if err != nil {
			return nil, err
		}
		all = append(all, keys...)
		if cursor = next; cursor == 0 {
			return all, nil
		}
	}
}

func TestKeysCLIRedisCluster(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, 3)
	addrs := `["` + strings.Join(cl.Addrs, `", "`) + `"]`
	cfg := writeConfig(t, "upstream: {url: 'http://127.0.0.1:1'}\nredis: {addrs: "+addrs+"}\nplans: {enterprise: {}}\n")
	k := &keyCLI{t: t, config: cfg}
	exerciseKeysCLI(t, k)
}

// The Redis store is down: the CLI fails within its time bound, exit 1.
func TestKeysCLIRedisDown(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	srv.Stop(t)
	cfg := writeConfig(t, fmt.Sprintf("upstream: {url: 'http://127.0.0.1:1'}\nredis: {addrs: [%q]}\n", srv.Addr))
	start := time.Now()
	code, out, errOut := keysRun(t, cliAdminKey+"\n", "add", "-config", cfg, "--kind", "admin", "--org", "o", "--project", "p")
	if code != 1 || out != "" || strings.Contains(errOut, secretMark) {
		t.Fatalf("redis down: %d %q %q", code, out, errOut)
	}
	t.Logf("failed after %v: %s", time.Since(start), strings.TrimSpace(errOut))
}
