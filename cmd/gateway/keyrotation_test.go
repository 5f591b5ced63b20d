package main

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/internal/redistest"
)

// The keys' lifecycle as operators meet it: the built binaries, a config file, the CLI and
// the admin API, HTTP.

const (
	lcToken     = "lifecycle-admin-token-0123456789"
	lcPath      = "/discovery/v1/assistant/acme-docs/message"
	lcBody      = `{"fp":"a","messages":[]}`
	lcKeyBudget = 10_000 // assistant_per_key's default: 10,000 a month
)

// lcConfig is a registry-mode config over store (a redis: section, or auth.keys_file) in
// which assistant_per_key, at its default of 10,000 a month, is the one limit of the
// assistant route: the org's and the address's are off, so that only the key's budget
// refuses (the same 10,000 by default, they would refuse at the same count, and hide a budget
// that a rotation reset).
func lcConfig(upURL, redisPart, keysFile, extra string) string {
	auth := "auth: {mode: registry}\n"
	if keysFile != "" {
		auth = fmt.Sprintf("auth: {mode: registry, keys_file: %q}\n", keysFile)
	}
	return fmt.Sprintf(`upstream: {url: %q}
admin_token: %q
%s%slimits:
  assistant_per_org: {limit: 0}
  assistant_per_ip: {limit: 0}
%s`, upURL, lcToken, auth, redisPart, extra)
}

// lcAdmin calls p's admin API with the token; it fails the test on a status other than want.
func lcAdmin(t *testing.T, p *proc, method, path, body string, want int) string {
	t.Helper()
	h := map[string]string{"Authorization": "Bearer " + lcToken}
	if body != "" {
		h["Content-Type"] = "application/json"
	}
	a := adminCall(t, http.DefaultClient, "http://"+p.admin, method, path, h, body)
	if a.status != want {
		t.Fatalf("%s %s: %d %s; want %d", method, path, a.status, a.body, want)
	}
	return a.body
}

// spent is what spend saw: statuses by key, and the limits the 429s named.
type spent struct {
	codes   map[string]map[int]int
	limited map[string]int
}

func (s spent) total(code int) int {
	n := 0
	for _, c := range s.codes {
		n += c[code]
	}
	return n
}

// spend sends n assistant requests, 16 at a time, the keys taking turns and the replicas
// too.
func spend(t *testing.T, gws []*proc, keys []string, n int) spent {
	t.Helper()
	out := spent{codes: map[string]map[int]int{}, limited: map[string]int{}}
	for _, k := range keys {
		out.codes[k] = map[int]int{}
	}
	var mu sync.Mutex
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	defer client.CloseIdleConnections()
	work := make(chan int)
	var wg sync.WaitGroup
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				key := keys[i%len(keys)]
				req, _ := http.NewRequest("POST", "http://"+gws[(i/len(keys))%len(gws)].public+lcPath, strings.NewReader(lcBody))
				req.Header.Set("Authorization", "Bearer "+key)
				req.Header.Set("Content-Type", "application/json")
				res, err := client.Do(req)
				code, limit := 0, ""
				if err == nil {
					var b struct {
						Limit string `json:"limit"`
					}
					data, _ := io.ReadAll(res.Body)
					res.Body.Close()
					_ = json.Unmarshal(data, &b)
					code, limit = res.StatusCode, b.Limit
				}
				mu.Lock()
				out.codes[key][code]++
				if code == 429 {
					out.limited[limit]++
				}
				mu.Unlock()
			}
		}()
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	return out
}

// statusOf is the status of one request of key to p.
func statusOf(t *testing.T, p *proc, key string) int {
	t.Helper()
	req, _ := http.NewRequest("POST", "http://"+p.public+lcPath, strings.NewReader(lcBody))
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode
}

// refusedBy waits until every replica refuses key with 401, and fails the test unless each
// did within a second of at (none before it).
func refusedBy(t *testing.T, gws []*proc, key string, at time.Time) {
	t.Helper()
	for i, p := range gws {
		for {
			// The gateway decided between sent and answered: a refusal is early only if it
			// was answered before the end, late by at most what passed since it was sent.
			sent := time.Now()
			code := statusOf(t, p, key)
			answered := time.Now()
			if code == 401 {
				if answered.Before(at) {
					t.Fatalf("replica %d refused the key %v before its end", i, at.Sub(answered))
				}
				late := max(sent.Sub(at), 0)
				t.Logf("replica %d refused the key %v after its end", i, late.Round(time.Millisecond))
				if late > time.Second {
					t.Fatalf("replica %d refused the key %v after its end; want within 1s", i, late)
				}
				break
			}
			if sent.After(at.Add(time.Second)) {
				t.Fatalf("replica %d still answers %d to the key a second after its end", i, code)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// rotationCase is one store the rotation runs on.
type rotationCase struct {
	gws []*proc
	// rotate rotates the key of digest with the overlap and returns the new key and when
	// the old one ends.
	rotate func(t *testing.T, digest string, overlap time.Duration) (string, time.Time)
}

// The measure of rotation, on every store: a key with 9,000 of its 10,000 used this month is
// rotated; the old key during the overlap and the new key together get exactly 1,000 more;
// after the overlap the old key is refused on every replica within a second; history and the
// CSV export show one row of 10,000 for the month, under the first key's digest.
func TestRotationKeepsTheKeysBudget(t *testing.T) {
	t.Parallel()
	upURL, _ := recordingUpstream(t)
	const overlap = 20 * time.Second

	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t)
		cfg := lcConfig(upURL, fmt.Sprintf("redis: {addrs: [%q], timeout: 2s}\n", srv.Addr), "", "")
		path := writeConfig(t, cfg)
		gws := []*proc{startGatewayRaw(t, cfg), startGatewayRaw(t, cfg)}
		checkRotation(t, rotationCase{gws: gws, rotate: func(t *testing.T, digest string, overlap time.Duration) (string, time.Time) {
			return cliRotate(t, path, digest, overlap, nil)
		}}, overlap)
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		cl := redistest.StartCluster(t, 3)
		addrs, _ := json.Marshal(cl.Addrs)
		cfg := lcConfig(upURL, fmt.Sprintf("redis: {addrs: %s, timeout: 2s}\n", addrs), "", "")
		gws := []*proc{startGatewayRaw(t, cfg), startGatewayRaw(t, cfg)}
		checkRotation(t, rotationCase{gws: gws, rotate: func(t *testing.T, digest string, overlap time.Duration) (string, time.Time) {
			return apiRotate(t, gws[1], digest, overlap)
		}}, overlap)
	})
	t.Run("keys_file", func(t *testing.T) {
		t.Parallel()
		keysFile := filepath.Join(t.TempDir(), "keys.yaml")
		cfg := lcConfig(upURL, "", keysFile, "")
		path := writeConfig(t, cfg)
		// Without Redis each replica counts its own quota: one replica, as such a gateway runs.
		gw := startGatewayRaw(t, cfg)
		checkRotation(t, rotationCase{gws: []*proc{gw}, rotate: func(t *testing.T, digest string, overlap time.Duration) (string, time.Time) {
			// The CLI writes the keys file; the running gateway reads it on reload.
			return cliRotate(t, path, digest, overlap, func() { lcAdmin(t, gw, "POST", "/reload", "", 200) })
		}}, overlap)
	})
}

// cliRotate runs `gateway keys rotate` and returns the key it printed and the old key's end;
// then reload, when set, makes the running gateways read the change.
func cliRotate(t *testing.T, config, digest string, overlap time.Duration, reload func()) (string, time.Time) {
	t.Helper()
	code, out, errOut := keysRun(t, "", "rotate", "-config", config, digest, "--overlap", overlap.String())
	if code != 0 {
		t.Fatalf("keys rotate: exit %d\n%s%s", code, out, errOut)
	}
	key := strings.TrimSpace(out)
	if strings.Count(out, "\n") != 1 || !strings.HasPrefix(key, "svc_dsc_") || strings.Contains(errOut, key) {
		t.Fatalf("keys rotate printed %q on stdout (want the new key alone) and %q on stderr", out, errOut)
	}
	if !strings.Contains(errOut, digest[:12]) || !strings.Contains(errOut, " works until ") {
		t.Fatalf("keys rotate said nothing of the old key's end: %q", errOut)
	}
	if reload != nil {
		reload()
	}
	// The old key's end to the nanosecond, as the registry holds it (the CLI's line says it
	// to the second).
	old := (&keyCLI{t: t, config: config}).listJSON()[digest]
	if old.Revoked == nil || old.RotatedTo != auth.Digest(key) {
		t.Fatalf("the old key after the rotation: %+v", old)
	}
	return key, *old.Revoked
}

// apiRotate rotates through POST /keys/{digest}/rotate.
func apiRotate(t *testing.T, p *proc, digest string, overlap time.Duration) (string, time.Time) {
	t.Helper()
	body := lcAdmin(t, p, "POST", "/keys/"+digest+"/rotate", fmt.Sprintf(`{"overlap":%q}`, overlap.String()), 201)
	var r struct {
		Key      string     `json:"key"`
		Previous auth.Entry `json:"previous"`
	}
	if err := json.Unmarshal([]byte(body), &r); err != nil || r.Previous.Revoked == nil {
		t.Fatalf("rotate answer %s: %v", body, err)
	}
	return r.Key, *r.Previous.Revoked
}

func checkRotation(t *testing.T, c rotationCase, overlap time.Duration) {
	gws := c.gws
	const old = "svc_dsc_lifecycleRotatedKey0123456789ab"
	oldDigest := auth.Digest(old)
	lcAdmin(t, gws[0], "POST", "/keys", `{"key":"`+old+`","kind":"assistant","org":"acme","domains":["acme-docs"],"label":"docs-widget"}`, 201)

	used := spend(t, gws, []string{old}, 9_000)
	if used.codes[old][201] != 9_000 {
		t.Fatalf("the first 9,000 requests: %v", used.codes)
	}
	key, ends := c.rotate(t, oldDigest, overlap)
	newDigest := auth.Digest(key)

	// During the overlap both keys work, and share what is left: exactly 1,000.
	more := spend(t, gws, []string{old, key}, 1_200)
	if time.Now().After(ends) {
		t.Fatalf("the overlap of %v ended before the requests did: a slow machine; the count is not a measure", overlap)
	}
	if got := more.total(201); got != lcKeyBudget-9_000 || more.total(429) != 200 || more.limited["assistant_per_key"] != 200 {
		t.Fatalf("after the rotation both keys got %v; want exactly 1,000 more admitted and 200 refused by assistant_per_key (%v)", more.codes, more.limited)
	}
	if more.codes[old][201] == 0 || more.codes[key][201] == 0 {
		t.Fatalf("both keys work during the overlap: %v", more.codes)
	}

	// After the overlap: the old key is refused everywhere within a second, the new one is
	// still counted (its budget is spent: 429, not 401).
	time.Sleep(time.Until(ends.Add(-500 * time.Millisecond)))
	refusedBy(t, gws, old, ends)
	for i, p := range gws {
		if code := statusOf(t, p, key); code != 429 {
			t.Fatalf("replica %d: the new key after the overlap answers %d; want 429 (the lineage's budget is spent)", i, code)
		}
	}

	// One tenant in history and in the export: the first key's digest, 10,000.
	var h struct {
		ID      string `json:"id"`
		Windows []struct {
			Used int64 `json:"used"`
		} `json:"windows"`
	}
	body := lcAdmin(t, gws[len(gws)-1], "GET", "/usage/history?limit=assistant_per_key&id="+newDigest, "", 200)
	if err := json.Unmarshal([]byte(body), &h); err != nil || h.ID != oldDigest || len(h.Windows) == 0 || h.Windows[0].Used != lcKeyBudget {
		t.Fatalf("the new key's history: %s; want the lineage %s with 10,000 this month", body, oldDigest)
	}
	csvText := lcAdmin(t, gws[0], "GET", "/usage/export?limit=assistant_per_key&window=current", "", 200)
	rows, err := csv.NewReader(strings.NewReader(csvText)).ReadAll()
	if err != nil || len(rows) != 2 || rows[1][0] != oldDigest || rows[1][1] != "10000" || rows[1][4] != "docs-widget" || rows[1][5] != "acme" {
		t.Fatalf("export: %q (%v); want one row: %s, 10000, ..., docs-widget, acme", csvText, err, oldDigest)
	}
	// The usage of either key, asked by the key, is the lineage's.
	for _, k := range []string{old, key} {
		u := lcAdmin(t, gws[0], "POST", "/usage/key", `{"key":"`+k+`"}`, 200)
		if !strings.Contains(u, `"used":10000`) {
			t.Fatalf("usage of a key of the lineage: %s", u)
		}
	}
}

// The CLI's lifecycle commands on a keys file: add with --scope and --expires, rotate by the
// key on standard input, and the refusals: a rotation of a key rotated already or revoked (1),
// a config in prefix mode, a scope naming no route of the key's kind, an expiry past or
// unreadable (2).
func TestKeysLifecycleCLI(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	keysFile := filepath.Join(dir, "keys.yaml")
	cfg := writeConfig(t, lcConfig("http://127.0.0.1:1", "", keysFile, ""))
	k := &keyCLI{t: t, config: cfg}
	const key = "svc_dsc_" + secretMark + "Lifecycle-0123456789abcdef"
	d := strings.TrimSpace(k.must(key+"\n", "add", "-config", cfg, "--kind", "assistant", "--org", "acme", "--domain", "acme-docs",
		"--scope", "assistant_message_v2", "--expires", "90d"))
	e := k.listJSON()[d]
	if len(e.Scopes) != 1 || e.Scopes[0] != "assistant_message_v2" || e.Expires == nil || e.Expires.Sub(time.Now().Add(90*24*time.Hour)).Abs() > time.Minute {
		t.Fatalf("the entry added: %+v", e)
	}
	out := k.must(key+"\n", "rotate", "-config", cfg, "--key-stdin", "--overlap", "0s", "--expires", "2099-01-01")
	next := strings.TrimSpace(out)
	list := k.listJSON()
	if n := list[auth.Digest(next)]; n.Lineage != d || n.Replaces != d || len(n.Scopes) != 1 || n.Expires == nil || n.Expires.Year() != 2099 {
		t.Fatalf("the successor: %+v", n)
	}
	if o := list[d]; o.RotatedTo != auth.Digest(next) || o.Revoked == nil || o.Revoked.After(time.Now()) {
		t.Fatalf("the old key after a rotation with no overlap: %+v", o)
	}
	for _, c := range []struct {
		code  int
		stdin string
		args  []string
		want  string
	}{
		{1, "", []string{"rotate", "-config", cfg, d}, "revoked"},
		{1, "", []string{"rotate", "-config", cfg, strings.Repeat("a", 64)}, "no key with this digest"},
		{2, "", []string{"rotate", "-config", cfg, d, "--overlap", "soon"}, "--overlap"},
		{2, "", []string{"rotate", "-config", cfg, "not-a-digest"}, "not a digest"},
		{2, "", []string{"rotate", "-config", writeConfig(t, "upstream: {url: 'http://127.0.0.1:1'}\n"), d}, "prefix"},
		{2, key + "\n", []string{"add", "-config", cfg, "--kind", "assistant", "--org", "acme", "--domain", "d", "--scope", "agent_job"}, "--scope"},
		{2, key + "\n", []string{"add", "-config", cfg, "--kind", "assistant", "--org", "acme", "--domain", "d", "--expires", "whenever"}, "--expires"},
		{1, "svc_dsc_" + secretMark + "Other-0123456789abcdefgh\n", []string{"add", "-config", cfg, "--kind", "assistant", "--org", "acme", "--domain", "d", "--expires", "2020-01-01"}, "expiry"},
	} {
		code, stdout, stderr := k.run(c.stdin, c.args...)
		if code != c.code || !strings.Contains(stderr, c.want) || stdout != "" {
			t.Errorf("keys %v: exit %d, stdout %q, stderr %q; want exit %d naming %q", c.args, code, stdout, stderr, c.code, c.want)
		}
	}
	for _, o := range k.outputs {
		if strings.Contains(o, secretMark) {
			t.Fatalf("a key given on standard input appeared in the output: %q", o)
		}
	}
}
