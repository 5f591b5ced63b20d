package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// The idle-timeout fault (issue 23): an upstream that closes idle keep-alive connections
// after idleUpstreamTimeout, as Node's 5 s or a tight load balancer does, behind one gateway
// on each upstream transport, both with the default upstream.idle_timeout (50 s, far above
// it). A worker per gateway sends agent jobs spaced 0.9 to 1.1 times the upstream's timeout
// apart, so some go out just as the upstream closes the connection they are written on.
// Every request is counted at the upstream: none may arrive twice, and the pool may fail no
// more of them than net/http's Transport.
const idleUpstreamTimeout = time.Second

type idleFault struct {
	srv  *http.Server
	addr string

	mu   sync.Mutex
	seen map[string]int // deliveries by request id

	gws []*idleGateway
}

type idleGateway struct {
	*service
	transport     string
	public, admin string
	sent, failed  atomic.Int64
	mu            sync.Mutex
	errs          []string
}

// startIdleFault starts the upstream and its two gateways (gatewayBin, files in dir).
func startIdleFault(dir, gatewayBin string) (*idleFault, error) {
	f := &idleFault{seen: map[string]int{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	f.addr = ln.Addr().String()
	f.srv = &http.Server{IdleTimeout: idleUpstreamTimeout, Handler: http.HandlerFunc(f.serve)}
	go f.srv.Serve(ln)
	for _, transport := range []string{"pool", "standard"} {
		g := &idleGateway{transport: transport, public: freePort(), admin: freePort()}
		cfg := fmt.Sprintf("listen: %q\nadmin_listen: %q\nupstream:\n  url: \"http://%s\"\n  transport: %s\n", g.public, g.admin, f.addr, transport)
		path := filepath.Join(dir, "gateway-idle-"+transport+".yaml")
		if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
			return f, err
		}
		logf, err := os.Create(filepath.Join(dir, "gateway-idle-"+transport+".log"))
		if err != nil {
			return f, err
		}
		g.service = &service{name: "gateway-idle-" + transport, bin: gatewayBin, logf: logf, args: []string{"-config", path}}
		f.gws = append(f.gws, g)
		if err := g.start(); err != nil {
			return f, err
		}
		if err := waitHTTP("http://"+g.admin+"/readyz", 15*time.Second); err != nil {
			return f, err
		}
	}
	return f, nil
}

func (f *idleFault) serve(w http.ResponseWriter, r *http.Request) {
	var body struct{ Prompt string }
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	f.mu.Lock()
	f.seen[body.Prompt]++
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":%q,"status":"active"}`, body.Prompt)
}

// run sends the spaced requests through both gateways until stop closes.
func (f *idleFault) run(stop <-chan struct{}) {
	var wg sync.WaitGroup
	for _, g := range f.gws {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := &http.Client{Timeout: answerAfter}
			rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), uint64(len(g.transport))))
			for i := 0; ; i++ {
				id := fmt.Sprintf("idle-%s-%d", g.transport, i)
				g.sent.Add(1)
				if err := g.one(client, id); err != nil {
					g.failed.Add(1)
					g.mu.Lock()
					if len(g.errs) < 5 {
						g.errs = append(g.errs, fmt.Sprintf("%s: %v", id, err))
					}
					g.mu.Unlock()
				}
				spacing := time.Duration(float64(idleUpstreamTimeout) * (0.9 + 0.2*rng.Float64()))
				select {
				case <-stop:
					return
				case <-time.After(spacing):
				}
			}
		}()
	}
	wg.Wait()
}

func (g *idleGateway) one(client *http.Client, id string) error {
	req, _ := http.NewRequest("POST", "http://"+g.public+"/v2/agent/"+id+"/job", strings.NewReader(`{"prompt":"`+id+`"}`))
	req.Header.Set("Authorization", "Bearer svc_soak")
	req.Header.Set("Content-Type", "application/json")
	res, err := client.Do(req)
	if err != nil {
		return err
	}
	data, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil || res.StatusCode != http.StatusCreated || !strings.Contains(string(data), `"id":"`+id+`"`) {
		return fmt.Errorf("%d %q %v", res.StatusCode, data, err)
	}
	return nil
}

// report prints what each gateway saw and returns false on a request delivered twice or a
// pool failing more requests than net/http's Transport.
func (f *idleFault) report() bool {
	f.mu.Lock()
	twice := 0
	for _, n := range f.seen {
		if n > 1 {
			twice++
		}
	}
	f.mu.Unlock()
	ok := twice == 0
	failed := map[string]int64{}
	fmt.Printf("upstream closing idle connections after %v (default upstream.idle_timeout):\n", idleUpstreamTimeout)
	for _, g := range f.gws {
		failed[g.transport] = g.failed.Load()
		fmt.Printf("  %-8s %d of %d requests failed\n", g.transport, g.failed.Load(), g.sent.Load())
		g.mu.Lock()
		for _, e := range g.errs {
			fmt.Printf("    e.g. %s\n", e)
		}
		g.mu.Unlock()
	}
	fmt.Printf("  delivered twice: %d\n", twice)
	if failed["pool"] > failed["standard"] {
		fmt.Println("  FAIL: the pool failed more requests than net/http's Transport")
		ok = false
	}
	return ok
}

// services are the fault's gateways, for the soak to stop.
func (f *idleFault) services() []*service {
	var out []*service
	for _, g := range f.gws {
		out = append(out, g.service)
	}
	return out
}

func (f *idleFault) close() {
	_ = f.srv.Close()
	for _, g := range f.gws {
		_ = g.logf.Close()
	}
}
