package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/docsgate/gateway/auth"
)

// cliRun runs the built binary with args, stdin and the extra environment, bounded in time.
func cliRun(t *testing.T, env []string, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, gatewayBin, args...)
	// A race-detector binary sleeps a second at exit by default, to report late races.
	cmd.Env = append(append(os.Environ(), "GORACE=atexit_sleep_ms=0", "GATEWAY_ADMIN_URL=", "GATEWAY_ADMIN_TOKEN="), env...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("gateway %v: %v", args, err)
	}
	return code, out.String(), errOut.String()
}

// usageLine is the one line of a usage error: what is wrong, and which help to read.
var usageLine = regexp.MustCompile(`^gateway: [^\n]+; see 'gateway help( [a-z]+)?'\n$`)

// serverLine is the one line of an error answer of the admin API: its code and message.
// (the HTTP status stands for the code of an answer that is not the API's JSON).
var serverLine = regexp.MustCompile(`^gateway: [a-z_0-9]+: [^\n]+\n$`)

// Help and version print on stdout and exit 0; a usage error is one line on stderr pointing
// to the help, exits 2 and sends no request.
func TestHelpVersionAndUsageErrorsCLI(t *testing.T) {
	t.Parallel()
	// Only the CLI's requests count: they go under a path of this test's own (the admin URL
	// may have one). The port is a free one, and a parallel test's process may still send to
	// whoever held it before (a webhook retried to a receiver that has stopped): such
	// requests are logged, not counted.
	const base = "/cli-test-7f3a"
	var requests atomic.Int64
	admin := serveHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.URL.Path, base+"/") {
			t.Logf("a request not from the CLI: %s %s (User-Agent %q)", r.Method, r.URL.Path, r.UserAgent())
			w.WriteHeader(404)
			return
		}
		requests.Add(1)
		w.WriteHeader(500)
	}))
	env := []string{"GATEWAY_ADMIN_URL=" + admin + base, "GATEWAY_ADMIN_TOKEN=t"}

	_, top, _ := cliRun(t, nil, "", "help")
	helps := []struct {
		args []string
		want string // on stdout
	}{
		{[]string{"help"}, "gateway usage top|show|history"},
		{[]string{"-h"}, top},
		{[]string{"--help"}, top},
		{[]string{"help", "help"}, top},
		{[]string{"help", "keys"}, "gateway keys revoke   -config FILE --key-stdin"},
		{[]string{"help", "keys"}, "with -json one JSON object per line"},
		{[]string{"keys", "-h"}, "--key-stdin"},
		{[]string{"keys", "revoke", "-h"}, "--key-stdin"},
		{[]string{"keys", "add", "--help"}, "gateway keys add"},
		{[]string{"help", "quota"}, "-json         print the admin API's JSON answer"},
		{[]string{"help", "quota"}, "-config FILE  the gateway's config file"},
		{[]string{"quota", "grant", "-h"}, "gateway quota grant"},
		{[]string{"help", "usage"}, "gateway usage history [-admin URL | -config FILE] --limit NAME --id ID [--unit requests|tokens] [-json]"},
		{[]string{"usage", "--help"}, "gateway usage show"},
		{[]string{"usage", "top", "-h"}, "-json prints the admin API's JSON answer"},
		{[]string{"help", "version"}, "gateway version"},
		{[]string{"version", "-h"}, "Prints \"gateway VERSION"},
		{[]string{"version"}, "gateway v0.0.0-test (go"},
		{[]string{"-version"}, "gateway v0.0.0-test (go"},
	}
	for _, h := range helps {
		code, out, errOut := cliRun(t, env, "", h.args...)
		if code != 0 || errOut != "" || !strings.Contains(out, h.want) {
			t.Errorf("gateway %v: exit %d, stderr %q, stdout:\n%s\nwant exit 0, nothing on stderr, %q on stdout", h.args, code, errOut, out, h.want)
		}
	}
	if _, v1, _ := cliRun(t, nil, "", "version"); true {
		if _, v2, _ := cliRun(t, nil, "", "-version"); v1 != v2 || strings.Count(v1, "\n") != 1 {
			t.Errorf("version %q and -version %q differ or are not one line", v1, v2)
		}
	}

	long := strings.Repeat("x", 501)
	const secret = "svc_dsc_Qx7argvSecret0123456789abcdef"
	errs := []struct {
		args []string
		want string // in the one line
	}{
		{[]string{"-x"}, "gateway: unknown flag -x; see 'gateway help'\n"},
		{[]string{"keys", "add", "-x"}, "gateway: unknown flag -x; see 'gateway help keys'\n"},
		{[]string{"frobnicate"}, "see 'gateway help'"},
		{nil, "-config FILE is required"},
		{[]string{"help", "nope"}, `no help for "nope"`},
		{[]string{"help", "keys", "quota"}, "at most one command"},
		{[]string{"version", "now"}, "see 'gateway help version'"},
		{[]string{"keys"}, "see 'gateway help keys'"},
		{[]string{"keys", "frob"}, `unknown command "frob"`},
		{[]string{"quota"}, "see 'gateway help quota'"},
		{[]string{"usage"}, "see 'gateway help usage'"},
		{[]string{"usage", "frob"}, `unknown command "frob"`},
		{[]string{"quota", "override", "--limit", "l", "--id", "i", "--value", "1", "--ttl", "8x", "--reason", "r"}, `--ttl "8x"`},
		{[]string{"quota", "override", "--limit", "l", "--id", "i", "--value", "1", "--ttl", "0s", "--reason", "r"}, "--ttl: at least 1s"},
		{[]string{"quota", "override", "--limit", "l", "--id", "i", "--value", "1", "--ttl", "10000h", "--reason", "r"}, "--ttl: at most a year"},
		{[]string{"quota", "override", "--limit", "l", "--id", "i", "--value", "1", "--expires", "tomorrow", "--reason", "r"}, `--expires "tomorrow"`},
		{[]string{"quota", "override", "--limit", "l", "--id", "i", "--value", "1", "--expires", "2001-01-01T00:00:00Z", "--reason", "r"}, "in the future"},
		{[]string{"quota", "grant", "--limit", "l", "--id", "i", "--amount", "1", "--reason", "   "}, "not only spaces"},
		{[]string{"quota", "grant", "--limit", "l", "--id", "i", "--amount", "1", "--reason", long}, "at most 500 characters"},
		{[]string{"quota", "grant", "--limit", "l", "--id", "i", "--amount", "x", "--reason", "r"}, "-amount"},
		{[]string{"quota", "audit", "-n", "0"}, "-n must be 1 or more"},
		{[]string{"usage", "top", "-n", "0"}, "-n must be from 1 to 1000"},
		{[]string{"usage", "top", "-n", "1001"}, "-n must be from 1 to 1000"},
		{[]string{"usage", "top", "-admin", "ftp://x"}, "want http://host:port"},
		{[]string{"usage", "show"}, "give one of --org, --project, --ip or --key-stdin"},
		{[]string{"usage", "show", "--org", "a", "--project", "p"}, "give one of"},
		{[]string{"usage", "show", "--ip", "10.0.0"}, `--ip "10.0.0" is not an IP address`},
		{[]string{"usage", "show", secret}, "unexpected argument"},
		{[]string{"usage", "history", "--limit", "l"}, "--limit and --id are required"},
		{[]string{"keys", "revoke", "--key-stdin", "-config", "x.yaml", secret}, "no argument is taken"},
	}
	for _, e := range errs {
		code, out, errOut := cliRun(t, env, "", e.args...)
		if code != 2 || out != "" || !usageLine.MatchString(errOut) || !strings.Contains(errOut, e.want) {
			t.Errorf("gateway %v: exit %d, stdout %q, stderr %q\nwant exit 2 and one line naming %q and the help", e.args, code, out, errOut, e.want)
		}
		if strings.Contains(errOut, "Qx7argv") {
			t.Errorf("gateway %v repeated the key given on the command line: %q", e.args, errOut)
		}
	}
	if n := requests.Load(); n != 0 {
		t.Fatalf("usage errors sent %d requests to the admin API, want none", n)
	}
	// The same commands, well formed, do reach it: the count above could have moved.
	if code, _, errOut := cliRun(t, env, "", "usage", "top", "-n", "5"); code != 1 || errOut != "gateway: 500: Internal Server Error\n" || requests.Load() != 1 {
		t.Fatalf("usage top against a failing admin API: exit %d %q after %d requests, want exit 1, one line, one request", code, errOut, requests.Load())
	}
}

// keys revoke --key-stdin revokes a leaked key given on standard input, against a running
// gateway whose registry is a keys file, and refuses the key on the command line.
func TestKeysRevokeKeyStdinCLI(t *testing.T) {
	t.Parallel()
	const (
		leaked = "svc_Qx7stdinLeaked_0123456789abcdefgh"
		other  = "svc_Qx7stdinOther_0123456789abcdefghi"
		token  = "revoke-admin-token-0123456789"
	)
	up, _ := recordingUpstream(t)
	keysFile := filepath.Join(t.TempDir(), "keys.yaml")
	p := startGateway(t, up, fmt.Sprintf("admin_token: %q\nauth: {mode: registry, keys_file: %q, failure_limit: 0}\n", token, keysFile))
	cfg := p.cmd.Args[2]
	var outputs []string
	run := func(stdin string, args ...string) (int, string, string) {
		code, out, errOut := cliRun(t, nil, stdin, append([]string{"keys"}, args...)...)
		outputs = append(outputs, out, errOut)
		return code, out, errOut
	}
	for _, k := range []string{leaked, other} {
		if code, _, errOut := run(k+"\n", "add", "-config", cfg, "--kind", "admin", "--org", "acme", "--project", "p1"); code != 0 {
			t.Fatalf("add: exit %d %s", code, errOut)
		}
	}
	reload := func() {
		t.Helper()
		if a := adminCall(t, http.DefaultClient, "http://"+p.admin, "POST", "/reload", map[string]string{"Authorization": "Bearer " + token}, ""); a.status != 200 {
			t.Fatalf("reload: %d %s", a.status, a.body)
		}
	}
	reload()
	status := func(key string) int {
		return send(t, p, "POST", "/v2/agent/p1/job", key, `{"prompt":"x"}`).StatusCode
	}
	if a, b := status(leaked), status(other); a != 201 || b != 201 {
		t.Fatalf("registered keys: %d %d, want 201", a, b)
	}

	// Refused: the key on the command line (exit 2, before the store), an empty or malformed
	// stdin, a key that is not registered (exit 1).
	refusals := []struct {
		stdin string
		args  []string
		code  int
		want  string
	}{
		{"", []string{"revoke", "--key-stdin", "-config", cfg, leaked}, 2, "never the key"},
		{leaked + "\n", []string{"revoke", "--key-stdin", "-config", cfg, auth.Digest(leaked)}, 2, "no argument is taken"},
		{leaked + "\n", []string{"revoke", "--key-stdin"}, 2, "-config FILE is required"},
		{"", []string{"revoke", "--key-stdin", "-config", cfg}, 1, "no key on standard input"},
		{"pk_Qx7stdin\n", []string{"revoke", "--key-stdin", "-config", cfg}, 1, "neither key family"},
		{"svc_Qx7stdin with space\n", []string{"revoke", "--key-stdin", "-config", cfg}, 1, "malformed"},
		{"svc_Qx7stdinNobody_0123456789abcdefgh\n", []string{"revoke", "--key-stdin", "-config", cfg}, 1, "not registered"},
	}
	for _, r := range refusals {
		code, out, errOut := run(r.stdin, r.args...)
		if code != r.code || out != "" || !strings.Contains(errOut, r.want) {
			t.Errorf("keys %v < %q: exit %d, stdout %q, stderr %q; want exit %d naming %q", r.args, r.stdin, code, out, errOut, r.code, r.want)
		}
	}
	reload()
	if a, b := status(leaked), status(other); a != 201 || b != 201 {
		t.Fatalf("after the refusals: %d %d, want both keys still working", a, b)
	}

	code, out, errOut := run(leaked+"\n", "revoke", "-config", cfg, "--key-stdin")
	if code != 0 || out != "revoked "+auth.Digest(leaked)+"\n" {
		t.Fatalf("revoke --key-stdin: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	reload()
	if a, b := status(leaked), status(other); a != 401 || b != 201 {
		t.Fatalf("after revoke --key-stdin: leaked %d (want 401), other %d (want 201)", a, b)
	}
	// The list shows it revoked, by digest.
	_, list, _ := run("", "list", "-config", cfg, "-json")
	revoked := 0
	for _, line := range strings.Split(strings.TrimSpace(list), "\n") {
		var e auth.Entry
		if err := json.Unmarshal([]byte(line), &e); err != nil {
			t.Fatalf("list -json line %q: %v", line, err)
		}
		if !e.Active() {
			revoked++
			if e.Digest != auth.Digest(leaked) {
				t.Fatalf("revoked the wrong key: %+v", e)
			}
		}
	}
	if revoked != 1 {
		t.Fatalf("%d keys revoked, want 1:\n%s", revoked, list)
	}
	for _, o := range outputs {
		if strings.Contains(o, "Qx7stdin") {
			t.Fatalf("a key appeared in the output: %q", o)
		}
	}
}

// gateway usage top|show|history read a running gateway's admin API: tables by default, the
// API's JSON with -json, the API's error code on a refusal.
func TestUsageCLI(t *testing.T) {
	t.Parallel()
	awayFromHourEnd(t)
	const assistantKey = "svc_dsc_Qx7usageCLI_0123456789abcdef"
	up, _ := recordingUpstream(t)
	p := startGateway(t, up, quotaCfg)
	for range 2 {
		job(t, p, "p1")
	}
	job(t, p, "p2")
	for range 3 {
		if r := send(t, p, "POST", "/discovery/v1/assistant/acme/message", assistantKey, `{"fp":"anonymous","messages":[]}`); r.StatusCode >= 300 {
			t.Fatalf("assistant message: %d", r.StatusCode)
		}
	}
	env := []string{"GATEWAY_ADMIN_URL=http://" + p.admin, "GATEWAY_ADMIN_TOKEN=" + quotaToken}
	var outputs []string
	run := func(stdin string, args ...string) (int, string, string) {
		t.Helper()
		code, out, errOut := cliRun(t, env, stdin, append([]string{"usage"}, args...)...)
		outputs = append(outputs, out, errOut)
		return code, out, errOut
	}
	must := func(stdin string, args ...string) string {
		t.Helper()
		code, out, errOut := run(stdin, args...)
		if code != 0 || errOut != "" {
			t.Fatalf("gateway usage %v: exit %d\nstdout: %s\nstderr: %s", args, code, out, errOut)
		}
		return out
	}
	jsonOf := func(v any, stdin string, args ...string) {
		t.Helper()
		out := must(stdin, append(args, "-json")...)
		if err := json.Unmarshal([]byte(out), v); err != nil {
			t.Fatalf("gateway usage %v -json: %v\n%s", args, err, out)
		}
	}
	// A table row: its cells, split on runs of spaces.
	row := func(table, first string) []string {
		for _, line := range strings.Split(table, "\n") {
			if f := strings.Fields(line); len(f) > 0 && f[0] == first {
				return f
			}
		}
		t.Fatalf("no row %q in:\n%s", first, table)
		return nil
	}

	// top
	table := must("", "top", "--limit", "agent_job_per_project")
	if !strings.HasPrefix(table, "agent_job_per_project (requests per hour)\nID ") {
		t.Fatalf("top table:\n%s", table)
	}
	if r := row(table, "p1"); r[3] != "2" || r[5] != "3" || r[6] != "1" || r[7] != "66.7%" {
		t.Fatalf("top row of p1 %q, want used 2 of 3, 1 left, 66.7%%:\n%s", r, table)
	}
	if r := row(table, "p2"); r[3] != "1" {
		t.Fatalf("top row of p2 %q:\n%s", r, table)
	}
	var all struct {
		Limits []struct {
			Limit   string
			Tenants []struct {
				ID   string
				Used int64
			}
		}
	}
	jsonOf(&all, "", "top")
	found := map[string]int64{}
	for _, l := range all.Limits {
		for _, tn := range l.Tenants {
			found[l.Limit+"/"+tn.ID] = tn.Used
		}
	}
	if found["agent_job_per_project/p1"] != 2 || found["agent_job_per_project/p2"] != 1 || found["assistant_per_key/"+auth.Digest(assistantKey)] != 3 {
		t.Fatalf("top -json: %v\n%+v", found, all)
	}
	var one struct {
		Limit   string
		Tenants []struct {
			ID   string
			Used int64
		}
	}
	jsonOf(&one, "", "top", "--limit", "agent_job_per_project", "-n", "1")
	if one.Limit != "agent_job_per_project" || len(one.Tenants) != 1 || one.Tenants[0].ID != "p1" || one.Tenants[0].Used != 2 {
		t.Fatalf("top --limit -n 1 -json: %+v", one)
	}

	// show: a project, an IP, a key from stdin.
	table = must("", "show", "--project", "p1")
	if r := row(table, "agent_job_per_project"); r[2] != "2" || r[4] != "3" || r[5] != "1" {
		t.Fatalf("show --project p1 row %q:\n%s", r, table)
	}
	type shown struct {
		Limits []struct {
			Name string
			Used int64
		}
	}
	usedOf := func(s shown, name string) int64 {
		for _, l := range s.Limits {
			if l.Name == name {
				return l.Used
			}
		}
		t.Fatalf("no %s in %+v", name, s)
		return 0
	}
	var s shown
	jsonOf(&s, "", "show", "--project", "p2")
	if usedOf(s, "agent_job_per_project") != 1 {
		t.Fatalf("show --project p2 -json: %+v", s)
	}
	s = shown{}
	jsonOf(&s, "", "show", "--ip", "127.0.0.1")
	if usedOf(s, "assistant_per_ip") != 3 {
		t.Fatalf("show --ip -json: %+v", s)
	}
	s = shown{}
	jsonOf(&s, assistantKey+"\n", "show", "--key-stdin")
	if usedOf(s, "assistant_per_key") != 3 {
		t.Fatalf("show --key-stdin -json: %+v", s)
	}
	if r := row(must(assistantKey+"\n", "show", "--key-stdin"), "assistant_per_key"); r[2] != "3" {
		t.Fatalf("show --key-stdin row %q", r)
	}

	// history
	table = must("", "history", "--limit", "agent_job_per_project", "--id", "p1")
	lines := strings.Split(table, "\n")
	if len(lines) < 4 || lines[0] != "agent_job_per_project p1 (requests)" || lines[1] != "allowance now: 3 (limit 3)" || !strings.HasPrefix(lines[2], "START ") {
		t.Fatalf("history table:\n%s", table)
	}
	if f := strings.Fields(lines[3]); len(f) != 4 || f[2] != "2" || f[3] != "current" {
		t.Fatalf("history: the current window %q, want used 2:\n%s", f, table)
	}
	var h struct {
		Limit, ID string
		Windows   []struct {
			Start, End  time.Time
			Used, Limit int64
		}
	}
	jsonOf(&h, "", "history", "--limit", "agent_job_per_project", "--id", "p1")
	if h.ID != "p1" || len(h.Windows) == 0 || h.Windows[0].Used != 2 || !h.Windows[0].End.After(time.Now()) {
		t.Fatalf("history -json: %+v", h)
	}

	// Refusals of the API keep its code and exit 1.
	refusals := []struct {
		env  []string
		args []string
		code string
	}{
		{nil, []string{"top", "--limit", "nosuch"}, "unknown_limit"},
		{nil, []string{"history", "--limit", "nosuch", "--id", "p1"}, "unknown_limit"},
		{[]string{"GATEWAY_ADMIN_TOKEN=wrong-token"}, []string{"top"}, "invalid_credentials"},
	}
	for _, r := range refusals {
		code, out, errOut := cliRun(t, append(env, r.env...), "", append([]string{"usage"}, r.args...)...)
		if code != 1 || out != "" || !serverLine.MatchString(errOut) || !strings.HasPrefix(errOut, "gateway: "+r.code+": ") {
			t.Errorf("gateway usage %v: exit %d, stdout %q, stderr %q; want exit 1 and gateway: %s: ...", r.args, code, out, errOut, r.code)
		}
	}
	// quota -json parses too.
	code, out, errOut := cliRun(t, env, "", "quota", "overrides", "-json")
	var ov struct{ Overrides []json.RawMessage }
	if code != 0 || json.Unmarshal([]byte(out), &ov) != nil || ov.Overrides == nil {
		t.Fatalf("quota overrides -json: exit %d %q %q", code, out, errOut)
	}
	for _, o := range outputs {
		if strings.Contains(o, "Qx7usageCLI") {
			t.Fatalf("the key appeared in the output: %q", o)
		}
	}
}
