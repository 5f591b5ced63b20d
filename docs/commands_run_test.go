package docs

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docsgate/gateway/auth"
)

// notRun are the commands of the user pages that TestDocumentedCommands does not run, each
// with why. Every other command runs as printed (with the fills of docFills).
var notRun = map[string]string{
	"README.md: make demo":                 "this test does what make demo does: scripts/demo.sh --build and --write-config, then the simulator and the gateway (on free ports)",
	"docs/getting-started.md: make demo":   "as README.md's: this test is the demo",
	"README.md: make test":                 "the whole suite, this test among it",
	"docs/contributing.md: make test":      "the whole suite, this test among it",
	"docs/contributing.md: make flakehunt": "the timing-sensitive tests three times beside busy loops (25 minutes): a contributor's run, not the suite's",
	"README.md: key=$(printf %s \"${SECRET#whsec_}\" | base64 -d | xxd -p -c 256)":                                                                              "run by TestReadmeWebhookVerificationShell with the Standard Webhooks test vector",
	"README.md: { printf '%s.%s.' \"$ID\" \"$TS\"; cat body.json; } | openssl dgst -sha256 -mac HMAC -macopt \"hexkey:$key\" -binary | base64 | sed 's/^/v1,/'": "run by TestReadmeWebhookVerificationShell with the Standard Webhooks test vector",
	"docs/getting-started.md: go build -o bin/gateway ./cmd/gateway":                                                                                            "builds from the repository's sources into its bin/; this test's bin/gateway is make demo's build (scripts/build.sh)",
	"docs/getting-started.md: bin/gateway -config gateway.yaml":                                                                                                 "runs a gateway until stopped, on every interface's :8080; the demo this test runs is the same binary",
	"docs/getting-started.md: bin/gateway -config gateway.yaml -dev":                                                                                            "as the line before it, with other logs",
	"docs/contributing.md: gateway started":                                                                                                                     "a line of the gateway's log, not a command",
}

// docFills are the placeholders of the pages, filled as a reader fills them; the rest of
// each command runs as printed. The demo's addresses are free ports here (the suite runs
// beside other tests), so localhost:8080, 127.0.0.1:9090 and the quota example's
// 10.0.0.5:9090 name the test's demo.
type docFills struct {
	public, admin, token, secret, adminDigest, tenantDigest string
}

func (f docFills) apply(cmd string) string {
	r := strings.NewReplacer(
		"http://10.0.0.5:9090", "http://"+f.admin,
		"localhost:8080", f.public,
		"127.0.0.1:9090", f.admin,
		"GATEWAY_ADMIN_TOKEN=...", "GATEWAY_ADMIN_TOKEN="+f.token,
		"BILLING_WEBHOOK_SECRET=whsec_...", "BILLING_WEBHOOK_SECRET="+f.secret,
		"Bearer svc_...'", "Bearer svc_demo'",
		" DIGEST", " "+f.adminDigest, // the key admin-key.txt registered
		"3a68eb4a...", f.tenantDigest,
	)
	cmd = r.Replace(cmd)
	// A date the docs print would lapse: --expires gets one 30 days ahead.
	return expires.ReplaceAllString(cmd, "--expires "+time.Now().Add(30*24*time.Hour).UTC().Format(time.RFC3339))
}

var expires = regexp.MustCompile(`--expires \S+`)

// outcome is what a command must do: exit with code, and print want on standard output and
// wantErr on standard error (substrings; "" for anything).
type outcome struct {
	code          int
	want, wantErr string
}

// expected are the outcomes worth more than an exit status of 0 (every curl is also checked
// to have got no error answer).
func expected(head string) map[string]outcome {
	return map[string]outcome{
		"README.md: curl -i -X POST localhost:8080/v2/agent/my-project/job -H 'Authorization: Bearer svc_demo' -H 'Content-Type: application/json' -d '{\"prompt\":\"Document the rate limits\"}'": {want: "HTTP/1.1 201"},
		"README.md: bin/gateway usage top":                                                          {want: "agent_job_per_project (requests per hour)"},
		"README.md: bin/gateway keys list -config bin/demo.yaml":                                    {want: "domains=acme-docs"},
		"README.md: gateway -config gateway.yaml -check-config":                                     {want: "is valid"},
		"docs/getting-started.md: bin/gateway -config gateway.yaml -check-config":                   {want: "gateway.yaml is valid, with 1 warning", wantErr: "redis.addrs is empty"},
		"docs/getting-started.md: bin/gateway -config gateway.yaml -check-config -strict":           {code: 2, wantErr: "-strict fails on warnings"},
		"docs/getting-started.md: bin/gateway version":                                              {want: "commit " + head},
		"docs/operations.md: gateway keys list -config gateway.yaml":                                {want: "docs site"},
		"docs/operations.md: gateway keys revoke -config gateway.yaml DIGEST":                       {want: "revoked "},
		"docs/operations.md: gateway quota audit -n 20":                                             {want: "override"},
		"docs/reference/cli.md: gateway notifications test -config gateway.yaml --endpoint billing": {want: "billing answered 204"},
		"docs/notifications.md: gateway notifications test -config gateway.yaml --endpoint billing": {want: "billing answered 204"},
		"docs/streaming.md: node aisdk-clients/v2-chat.mjs ai5 http://localhost:8080/discovery/v2/assistant/acme-docs/message svc_dsc_demo anonymous \"How do I start?\" \"And then?\"": {want: `"status":200`},
	}
}

// pageEnv is what a page says its reader has set before its commands.
var pageEnv = map[string][]string{
	// "behind the admin token like the other reads", with the token in GATEWAY_ADMIN_TOKEN.
	"docs/reference/admin-api.md": {"GATEWAY_ADMIN_TOKEN"},
}

// needsNode are commands that run the AI SDK clients of aisdk-clients/.
func needsNode(cmd string) bool { return strings.HasPrefix(cmd, "node aisdk-clients/") }

// Every command of the README and docs/ runs as printed, against the demo, or the test says
// why not (notRun). The demo is what make demo runs (scripts/demo.sh's build and config, the
// simulator, the gateway) with a webhook endpoint (the pages on notifications need one); each
// page runs in a directory of its own holding what the page assumes: bin/ (the demo's
// binaries and config; gateway on the PATH), config.example.yaml, gateway.yaml (the demo's
// config in auth.mode registry, the mode the pages on keys are about), key.txt and
// admin-key.txt (keys), and the AI SDK clients; each block that reads leaked-key.txt finds a
// registered key there of its own (a revocation's example and a rotation's both act on one). A page's commands run in order in one shell (its exports hold for the
// commands after them), with GATEWAY_ADMIN_URL naming the demo's admin listener (a free port
// here, 127.0.0.1:9090 in make demo: the CLI's default). Inline commands that are synopses (gateway -config FILE) or names
// (gateway quota audit) are checked against the binary's help: the command exists and takes
// every flag named.
func TestDocumentedCommands(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	d := startDemo(t)
	head := ""
	if out, err := exec.Command("git", "-C", root, "rev-parse", "HEAD").Output(); err == nil {
		head = strings.TrimSpace(string(out))
	} else {
		t.Logf("no git checkout: the version's commit is not checked (%v)", err)
	}
	expect := expected(head)
	found := map[string]bool{}
	ran, checked, skipped := 0, 0, 0
	for _, page := range userPages(t) {
		var run []docCommand
		for _, c := range pageCommands(t, page) {
			found[c.key()] = true
			switch reason, no := notRun[c.key()]; {
			case no:
				skipped++
				t.Logf("not run: %s:%d: %s: %s", c.file, c.line, c.text, reason)
			case c.inline && (synopsis(c.text) || !strings.Contains(c.text, " -")):
				checked++
				d.checkSynopsis(t, c)
			case needsNode(c.text) && !d.node:
				skipped++
				if os.Getenv("CI") == "true" {
					t.Errorf("%s:%d: %s: node or aisdk-clients/node_modules missing (scripts/test-deps.sh installs them)", c.file, c.line, c.text)
				}
				t.Logf("not run: %s:%d: %s: node or aisdk-clients/node_modules missing", c.file, c.line, c.text)
			default:
				run = append(run, c)
			}
		}
		ran += len(run)
		d.runPage(t, page, run, expect)
	}
	for k := range notRun {
		if !found[k] {
			t.Errorf("notRun names %q, which no page prints any more", k)
		}
	}
	for k := range expect {
		if !found[k] {
			t.Errorf("expected names %q, which no page prints any more", k)
		}
	}
	t.Logf("%d commands run, %d checked against the help, %d not run", ran, checked, skipped)
	if ran < 30 {
		t.Errorf("only %d commands ran: the extraction is broken", ran)
	}
}

// demo is the running demo and what the pages' directories are made of.
type demo struct {
	repo, bin string // the repository, the demo's bin/
	fills     docFills
	node      bool // the AI SDK clients can run
	keys      map[string]string
	help      map[string]string // gateway <words> -h, by words
}

// startDemo builds and starts the demo on free loopback ports, stopped at cleanup.
func startDemo(t *testing.T) *demo {
	t.Helper()
	repo, err := filepath.Abs(root)
	if err != nil {
		t.Fatal(err)
	}
	d := &demo{repo: repo, bin: filepath.Join(t.TempDir(), "bin"), help: map[string]string{}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for _, args := range [][]string{{"--build", d.bin}, {"--write-config", filepath.Join(d.bin, "demo.yaml")}} {
		cmd := exec.CommandContext(ctx, "bash", append([]string{filepath.Join(repo, "scripts", "demo.sh")}, args...)...)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("scripts/demo.sh %v: %v\n%s", args, err, out)
		}
	}
	_, err = os.Stat(filepath.Join(repo, "aisdk-clients", "node_modules", "ai5", "package.json"))
	_, nodeErr := exec.LookPath("node")
	d.node = err == nil && nodeErr == nil

	// The webhook endpoint of the notification pages: a receiver on loopback, its secret in a file.
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(recv.Close)
	d.fills.secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	secretFile := filepath.Join(d.bin, "billing.secret")
	if err := os.WriteFile(secretFile, []byte(d.fills.secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	sim := d.start(t, "upstream-sim", func(addrs []string) []string {
		return []string{"-listen", addrs[0], "-job-complete-after", "10s"}
	}, 1, "")
	cfgPath := filepath.Join(d.bin, "demo.yaml")
	base, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	addrs := d.startGateway(t, string(base), sim, recv.URL, secretFile)
	d.fills.public, d.fills.admin = addrs[0], addrs[1]
	d.fills.token = regexp.MustCompile(`(?m)^admin_token: "([^"]+)"$`).FindStringSubmatch(string(base))[1]
	d.fills.tenantDigest = auth.Digest("svc_dsc_demo")
	// The pages' keys, made by the binary.
	d.keys = map[string]string{}
	for file, kind := range map[string]string{"key.txt": "assistant", "admin-key.txt": "admin"} {
		out, err := exec.Command(filepath.Join(d.bin, "gateway"), "keys", "generate", "--kind", kind).Output()
		if err != nil {
			t.Fatal(err)
		}
		d.keys[file] = strings.TrimSpace(string(out))
	}
	d.fills.adminDigest = auth.Digest(d.keys["admin-key.txt"])
	return d
}

// startGateway writes the demo's config with free ports, the simulator as upstream and the
// webhook endpoint, and starts bin/gateway on it as make demo does; it returns the public and
// admin addresses. A port another process took meanwhile starts it again on others.
func (d *demo) startGateway(t *testing.T, base, sim, recv, secretFile string) []string {
	t.Helper()
	for attempt := 1; ; attempt++ {
		var addrs []string
		cfg := func(a []string) string {
			addrs = a
			r := strings.NewReplacer(`listen: "127.0.0.1:8080"`, fmt.Sprintf("listen: %q", a[0]),
				`admin_listen: "127.0.0.1:9090"`, fmt.Sprintf("admin_listen: %q", a[1]),
				`url: "http://127.0.0.1:9000"`, fmt.Sprintf("url: %q", sim))
			return r.Replace(base) + fmt.Sprintf("\n# The pages on notifications need an endpoint.\nnotifications:\n  webhooks:\n"+
				"    - {name: billing, url: %q, secret_file: %q, allow_private_addresses: true}\n", recv+"/hooks", secretFile)
		}
		out := d.startProc(t, "gateway", func(a []string) []string {
			if err := os.WriteFile(filepath.Join(d.bin, "demo.yaml"), []byte(cfg(a)), 0o600); err != nil {
				t.Fatal(err)
			}
			return []string{"-config", filepath.Join(d.bin, "demo.yaml")}
		}, 2, "gateway started")
		if out != "" {
			return addrs
		}
		if attempt == 5 {
			t.Fatal("the demo's gateway did not start: its ports were taken five times")
		}
	}
}

// start starts bin/NAME with the arguments args makes of n free addresses, waits for ready
// in its output ("" for an answer on the first address) and returns the first address's URL.
func (d *demo) start(t *testing.T, name string, args func([]string) []string, n int, ready string) string {
	t.Helper()
	for range 5 {
		var addrs []string
		if d.startProc(t, name, func(a []string) []string { addrs = a; return args(a) }, n, ready) != "" {
			return "http://" + addrs[0]
		}
	}
	t.Fatalf("%s did not start: its port was taken five times", name)
	return ""
}

// startProc starts one process on n free addresses; it returns its output once ready, or ""
// when it exited because a port was taken.
func (d *demo) startProc(t *testing.T, name string, args func([]string) []string, n int, ready string) string {
	t.Helper()
	var addrs []string
	var lns []net.Listener
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		addrs = append(addrs, ln.Addr().String())
	}
	for _, ln := range lns {
		ln.Close()
	}
	cmd := exec.Command(filepath.Join(d.bin, name), args(addrs)...)
	var out syncBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
		if t.Failed() {
			t.Logf("%s output:\n%s", name, out.String())
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		up := false
		if ready != "" {
			up = strings.Contains(out.String(), ready)
		} else if res, err := http.Get("http://" + addrs[0] + "/healthz"); err == nil {
			res.Body.Close()
			up = true
		}
		if up {
			return out.String()
		}
		select {
		case <-done:
			if strings.Contains(out.String(), "address already in use") {
				return ""
			}
			t.Fatalf("%s exited:\n%s", name, out.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not up:\n%s", name, out.String())
		}
	}
}

// syncBuffer is a process's output, written by its copier and read by the test.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// pageDir is a directory holding what a page assumes (see TestDocumentedCommands).
func (d *demo) pageDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for name, target := range map[string]string{"bin": d.bin, "aisdk-clients": filepath.Join(d.repo, "aisdk-clients")} {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string]string{}
	for src, dst := range map[string]string{filepath.Join(d.repo, "config.example.yaml"): "config.example.yaml", filepath.Join(d.bin, "demo.yaml"): "gateway.yaml"} {
		data, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		files[dst] = string(data)
	}
	registry := strings.Replace(files["gateway.yaml"], "\n  mode: prefix\n", "\n  mode: registry\n", 1)
	if registry == files["gateway.yaml"] {
		t.Fatal("the demo's config has no auth.mode prefix line to turn into registry")
	}
	files["gateway.yaml"] = registry
	for f, k := range d.keys {
		files[f] = k + "\n"
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// runPage runs a page's commands in order in one shell, in a directory of its own, and checks
// each one's outcome.
func (d *demo) runPage(t *testing.T, page string, cmds []docCommand, expect map[string]outcome) {
	t.Helper()
	if len(cmds) == 0 {
		return
	}
	dir, out := d.pageDir(t), t.TempDir()
	leaked := map[int]bool{} // the blocks that read leaked-key.txt
	for _, c := range cmds {
		leaked[c.block] = leaked[c.block] || c.block >= 0 && strings.Contains(c.text, "leaked-key.txt")
	}
	var script strings.Builder
	for i, c := range cmds {
		if leaked[c.block] && (i == 0 || cmds[i-1].block != c.block) {
			fmt.Fprintf(&script, "gateway keys generate --kind assistant --add -config %s/demo.yaml --org acme --domain acme-docs >leaked-key.txt 2>/dev/null || exit 1\n", d.bin)
		}
		// Each command's own redirections (> key.txt, < key.txt) apply inside the braces.
		fmt.Fprintf(&script, "{\n%s\n} >%s/%d.out 2>%s/%d.err </dev/null; echo $? >%s/%d.rc\n", d.fills.apply(c.text), out, i, out, i, out, i)
	}
	env := []string{"PATH=" + d.bin + string(os.PathListSeparator) + os.Getenv("PATH"), "HOME=" + dir,
		"GATEWAY_ADMIN_URL=http://" + d.fills.admin, "GORACE=atexit_sleep_ms=0", "NO_COLOR=1"}
	for _, k := range pageEnv[page] {
		if k == "GATEWAY_ADMIN_TOKEN" {
			env = append(env, k+"="+d.fills.token)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	sh := exec.CommandContext(ctx, "bash", "-c", script.String())
	sh.Dir, sh.Env = dir, env
	if b, err := sh.CombinedOutput(); err != nil {
		t.Fatalf("%s: the page's script: %v\n%s", page, err, b)
	}
	for i, c := range cmds {
		read := func(ext string) string {
			b, _ := os.ReadFile(fmt.Sprintf("%s/%d.%s", out, i, ext))
			return string(b)
		}
		rc, stdout, stderr := strings.TrimSpace(read("rc")), read("out"), read("err")
		want := expect[c.key()]
		var why []string
		if rc != fmt.Sprint(want.code) {
			why = append(why, "exit "+rc+", want "+fmt.Sprint(want.code))
		}
		if !strings.Contains(stdout, want.want) {
			why = append(why, fmt.Sprintf("no %q on standard output", want.want))
		}
		if !strings.Contains(stderr, want.wantErr) {
			why = append(why, fmt.Sprintf("no %q on standard error", want.wantErr))
		}
		if strings.HasPrefix(c.text, "curl ") && errorAnswer(stdout, dir, c.text) {
			why = append(why, "an error answer")
		}
		if len(why) > 0 {
			t.Errorf("%s:%d: %s\n  ran: %s\n  %s\n  stdout: %s\n  stderr: %s", c.file, c.line, c.text, d.fills.apply(c.text), strings.Join(why, "; "), clip(stdout), clip(stderr))
		}
	}
}

// errorAnswer says whether a curl got the gateway's {"error", "code"} answer, on standard
// output or in the file its -o names.
func errorAnswer(stdout, dir, cmd string) bool {
	body := stdout
	if m := regexp.MustCompile(`-o (\S+)`).FindStringSubmatch(cmd); m != nil {
		b, _ := os.ReadFile(filepath.Join(dir, m[1]))
		body = string(b)
	}
	if i := strings.Index(body, "\r\n\r\n"); i >= 0 && strings.HasPrefix(body, "HTTP/") {
		if !regexp.MustCompile(`^HTTP/\S+ [23]`).MatchString(body) {
			return true
		}
		body = body[i+4:]
	}
	var e struct{ Error, Code string }
	return json.Unmarshal([]byte(body), &e) == nil && e.Error != "" && e.Code != ""
}

func clip(s string) string {
	if len(s) > 2000 {
		return s[:2000] + "..."
	}
	return s
}

// checkSynopsis checks an inline command that is not run against the binary's help: its
// command (each of a|b) exists, and takes every flag it names.
func (d *demo) checkSynopsis(t *testing.T, c docCommand) {
	t.Helper()
	words := commandWords(c.text)
	if len(words) == 0 || strings.TrimPrefix(words[0], "bin/") != "gateway" {
		t.Errorf("%s:%d: %q: not a gateway command", c.file, c.line, c.text)
		return
	}
	sub := words[1:] // the command's path after gateway; its last word may be a|b
	paths := [][]string{nil}
	if len(sub) > 0 {
		paths = nil
		for _, alt := range strings.Split(sub[len(sub)-1], "|") {
			paths = append(paths, append(slices.Clone(sub[:len(sub)-1]), alt))
		}
	}
	for _, path := range paths {
		help := d.helpOf(t, c, path)
		for _, f := range flagsOf(c.text) {
			if f == "-h" || f == "--help" {
				continue
			}
			if !regexp.MustCompile(`(^|[\s\[(])-?` + regexp.QuoteMeta(f) + `\b`).MatchString(help) {
				t.Errorf("%s:%d: %q: gateway %s takes no %s (its help says nothing of it)", c.file, c.line, c.text, strings.Join(path, " "), f)
			}
		}
	}
}

// helpOf is `gateway WORDS... -h`, which must exit 0 (help topics: `gateway help WORD`).
func (d *demo) helpOf(t *testing.T, c docCommand, words []string) string {
	t.Helper()
	key := strings.Join(words, " ")
	if h, ok := d.help[key]; ok {
		return h
	}
	args := append(append([]string{}, words...), "-h")
	if len(words) > 0 && words[0] == "help" {
		args = words
	}
	out, err := exec.Command(filepath.Join(d.bin, "gateway"), args...).CombinedOutput()
	if err != nil {
		t.Errorf("%s:%d: %q: gateway %s: %v\n%s", c.file, c.line, c.text, strings.Join(args, " "), err, out)
	}
	d.help[key] = string(out)
	return string(out)
}
