// Command flood measures what a spray of invented assistant keys costs a gateway in registry
// mode, and what a legitimate tenant sees meanwhile (bench/README.md, "Invented-key flood").
//
// It starts a redis-server and one gateway replica (the binary given by -gateway, built
// without the race detector), registers one legitimate key, and runs three scenarios, each on
// a fresh gateway:
//
//   - alone: the legitimate tenant alone, for reference;
//   - flood: -keys random svc_dsc_ keys from -ips client addresses (X-Forwarded-For from a
//     trusted proxy, 127.0.0.1), -conc senders, auth.failure_limit at its default (30), while
//     the legitimate tenant keeps sending from its own address;
//   - flood, failure_limit 0: the same with the budget off, which is what every invented key
//     cost before it.
//
// Redis commands are counted with MONITOR (every command the server ran, by name, the
// legitimate key's own GETs apart) and checked against INFO commandstats. Every process it
// starts is stopped by PID.
//
//	go build -o /tmp/gateway ./cmd/gateway && (cd bench && go run ./cmd/flood -gateway /tmp/gateway)
package main

import (
	"bufio"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/docsgate/gateway/bench/internal/child"
	"github.com/docsgate/gateway/bench/internal/floodkit"
	"github.com/docsgate/gateway/bench/internal/resp"
)

type options struct {
	gateway, redisServer string
	keys, ips, conc      int
	legitConc            int
	legitGap, alone      time.Duration
}

func main() {
	var o options
	flag.StringVar(&o.gateway, "gateway", "", "gateway binary (required; build it without -race)")
	flag.StringVar(&o.redisServer, "redis-server", "redis-server", "redis-server binary")
	flag.IntVar(&o.keys, "keys", 10000, "invented keys in the flood")
	flag.IntVar(&o.ips, "ips", 100, "client addresses the flood comes from")
	flag.IntVar(&o.conc, "conc", 20, "concurrent flood senders")
	flag.IntVar(&o.legitConc, "legit-conc", 4, "concurrent senders of the legitimate tenant")
	flag.DurationVar(&o.legitGap, "legit-gap", 5*time.Millisecond, "pause between the legitimate tenant's requests")
	flag.DurationVar(&o.alone, "alone", 5*time.Second, "how long the legitimate tenant runs alone")
	flag.Parse()
	if o.gateway == "" {
		fmt.Fprintln(os.Stderr, "flood: -gateway is required")
		os.Exit(2)
	}
	procs := &child.Group{}
	if err := run(o, procs); err != nil {
		procs.StopAll()
		fmt.Fprintln(os.Stderr, "flood:", err)
		os.Exit(1)
	}
}

const legitKey = "svc_dsc_legitimatetenant0001legitimate"

func run(o options, procs *child.Group) error {
	dir, err := os.MkdirTemp("", "flood-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	defer procs.StopAll()

	redisAddr := fmt.Sprintf("127.0.0.1:%d", child.FreePort())
	_, port, _ := net.SplitHostPort(redisAddr)
	if _, err := procs.Start("redis-server", "", nil, filepath.Join(dir, "redis.log"), o.redisServer, "--port", port, "--bind", "127.0.0.1",
		"--dir", dir, "--save", "", "--appendonly", "no", "--protected-mode", "no"); err != nil {
		return err
	}
	if err := resp.WaitReady(redisAddr, 10*time.Second); err != nil {
		return err
	}
	up, err := floodkit.Upstream()
	if err != nil {
		return err
	}

	// The key goes in through the gateway's own CLI, as an operator would add it.
	cfg0, err := writeConfig(dir, "keys.yaml", 0, 0, up, redisAddr, 30)
	if err != nil {
		return err
	}
	add := exec.Command(o.gateway, "keys", "add", "-config", cfg0, "--kind", "assistant", "--org", "acme", "--domain", "acme-docs")
	add.Stdin = strings.NewReader(legitKey + "\n")
	if out, err := add.CombinedOutput(); err != nil {
		return fmt.Errorf("gateway keys add: %v\n%s", err, out)
	}

	fmt.Printf("# Invented-key flood: %d random svc_dsc_ keys from %d client IPs, %d senders, one replica; the legitimate tenant: %d senders, %v apart\n\n", o.keys, o.ips, o.conc, o.legitConc, o.legitGap)
	fmt.Printf("%s, GOMAXPROCS unset, %d CPUs, load average before: %s\n\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"), runtime.NumCPU(), floodkit.LoadAvg())
	fmt.Println("| scenario | flood answers | flood time | Redis GETs (invented keys) | GETs per invented key | other Redis commands (the legitimate tenant's limits, new connections) | legitimate tenant: requests, answers | p50 | p99 | max |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|")
	for _, sc := range []struct {
		name  string
		flood bool
		limit int
	}{
		{"legitimate tenant alone", false, 30},
		{"flood, failure_limit 30 (default)", true, 30},
		{"flood, failure_limit 0 (off)", true, 0},
	} {
		row, err := scenario(o, procs, dir, up, redisAddr, sc.flood, sc.limit)
		if err != nil {
			return fmt.Errorf("%s: %w", sc.name, err)
		}
		fmt.Printf("| %s | %s |\n", sc.name, row)
	}
	return nil
}

func scenario(o options, procs *child.Group, dir, up, redisAddr string, flood bool, limit int) (string, error) {
	ports := child.FreePorts(2)
	pub, adm := ports[0], ports[1]
	cfg, err := writeConfig(dir, fmt.Sprintf("gw-%d.yaml", pub), pub, adm, up, redisAddr, limit)
	if err != nil {
		return "", err
	}
	gw, err := procs.Start("gateway", "", nil, filepath.Join(dir, fmt.Sprintf("gw-%d.log", pub)), o.gateway, "-config", cfg)
	if err != nil {
		return "", err
	}
	defer gw.Stop()
	if err := child.WaitHTTP(gw, fmt.Sprintf("http://127.0.0.1:%d/readyz", adm), 10*time.Second); err != nil {
		return "", err
	}
	base := fmt.Sprintf("http://127.0.0.1:%d", pub)
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: o.conc + o.legitConc}}
	// Warm-up: connections, the legitimate key cached, the limiter script loaded.
	for range 5 {
		if code, _ := floodkit.Send(client, base, "acme-docs", "192.0.2.200", legitKey); code != 200 {
			return "", fmt.Errorf("warm-up: legitimate key answered %d", code)
		}
	}

	mon, err := monitor(redisAddr)
	if err != nil {
		return "", err
	}
	statsBefore, err := commandStats(redisAddr)
	if err != nil {
		return "", err
	}

	var stop atomic.Bool
	var legit []time.Duration
	legitCodes := map[int]int{}
	var lmu sync.Mutex
	var lwg sync.WaitGroup
	for range o.legitConc {
		lwg.Add(1)
		go func() {
			defer lwg.Done()
			for !stop.Load() {
				code, took := floodkit.Send(client, base, "acme-docs", "192.0.2.200", legitKey)
				lmu.Lock()
				legitCodes[code]++
				legit = append(legit, took)
				lmu.Unlock()
				time.Sleep(o.legitGap)
			}
		}()
	}

	codes := map[int]int{}
	var floodTime time.Duration
	if flood {
		var mu sync.Mutex
		var wg sync.WaitGroup
		begin := time.Now()
		for w := range o.conc {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < o.keys; i += o.conc {
					var b [12]byte
					_, _ = rand.Read(b[:])
					ip := fmt.Sprintf("198.51.%d.%d", 100+(i%o.ips)/250, (i%o.ips)%250+1)
					code, _ := floodkit.Send(client, base, "acme-docs", ip, "svc_dsc_"+hex.EncodeToString(b[:]))
					mu.Lock()
					codes[code]++
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		floodTime = time.Since(begin)
	} else {
		time.Sleep(o.alone)
	}
	stop.Store(true)
	lwg.Wait()

	time.Sleep(200 * time.Millisecond) // the last commands reach MONITOR
	cmds := mon.stop()
	statsAfter, err := commandStats(redisAddr)
	if err != nil {
		return "", err
	}
	legitDigest := sha256hex(legitKey)
	inventedGets := 0
	other := map[string]int{}
	for _, c := range cmds {
		switch {
		case c.name == "get" && !strings.Contains(c.line, legitDigest):
			inventedGets++
		case c.name == "info" || c.name == "monitor":
		default:
			other[c.name]++
		}
	}
	// MONITOR and INFO commandstats must agree on the GETs.
	if statGets := statsAfter["get"] - statsBefore["get"]; statGets != inventedGets+other["get"] {
		return "", fmt.Errorf("MONITOR saw %d GETs, INFO commandstats %d", inventedGets+other["get"], statGets)
	}

	sort.Slice(legit, func(i, j int) bool { return legit[i] < legit[j] })
	q := func(p float64) string {
		if len(legit) == 0 {
			return "-"
		}
		return floodkit.MS(legit[min(int(float64(len(legit))*p), len(legit)-1)])
	}
	floodCol, timeCol, getsCol, perKey := "-", "-", "-", "-"
	if flood {
		floodCol = floodkit.Codes(codes)
		timeCol = fmt.Sprintf("%.1f s (%.0f req/s)", floodTime.Seconds(), float64(o.keys)/floodTime.Seconds())
		getsCol = strconv.Itoa(inventedGets)
		perKey = fmt.Sprintf("%.2f", float64(inventedGets)/float64(o.keys))
	}
	return fmt.Sprintf("%s | %s | %s | %s | %s | %d, %s | %s | %s | %s",
		floodCol, timeCol, getsCol, perKey, otherString(other), len(legit), floodkit.Codes(legitCodes), q(0.5), q(0.99), q(1)), nil
}

func writeConfig(dir, name string, pub, adm int, up, redisAddr string, limit int) (string, error) {
	if pub == 0 {
		ports := child.FreePorts(2)
		pub, adm = ports[0], ports[1]
	}
	// Limits far above the load: the flood and the tenant are told apart by auth only.
	cfg := fmt.Sprintf(`listen: "127.0.0.1:%d"
admin_listen: "127.0.0.1:%d"
upstream: {url: %q}
redis: {addrs: [%q]}
auth: {mode: registry, failure_limit: %d}
client_ip: {trusted_proxies: ["127.0.0.1/32"]}
log: {level: info, format: json, buffer: 262144}
limits:
  assistant_per_ip:  {limit: 1000000000}
  assistant_per_org: {limit: 1000000000}
  assistant_per_key: {limit: 1000000000}
`, pub, adm, up, redisAddr, limit)
	path := filepath.Join(dir, name)
	return path, os.WriteFile(path, []byte(cfg), 0o644)
}

// --- Redis over plain RESP: MONITOR and INFO commandstats.

type command struct{ name, line string }

type monitorConn struct {
	c    net.Conn
	mu   sync.Mutex
	cmds []command
	done chan struct{}
}

var monitorName = regexp.MustCompile(`^\+\d+\.\d+ \[\d+ [^\]]*\] "([^"]+)"`)

func monitor(addr string) (*monitorConn, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	br := bufio.NewReader(c)
	if _, err := io.WriteString(c, "MONITOR\r\n"); err != nil {
		c.Close()
		return nil, err
	}
	if line, err := br.ReadString('\n'); err != nil || !strings.HasPrefix(line, "+OK") {
		c.Close()
		return nil, fmt.Errorf("MONITOR: %q %v", line, err)
	}
	m := &monitorConn{c: c, done: make(chan struct{})}
	go func() {
		defer close(m.done)
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			if sm := monitorName.FindStringSubmatch(line); sm != nil {
				m.mu.Lock()
				m.cmds = append(m.cmds, command{strings.ToLower(sm[1]), line})
				m.mu.Unlock()
			}
		}
	}()
	return m, nil
}

func (m *monitorConn) stop() []command {
	m.c.Close()
	<-m.done
	return m.cmds
}

var statLine = regexp.MustCompile(`(?m)^cmdstat_([a-z|_-]+):calls=(\d+)`)

func commandStats(addr string) (map[string]int, error) {
	body, err := resp.Info(addr, "commandstats")
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, m := range statLine.FindAllStringSubmatch(body, -1) {
		out[m[1]], _ = strconv.Atoi(m[2])
	}
	return out, nil
}

// --- small helpers.

func sha256hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func otherString(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}
