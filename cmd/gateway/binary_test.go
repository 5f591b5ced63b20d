package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// These tests meet the gateway as an operator does: the built binary, a config file, HTTP.

var gatewayBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "gateway-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	gatewayBin = filepath.Join(dir, "gateway")
	build := exec.Command("go", "build", "-race", "-ldflags", "-X main.version=v0.0.0-test", "-o", gatewayBin, ".")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building gateway:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func freeAddr(t *testing.T) string {
	t.Helper()
	return freeAddrs(t, 1)[0]
}

// handedOut holds every address freeAddrs gave out in this test process. The kernel may give a
// closed listener's port again at once: a test whose own two addresses came out the same (a
// gateway's listen and its rate limit service's) failed its config check. Process-wide, as
// the ports are.
var handedOut sync.Map

// deadAddr is a loopback address that refuses connections until the test ends: its port is
// bound but never listened on, so no other test's server can take it meanwhile (a port from
// freeAddr is free again at once, and the parallel tests start servers all the time).
func deadAddr(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
}

// serveHTTP serves h on a free loopback port until the test ends and returns its URL.
func serveHTTP(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := &http.Server{Handler: h}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "gateway.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// proc is a started gateway process, stopped by PID at cleanup.
type proc struct {
	cmd    *exec.Cmd
	out    *syncBuffer
	public string
	admin  string
	done   chan error
}

type syncBuffer struct {
	mu  chan struct{}
	buf bytes.Buffer
}

func newSyncBuffer() *syncBuffer { return &syncBuffer{mu: make(chan struct{}, 1)} }

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu <- struct{}{}
	defer func() { <-b.mu }()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu <- struct{}{}
	defer func() { <-b.mu }()
	return b.buf.String()
}

func startGateway(t *testing.T, upstreamURL, extra string, args ...string) *proc {
	t.Helper()
	return startGatewayRaw(t, fmt.Sprintf("upstream:\n  url: %q\n%s", upstreamURL, extra), args...)
}

// startGatewayRaw starts the binary with body as the whole config but listen and
// admin_listen, which it adds on free ports, and waits until it is up.
func startGatewayRaw(t *testing.T, body string, args ...string) *proc {
	t.Helper()
	return startGatewayWith(t, startOpts{}, body, args...)
}

// startOpts vary how startGatewayWith starts the binary.
type startOpts struct {
	// adminHost is admin_listen's host ("" for 127.0.0.1); the test reaches the admin
	// listener on 127.0.0.1 either way.
	adminHost string
	// adminCAs, when set, says the admin listener serves HTTPS with a certificate they trust.
	adminCAs *x509.CertPool
}

// adminClient reaches the admin listener of a gateway started with o.
func (o startOpts) adminClient() *http.Client {
	if o.adminCAs == nil {
		return http.DefaultClient
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: o.adminCAs}}}
}

// freeAddrs returns n loopback addresses that were free a moment ago and that no earlier call
// in this process gave out: all n are listened on at once, so that no two are the same port.
func freeAddrs(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	for tries := 0; len(out) < n; tries++ {
		if tries == 100*n {
			t.Fatalf("no free loopback port that was not handed out before in %d tries", tries)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		if _, before := handedOut.LoadOrStore(ln.Addr().String(), true); !before {
			out = append(out, ln.Addr().String())
		}
	}
	return out
}

// startGatewayWith starts the binary on free ports. Another process (tests run in parallel)
// can take a port between freeAddrs and the gateway's bind: then the gateway exits at once
// saying so, and it is started again on other ports, up to five times.
func startGatewayWith(t *testing.T, o startOpts, body string, args ...string) *proc {
	t.Helper()
	for attempt := 1; ; attempt++ {
		p, portTaken := tryStartGateway(t, o, body, args...)
		if !portTaken {
			return p
		}
		if attempt == 5 {
			t.Fatalf("gateway not up: its ports were taken five times:\n%s", p.out.String())
		}
	}
}

func tryStartGateway(t *testing.T, o startOpts, body string, args ...string) (*proc, bool) {
	t.Helper()
	addrs := freeAddrs(t, 2)
	p := &proc{public: addrs[0], admin: addrs[1], out: newSyncBuffer(), done: make(chan error, 1)}
	adminListen := p.admin
	if o.adminHost != "" {
		_, port, _ := net.SplitHostPort(p.admin)
		adminListen = net.JoinHostPort(o.adminHost, port)
	}
	scheme := "http://"
	if o.adminCAs != nil {
		scheme = "https://"
	}
	cfg := fmt.Sprintf("listen: %q\nadmin_listen: %q\n%s", p.public, adminListen, body)
	p.cmd = exec.Command(gatewayBin, append([]string{"-config", writeConfig(t, cfg)}, args...)...)
	p.cmd.Stdout = p.out
	p.cmd.Stderr = p.out
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
		<-p.done
		if t.Failed() {
			t.Logf("gateway output:\n%s", p.out.String())
		}
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		// Alive is enough: some tests start a gateway whose Redis is down on purpose, and
		// /readyz rightly says 503 then. "gateway started" in its own output says this
		// process holds both ports: the 200 alone could come from another test's server
		// that took the admin port while this binary was still starting.
		res, err := o.adminClient().Get(scheme + p.admin + "/healthz")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == 200 && strings.Contains(p.out.String(), "gateway started") {
				return p, false
			}
		}
		select {
		case exit := <-p.done:
			p.done <- exit // for the cleanup's receive
			if strings.Contains(p.out.String(), "address already in use") {
				return p, true
			}
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("gateway not up: %v\n%s", err, p.out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop kills the gateway (SIGKILL, by PID) and waits for it, before the test ends.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Kill()
	p.wait(t, 10*time.Second)
}

// wait returns the exit code, failing the test if the process does not exit in time.
func (p *proc) wait(t *testing.T, within time.Duration) int {
	t.Helper()
	select {
	case err := <-p.done:
		p.done <- err // let the cleanup's receive return
		if err == nil {
			return 0
		}
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		}
		t.Fatal(err)
	case <-time.After(within):
		t.Fatal("gateway did not exit in time")
	}
	return -1
}

func TestVersionFlag(t *testing.T) {
	t.Parallel()
	out, err := exec.Command(gatewayBin, "-version").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), "gateway v0.0.0-test") {
		t.Fatalf("-version: %v %q", err, out)
	}
}

func TestBadConfigFailsAtStart(t *testing.T) {
	t.Parallel()
	cases := []struct{ cfg, want string }{
		{"upstream: {url: 'http://127.0.0.1:1'}\nlisen: ':1'\n", "lisen: unknown key"},
		{"upstream: {url: 'nope://x'}\n", "upstream.url:"},
		{"upstream: {url: 'http://127.0.0.1:1', timeout: forever}\n", "upstream.timeout:"},
		{"upstream: {url: 'http://127.0.0.1:1'}\nmax_body_bytes: -5\n", "max_body_bytes:"},
		{"upstream: {url: 'http://127.0.0.1:1'}\nroutes: [{name: agent_job, path: /other}]\n", "routes[0].path:"},
		{"upstream: {url: 'http://127.0.0.1:1'}\nroutes: [{name: dup, method: POST, path: '/v2/agent/{p}/job', key: admin}]\n", "routes[0].path:"},
		// Typos inside maps of names, which once passed silently.
		{"upstream: {url: 'http://127.0.0.1:1'}\nlimits: {assistant_per_org: {limt: 5}}\n", "limits.assistant_per_org.limt: unknown key (line 2)"},
		{"upstream: {url: 'http://127.0.0.1:1'}\nlimits: {assistant_per_org: {windw: hour}}\n", "limits.assistant_per_org.windw: unknown key (line 2)"},
		{"upstream: {url: 'http://127.0.0.1:1'}\nplans: {gold: {assistant_per_org: {limt: 5}}}\n", "plans.gold.assistant_per_org.limt: unknown key (line 2)"},
		{"upstream: {url: 'http://127.0.0.1:1'}\norgs: {acme: {domians: [a]}}\n", "orgs.acme.domians: unknown key (line 2)"},
	}
	for _, c := range cases {
		for _, flagName := range []string{"-config", "--config"} {
			cmd := exec.Command(gatewayBin, flagName, writeConfig(t, c.cfg))
			out, err := cmd.CombinedOutput()
			ee, ok := err.(*exec.ExitError)
			if !ok || ee.ExitCode() == 0 {
				t.Fatalf("%q: exit %v, want non-zero (%s)", c.cfg, err, out)
			}
			line := strings.TrimSuffix(string(out), "\n")
			if strings.Contains(line, "\n") || !strings.Contains(line, c.want) {
				t.Errorf("%q: output %q, want one line naming %q", c.cfg, out, c.want)
			}
		}
		// -check-config refuses them too, with the config exit code.
		cmd := exec.Command(gatewayBin, "-check-config", "-config", writeConfig(t, c.cfg))
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), c.want) {
			t.Errorf("-check-config %q: %v %s, want exit 2 naming %q", c.cfg, err, out, c.want)
		}
	}
}

func TestGatewayEndToEnd(t *testing.T) {
	t.Parallel()
	var seen []string
	up := http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		seen = append(seen, r.Method+" "+r.URL.Path+" "+string(body))
		if strings.HasPrefix(r.URL.Path, "/discovery/") {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			for i := range 3 {
				fmt.Fprintf(w, "0:\"part %d\"\n", i)
				http.NewResponseController(w).Flush()
				time.Sleep(50 * time.Millisecond)
			}
			fmt.Fprint(w, "d:{\"finishReason\":\"stop\"}\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(201)
		fmt.Fprint(w, `{"id":"j1","status":"active"}`)
	})}
	upAddr := freeAddr(t)
	ln, err := net.Listen("tcp", upAddr)
	if err != nil {
		t.Fatal(err)
	}
	go up.Serve(ln)
	defer up.Close()

	p := startGateway(t, "http://"+upAddr, "")
	post := func(path, key, body string) (*http.Response, error) {
		req, _ := http.NewRequest("POST", "http://"+p.public+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		return http.DefaultClient.Do(req)
	}

	res, err := post("/v2/agent/p1/job", "svc_e2e", `{"prompt":"hi"}`)
	if err != nil || res.StatusCode != 201 {
		t.Fatalf("agent_job: %v %v", err, res)
	}
	res.Body.Close()
	res, _ = post("/v2/agent/p1/job", "svc_dsc_e2e", `{"prompt":"hi"}`)
	if res.StatusCode != 403 {
		t.Fatalf("wrong key type: %d", res.StatusCode)
	}
	res.Body.Close()

	start := time.Now()
	res, err = post("/discovery/v1/assistant/acme/message", "svc_dsc_e2e", `{"fp":"anonymous","messages":[]}`)
	if err != nil || res.StatusCode != 200 {
		t.Fatalf("assistant: %v %v", err, res)
	}
	br := bufio.NewReader(res.Body)
	first, _ := br.ReadString('\n')
	firstAt := time.Since(start)
	rest, _ := io.ReadAll(br)
	res.Body.Close()
	total := time.Since(start)
	if first != "0:\"part 0\"\n" || !strings.HasSuffix(string(rest), "d:{\"finishReason\":\"stop\"}\n") {
		t.Fatalf("stream: %q + %q", first, rest)
	}
	// The upstream sleeps 150 ms in all after the first part: a buffered gateway would hand
	// the first part over only at the end.
	if total-firstAt < 100*time.Millisecond {
		t.Fatalf("first part after %v of %v: stream was buffered", firstAt, total)
	}

	// Operator endpoints live on the admin listener only.
	for _, path := range []string{"/metrics", "/healthz", "/readyz"} {
		r, err := http.Get("http://" + p.public + path)
		if err != nil || r.StatusCode != 404 {
			t.Fatalf("public %s: %v %v", path, err, r)
		}
		r.Body.Close()
	}
	r, err := http.Get("http://" + p.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	metrics, _ := io.ReadAll(r.Body)
	r.Body.Close()
	for _, want := range []string{
		`gateway_requests_total{code="201",route="agent_job"} 1`,
		`gateway_requests_total{code="403",route="agent_job"} 1`,
		`gateway_requests_total{code="200",route="assistant_message"} 1`,
		`gateway_auth_rejections_total{reason="wrong_key_type",route="agent_job"} 1`,
		"go_goroutines", "process_resident_memory_bytes",
	} {
		if !strings.Contains(string(metrics), want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if len(seen) != 2 {
		t.Fatalf("upstream saw %d requests, want 2: %q", len(seen), seen)
	}
	// One JSON access-log line per request, never the key.
	out := p.out.String()
	// Request ids are random hex, and one in a few dozen runs holds "e2e": they are left out.
	if strings.Contains(regexp.MustCompile(`"request_id":"[0-9a-f]*"`).ReplaceAllString(out, ""), "e2e") {
		t.Fatal("a key appeared in the logs")
	}
	n := 0
	for _, line := range strings.Split(out, "\n") {
		var entry map[string]any
		if json.Unmarshal([]byte(line), &entry) == nil && entry["msg"] == "request" {
			n++
		}
	}
	if n != 6 {
		t.Fatalf("%d access-log lines, want 6:\n%s", n, out)
	}
}
