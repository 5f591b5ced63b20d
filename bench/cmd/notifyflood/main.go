// Command notifyflood measures what a flood of visitor addresses does to quota notifications
// (bench/README.md, "Notification flood"): one gateway replica (the binary given by -gateway,
// built without the race detector) on a real redis-server or in process, one webhook endpoint
// (an HTTP server in this process, answering 204 at once), and -visitors client addresses
// (X-Forwarded-For from a trusted proxy, 127.0.0.1) each sending two requests as fast as
// -conc senders can, against assistant_per_ip {limit: 2}. Meanwhile tenants (orgs on a plan of
// 5 requests) cross 0.8 and 1.0 of their limit one after another, every -tenant-gap.
//
// Two scenarios: "defaults" (the by-ip limit sets nothing: with this release it sends no
// event) and "thresholds: [0.5, 1.0]" set on it (every address makes two events). For each it
// reports the flood's rate, the notifications dropped (gateway_notifications_total), what the
// outbox holds at the end and its keys' Redis memory per delivery held, and the tenants' events:
// how many arrived of those owed, and how long after the request that crossed.
//
//	go build -o /tmp/gateway ./cmd/gateway && (cd bench && go run ./cmd/notifyflood -gateway /tmp/gateway)
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/docsgate/gateway/bench/internal/child"
	"github.com/docsgate/gateway/bench/internal/floodkit"
	"github.com/docsgate/gateway/bench/internal/resp"
)

type options struct {
	gateway, redisServer string
	visitors, conc       int
	tenantGap, settle    time.Duration
	stores               string
}

func main() {
	var o options
	flag.StringVar(&o.gateway, "gateway", "", "gateway binary (required; build it without -race)")
	flag.StringVar(&o.redisServer, "redis-server", "redis-server", "redis-server binary")
	flag.IntVar(&o.visitors, "visitors", 100000, "visitor addresses in the flood (two requests each)")
	flag.IntVar(&o.conc, "conc", 32, "concurrent flood senders")
	flag.DurationVar(&o.tenantGap, "tenant-gap", 200*time.Millisecond, "pause between two tenants crossing their thresholds")
	flag.DurationVar(&o.settle, "settle", 30*time.Second, "how long tenants' events owed may still arrive after the flood")
	flag.StringVar(&o.stores, "stores", "redis,memory", "stores to measure, of redis and memory")
	flag.Parse()
	if o.gateway == "" {
		fmt.Fprintln(os.Stderr, "notifyflood: -gateway is required")
		os.Exit(2)
	}
	procs := &child.Group{}
	if err := run(o, procs); err != nil {
		procs.StopAll()
		fmt.Fprintln(os.Stderr, "notifyflood:", err)
		os.Exit(1)
	}
}

const (
	adminToken = "bench-admin-token-0123456789"
	secret     = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	// tenants is how many orgs take turns crossing their thresholds (each once).
	tenants = 1000
)

func run(o options, procs *child.Group) error {
	dir, err := os.MkdirTemp("", "notifyflood-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	defer procs.StopAll()
	up, err := floodkit.Upstream()
	if err != nil {
		return err
	}
	fmt.Printf("# Notification flood: %d visitor addresses × 2 requests, %d senders, one replica; a tenant crossing 0.8 and 1.0 every %v\n\n", o.visitors, o.conc, o.tenantGap)
	fmt.Printf("%s, %d CPUs, load average before: %s\n\n", time.Now().UTC().Format("2006-01-02 15:04 UTC"), runtime.NumCPU(), floodkit.LoadAvg())
	fmt.Println("| store | assistant_per_ip | flood | notifications dropped | outbox at the end | Redis per delivery held | tenants' events arrived | after the crossing: p50 | p99 | max |")
	fmt.Println("|---|---|---|---|---|---|---|---|---|---|")
	for _, store := range strings.Split(o.stores, ",") {
		for _, ip := range []string{"{limit: 2}", "{limit: 2, thresholds: [0.5, 1.0]}"} {
			row, err := scenario(o, procs, dir, up, store, ip)
			if err != nil {
				return fmt.Errorf("%s, %s: %w", store, ip, err)
			}
			fmt.Printf("| %s | `%s` | %s |\n", store, ip, row)
		}
	}
	return nil
}

func scenario(o options, procs *child.Group, dir, up, store, ipLimit string) (string, error) {
	redisAddr := ""
	if store == "redis" {
		redisAddr = fmt.Sprintf("127.0.0.1:%d", child.FreePort())
		_, port, _ := net.SplitHostPort(redisAddr)
		rdir := filepath.Join(dir, "redis-"+port)
		if err := os.Mkdir(rdir, 0o755); err != nil {
			return "", err
		}
		r, err := procs.Start("redis-server", "", nil, filepath.Join(rdir, "redis.log"), o.redisServer, "--port", port, "--bind", "127.0.0.1",
			"--dir", rdir, "--save", "", "--appendonly", "no", "--protected-mode", "no")
		if err != nil {
			return "", err
		}
		defer r.Stop()
		if err := resp.WaitReady(redisAddr, 10*time.Second); err != nil {
			return "", err
		}
	}
	recv, err := newReceiver()
	if err != nil {
		return "", err
	}
	defer recv.srv.Close()

	ports := child.FreePorts(2)
	cfg, err := writeConfig(dir, ports[0], ports[1], up, redisAddr, ipLimit, recv.url)
	if err != nil {
		return "", err
	}
	gw, err := procs.Start("gateway", "", nil, filepath.Join(dir, fmt.Sprintf("gw-%d.log", ports[0])), o.gateway, "-config", cfg)
	if err != nil {
		return "", err
	}
	defer gw.Stop()
	admin := fmt.Sprintf("http://127.0.0.1:%d", ports[1])
	if err := child.WaitHTTP(gw, admin+"/readyz", 10*time.Second); err != nil {
		return "", err
	}
	base := fmt.Sprintf("http://127.0.0.1:%d", ports[0])
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: o.conc + 4}}

	// The tenants: one after another, each crossing 0.8 (its 4th request of 5) and 1.0 (its
	// 5th), each request from an address of its own; the times of the crossing requests kept.
	var stop atomic.Bool
	var tmu sync.Mutex
	crossed := map[string]time.Time{} // "org threshold" -> when the crossing request was sent
	var twg sync.WaitGroup
	twg.Add(1)
	go func() {
		defer twg.Done()
		for t := 0; t < tenants && !stop.Load(); t++ {
			org := fmt.Sprintf("t%d", t)
			for r := range 5 {
				at := time.Now()
				code, _ := floodkit.Send(client, base, org+"-docs", fmt.Sprintf("172.%d.%d.%d", 16+t>>8, t&255, r+1), "svc_dsc_tenant")
				if code != 200 {
					fmt.Fprintf(os.Stderr, "tenant %s request %d: %d\n", org, r+1, code)
				}
				tmu.Lock()
				switch r {
				case 3:
					crossed[org+" 0.8"] = at
				case 4:
					crossed[org+" 1"] = at
				}
				tmu.Unlock()
			}
			time.Sleep(o.tenantGap)
		}
	}()

	begin := time.Now()
	var next atomic.Int64
	var wg sync.WaitGroup
	codes := make([]map[int]int, o.conc)
	for w := range o.conc {
		codes[w] = map[int]int{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= o.visitors {
					return
				}
				ip := fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)
				for range 2 {
					code, _ := floodkit.Send(client, base, "crowd-docs", ip, "svc_dsc_crowd")
					codes[w][code]++
				}
			}
		}()
	}
	wg.Wait()
	flood := time.Since(begin)
	stop.Store(true)
	twg.Wait()

	// The tenants' events owed: wait for them, at most o.settle.
	tmu.Lock()
	owed := len(crossed)
	tmu.Unlock()
	deadline := time.Now().Add(o.settle)
	for recv.tenantCount() < owed && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	var lat []time.Duration
	tmu.Lock()
	for k, at := range recv.tenantArrivals() {
		if c, ok := crossed[k]; ok {
			lat = append(lat, at.Sub(c))
		}
	}
	tmu.Unlock()
	slices.Sort(lat)
	q := func(p float64) string {
		if len(lat) == 0 {
			return "-"
		}
		return floodkit.MS(lat[min(int(float64(len(lat))*p), len(lat)-1)])
	}

	metrics, err := scrape(admin + "/metrics")
	if err != nil {
		return "", err
	}
	dropped := 0.0
	for k, v := range metrics {
		if strings.HasPrefix(k, "gateway_notifications_total{") && strings.Contains(k, `result="dropped"`) {
			dropped += v
		}
	}
	held, err := outboxHeld(admin)
	if err != nil {
		return "", err
	}
	perDelivery := "-"
	if redisAddr != "" && held > 0 {
		n, err := outboxBytes(redisAddr)
		if err != nil {
			return "", err
		}
		perDelivery = fmt.Sprintf("%.0f B", float64(n)/float64(held))
	}
	allCodes := map[int]int{}
	for _, m := range codes {
		for k, v := range m {
			allCodes[k] += v
		}
	}
	floodCol := fmt.Sprintf("%.1f s, %.0f req/s (%s)", flood.Seconds(), float64(2*o.visitors)/flood.Seconds(), floodkit.Codes(allCodes))
	return fmt.Sprintf("%s | %.0f | %d | %s | %d of %d | %s | %s | %s",
		floodCol, dropped, held, perDelivery, recv.tenantCount(), owed, q(0.5), q(0.99), q(1)), nil
}

func writeConfig(dir string, pub, adm int, up, redisAddr, ipLimit, hook string) (string, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "listen: \"127.0.0.1:%d\"\nadmin_listen: \"127.0.0.1:%d\"\nupstream: {url: %q}\nadmin_token: %q\n", pub, adm, up, adminToken)
	if redisAddr != "" {
		fmt.Fprintf(&b, "redis: {addrs: [%q]}\n", redisAddr)
	}
	b.WriteString("client_ip: {trusted_proxies: [\"127.0.0.1/32\"]}\nlog: {level: info, format: json}\norgs:\n")
	for t := range tenants {
		fmt.Fprintf(&b, "  t%d: {domains: [t%d-docs], plan: small}\n", t, t)
	}
	fmt.Fprintf(&b, `plans: {small: {assistant_per_org: {limit: 5}}}
limits:
  assistant_per_ip: %s
  assistant_per_org: {limit: 1000000000}
  assistant_per_key: {limit: 1000000000}
notifications:
  webhooks:
    - {name: h, url: %q, secret: %q, allow_private_addresses: true}
`, ipLimit, hook, secret)
	path := filepath.Join(dir, fmt.Sprintf("gw-%d.yaml", pub))
	return path, os.WriteFile(path, []byte(b.String()), 0o644)
}

// receiver is the webhook endpoint: it answers 204 at once and keeps when each tenant's
// event ("org threshold") first arrived, and how many visitors' did.
type receiver struct {
	srv      *http.Server
	url      string
	mu       sync.Mutex
	tenants  map[string]time.Time
	visitors atomic.Int64
}

func newReceiver() (*receiver, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &receiver{url: "http://" + ln.Addr().String() + "/hook", tenants: map[string]time.Time{}}
	r.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		at := time.Now()
		var ev struct {
			Type string `json:"type"`
			Data struct {
				By        string  `json:"by"`
				Tenant    string  `json:"tenant"`
				Threshold float64 `json:"threshold"`
			} `json:"data"`
		}
		_ = json.NewDecoder(req.Body).Decode(&ev)
		w.WriteHeader(http.StatusNoContent)
		if ev.Data.By == "ip" {
			r.visitors.Add(1)
			return
		}
		if ev.Type != "quota.threshold_crossed" {
			return
		}
		k := ev.Data.Tenant + " " + strconv.FormatFloat(ev.Data.Threshold, 'g', -1, 64)
		r.mu.Lock()
		if _, ok := r.tenants[k]; !ok {
			r.tenants[k] = at
		}
		r.mu.Unlock()
	})}
	go func() { _ = r.srv.Serve(ln) }()
	return r, nil
}

func (r *receiver) tenantCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.tenants)
}

func (r *receiver) tenantArrivals() map[string]time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[string]time.Time, len(r.tenants))
	for k, v := range r.tenants {
		out[k] = v
	}
	return out
}

// outboxHeld is what the outbox holds, pending and dead, from the admin API.
func outboxHeld(admin string) (int, error) {
	req, _ := http.NewRequest("GET", admin+"/notifications?state=pending&n=1", nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	var c struct{ Pending, Dead int }
	if err := json.NewDecoder(res.Body).Decode(&c); err != nil {
		return 0, fmt.Errorf("/notifications: %d %w", res.StatusCode, err)
	}
	return c.Pending + c.Dead, nil
}

// scrape returns every sample of a Prometheus exposition as "name{labels}" -> value.
func scrape(url string) (map[string]float64, error) {
	req, _ := http.NewRequest("GET", url, nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(res.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if v, err := strconv.ParseFloat(line[i+1:], 64); err == nil {
			out[line[:i]] = v
		}
	}
	return out, sc.Err()
}

// outboxBytes is the memory of the outbox's keys in the Redis at addr (MEMORY USAGE of
// each, every element counted).
func outboxBytes(addr string) (int64, error) {
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	keys, err := c.Keys(ctx, "*:notify:{notify}:*").Result()
	if err != nil {
		return 0, err
	}
	total := int64(0)
	for _, k := range keys {
		n, err := c.MemoryUsage(ctx, k, 0).Result()
		if err != nil {
			return 0, err
		}
		total += n
	}
	return total, nil
}
