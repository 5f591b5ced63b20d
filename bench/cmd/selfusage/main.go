// Command selfusage measures what the tenants' usage endpoint (GET /gateway/usage) adds over a
// plain answer of the same listener: the gateway's own 404 (the request path's start and end,
// the access log line and the metrics, no store) and, for reference, the admin listener's
// /healthz. Requests of the three kinds are interleaved one by one on one keep-alive
// connection each, so a busy moment of the machine falls on all of them alike; it prints the
// percentiles of each and the difference at each percentile.
//
// It starts the gateway binary given by -gateway (build it without -race) on the in-process
// store, and with -redis also on a redis-server it starts; both are stopped by PID.
//
//	go build -o /tmp/gateway ./cmd/gateway && (cd bench && go run ./cmd/selfusage -gateway /tmp/gateway)
package main

import (
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	"github.com/docsgate/gateway/bench/internal/child"
)

func main() {
	gateway := flag.String("gateway", "", "gateway binary (required; build it without -race)")
	redisServer := flag.String("redis-server", "redis-server", "redis-server binary")
	withRedis := flag.Bool("redis", false, "also measure on a redis-server")
	n := flag.Int("n", 20000, "requests of each kind")
	flag.Parse()
	if *gateway == "" {
		fmt.Fprintln(os.Stderr, "-gateway is required")
		os.Exit(2)
	}
	var g child.Group
	defer g.StopAll()
	stores := []string{"memory"}
	if *withRedis {
		stores = append(stores, "redis")
	}
	for _, store := range stores {
		if err := run(&g, *gateway, *redisServer, store, *n); err != nil {
			fmt.Fprintln(os.Stderr, err)
			g.StopAll()
			os.Exit(1)
		}
	}
}

// The limits of the measured answer: the assistant route's three built-in ones, a tokens limit
// with a reserve and a streams limit, as the example config gives both assistant routes.
const config = `listen: 127.0.0.1:%d
admin_listen: 127.0.0.1:%d
upstream: {url: "http://127.0.0.1:1"}
%s
orgs: {acme: [acme-docs]}
limits:
  assistant_tokens_per_org: {limit: 2000000, window: month, by: org, unit: tokens, reserve: 4000}
  assistant_streams_per_org: {limit: 50, by: org, unit: streams}
routes:
  - name: assistant_message_v2
    limits: [assistant_per_key, assistant_per_org, assistant_per_ip, assistant_tokens_per_org, assistant_streams_per_org]
self_usage: {per_address_per_minute: 100000000, per_key_per_minute: 100000000, prefix_mode_exposes: [key, org]}
`

func run(g *child.Group, gateway, redisServer, store string, n int) error {
	dir, err := os.MkdirTemp("", "selfusage-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	ports := child.FreePorts(3)
	redisCfg := ""
	if store == "redis" {
		rp, err := g.Start("redis", "", nil, filepath.Join(dir, "redis.log"), redisServer,
			"--port", strconv.Itoa(ports[2]), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
		if err != nil {
			return err
		}
		defer rp.Stop()
		time.Sleep(300 * time.Millisecond)
		redisCfg = fmt.Sprintf("redis: {addrs: [\"127.0.0.1:%d\"]}", ports[2])
	}
	cfgPath := filepath.Join(dir, "gateway.yaml")
	if err := os.WriteFile(cfgPath, fmt.Appendf(nil, config, ports[0], ports[1], redisCfg), 0o600); err != nil {
		return err
	}
	gp, err := g.Start("gateway", "", nil, filepath.Join(dir, "gateway.log"), gateway, "-config", cfgPath)
	if err != nil {
		return err
	}
	defer gp.Stop()
	admin := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	if err := child.WaitHTTP(gp, admin+"/healthz", 10*time.Second); err != nil {
		return err
	}
	public := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	kinds := []struct {
		name, url string
		key       bool
		status    int
	}{
		{"GET /gateway/usage (5 limits)", public + "/gateway/usage?route=assistant_message_v2&domain=acme-docs", true, 200},
		{"public 404 (plain answer)", public + "/healthz", false, 404},
		{"admin /healthz", admin + "/healthz", false, 200},
	}
	clients := make([]*http.Client, len(kinds))
	for i := range clients {
		clients[i] = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	}
	lat := make([][]time.Duration, len(kinds))
	for round := -n / 10; round < n; round++ { // the first tenth warms up, unrecorded
		for i, k := range kinds {
			req, _ := http.NewRequest(http.MethodGet, k.url, nil)
			if k.key {
				req.Header.Set("Authorization", "Bearer svc_dsc_benchwidget0123456789abcdef")
			}
			start := time.Now()
			res, err := clients[i].Do(req)
			if err != nil {
				return err
			}
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
			d := time.Since(start)
			if res.StatusCode != k.status {
				return fmt.Errorf("%s: status %d", k.name, res.StatusCode)
			}
			if round >= 0 {
				lat[i] = append(lat[i], d)
			}
		}
	}
	fmt.Printf("\nstore: %s, %d requests of each kind, interleaved, sequential, keep-alive\n\n", store, n)
	fmt.Println("| answer | p50 | p90 | p99 | p99.9 |")
	fmt.Println("|---|---|---|---|---|")
	ps := []float64{0.50, 0.90, 0.99, 0.999}
	pct := make([][]time.Duration, len(kinds))
	for i, k := range kinds {
		sort.Slice(lat[i], func(a, b int) bool { return lat[i][a] < lat[i][b] })
		for _, p := range ps {
			pct[i] = append(pct[i], lat[i][int(p*float64(len(lat[i])-1))])
		}
		fmt.Printf("| %s | %s | %s | %s | %s |\n", k.name, us(pct[i][0]), us(pct[i][1]), us(pct[i][2]), us(pct[i][3]))
	}
	fmt.Printf("| added over the public 404 | %s | %s | %s | %s |\n",
		us(pct[0][0]-pct[1][0]), us(pct[0][1]-pct[1][1]), us(pct[0][2]-pct[1][2]), us(pct[0][3]-pct[1][3]))
	return nil
}

func us(d time.Duration) string { return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond)) }
