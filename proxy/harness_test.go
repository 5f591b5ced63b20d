package proxy

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/engine"
	"github.com/docsgate/gateway/limits"
	"github.com/docsgate/gateway/metrics"
)

// Keys used across the tests. Their text must never show up in logs or error bodies.
const (
	adminKey     = "svc_admin0123456789SECRET"
	assistantKey = "svc_dsc_public0123456789SECRET"
)

// seen is one request as the recording upstream received it.
type seen struct {
	Method, Path, RawQuery, Host string
	Header                       http.Header
	Body                         []byte
	ContentLength                int64
}

// upstream is a real HTTP server that records what reaches it and answers with handle.
type upstream struct {
	*httptest.Server
	mu     sync.Mutex
	seen   []seen
	handle http.HandlerFunc
}

func newUpstream(t *testing.T, handle http.HandlerFunc) *upstream {
	t.Helper()
	u := &upstream{handle: handle}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		u.mu.Lock()
		u.seen = append(u.seen, seen{r.Method, r.URL.Path, r.URL.RawQuery, r.Host, r.Header.Clone(), body, r.ContentLength})
		u.mu.Unlock()
		if u.handle != nil {
			u.handle(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":"job_1","status":"active"}`)
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *upstream) requests() []seen {
	u.mu.Lock()
	defer u.mu.Unlock()
	return append([]seen(nil), u.seen...)
}

// gateway is a Gateway behind a real listener, with its logs observed.
type gateway struct {
	*httptest.Server
	up   *upstream
	logs *observer.ObservedLogs
	reg  *prometheus.Registry
	gw   *Gateway
	eng  *engine.Engine
}

type gatewayOpt func(*config.Config)

func newGateway(t *testing.T, up *upstream, opts ...gatewayOpt) *gateway {
	t.Helper()
	return newGatewayWith(t, up, nil, opts...)
}

// newGatewayWith is newGateway in registry mode when reg is not nil.
func newGatewayWith(t *testing.T, up *upstream, reg KeyLookup, opts ...gatewayOpt) *gateway {
	t.Helper()
	return newGatewayOptions(t, up, reg, nil, opts...)
}

// newGatewayOptions is newGatewayWith with the engine's options changed by mod (when not nil)
// before it is built.
func newGatewayOptions(t *testing.T, up *upstream, reg KeyLookup, mod func(*engine.Options), opts ...gatewayOpt) *gateway {
	t.Helper()
	cfg := config.Defaults()
	cfg.Upstream.URL = up.URL
	if tr := os.Getenv("GATEWAY_TEST_UPSTREAM_TRANSPORT"); tr != "" {
		// scripts/test.sh runs the package again on net/http's Transport: both stay tested.
		cfg.Upstream.Transport = tr
	}
	cfg.Routes = []config.Route{
		{Name: "agent_job_status", Method: "GET", Path: "/v2/agent/{projectId}/job/{jobId}", Key: "admin"},
		{Name: "assistant_message_v2", Method: "POST", Path: "/discovery/v2/assistant/{domain}/message", Key: "assistant", Stream: ptr(true),
			Limits: &[]string{"assistant_per_key", "assistant_per_org", "assistant_per_ip"}},
	}
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	core, logs := observer.New(zap.DebugLevel)
	promReg := prometheus.NewRegistry()
	m, log := metrics.New(promReg), zap.New(core)
	eo := engineOptions(&cfg, testLimiter(t, &cfg), m, log)
	if reg != nil {
		eo.Registry = reg
	}
	if mod != nil {
		mod(&eo)
	}
	eng := engine.New(eo)
	gw, err := New(Options{Config: &cfg, Logger: log, Metrics: m, Engine: eng, Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(gw)
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv.Config.Protocols = &p
	srv.Start()
	t.Cleanup(srv.Close)
	return &gateway{Server: srv, up: up, logs: logs, reg: promReg, gw: gw, eng: eng}
}

// engineOptions are the engine's options as the gateway's process sets them for cfg, on the
// store lim; notifications, when cfg has them, are marked for a Crossings the test sets.
func engineOptions(cfg *config.Config, lim engine.Limiter, m *metrics.Metrics, log *zap.Logger) engine.Options {
	eo := engine.Options{Limiter: lim, AllowOnError: cfg.Redis.OnError == "allow", GrowTimeout: cfg.Redis.Timeout, Metrics: m, Logger: log}
	if q, ok := lim.(limits.QuotaStore); ok {
		eo.Quotas = q
	}
	if h, ok := lim.(limits.HistoryStore); ok {
		eo.History = h
	}
	if cfg.Notifications.Enabled() {
		n := cfg.Notifications
		eo.Notify = &n
	}
	return eo
}

// newTestGateway builds a Gateway for cfg on the store lim (a nil Logger: none).
func newTestGateway(cfg *config.Config, lim engine.Limiter, m *metrics.Metrics, log *zap.Logger, transport http.RoundTripper) (*Gateway, error) {
	if log == nil {
		log = zap.NewNop()
	}
	eng := engine.New(engineOptions(cfg, lim, m, log))
	return New(Options{Config: cfg, Logger: log, Metrics: m, Engine: eng, Transport: transport})
}

func ptr[T any](v T) *T { return &v }

// testLimiter is the store the config asks for: Redis (behind a Guard, as in production) when
// redis.addrs is set, else in process.
func testLimiter(t *testing.T, cfg *config.Config) engine.Limiter {
	t.Helper()
	if len(cfg.Redis.Addrs) == 0 {
		return limits.NewMemory()
	}
	client := redis.NewClient(&redis.Options{Addr: cfg.Redis.Addrs[0], MaxRetries: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { client.Close() })
	var opts []limits.RedisOption
	if cfg.Redis.Coalesce {
		opts = append(opts, limits.WithCoalescing())
	}
	store, err := limits.NewRedis(client, cfg.Redis.KeyPrefix, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	return limits.NewGuard(store, limits.GuardOptions{
		Timeout: cfg.Redis.Timeout, FailureThreshold: cfg.Redis.Breaker.Failures, Cooldown: cfg.Redis.Breaker.Cooldown,
	})
}

// do sends one request and returns the response with its body read.
func (g *gateway) do(t *testing.T, method, path string, header http.Header, body string) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, g.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body == "" {
		req.Body = http.NoBody
		req.ContentLength = 0
	}
	for k, v := range header {
		req.Header[k] = v
	}
	res, err := g.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, data
}

func hdr(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

func jsonHdr(key string) http.Header {
	return hdr("Authorization", "Bearer "+key, "Content-Type", "application/json")
}

const (
	agentBody     = `{"prompt":"Add a page about rate limits"}`
	assistantBody = `{"fp":"anonymous","messages":[{"id":"m1","role":"user","content":"How do I start?","parts":[{"type":"text","text":"How do I start?"}]}],"retrievalPageSize":5}`
)

// assertNoSecrets fails if a test key appears anywhere in the observed logs or in data.
func (g *gateway) assertNoSecrets(t *testing.T, data ...[]byte) {
	t.Helper()
	var all bytes.Buffer
	for _, e := range g.logs.All() {
		all.WriteString(e.Message)
		for k, v := range e.ContextMap() {
			all.WriteString(k)
			all.WriteString(toString(v))
		}
	}
	for _, d := range data {
		all.Write(d)
	}
	for _, key := range []string{adminKey, assistantKey, "SECRET"} {
		if bytes.Contains(all.Bytes(), []byte(key)) {
			t.Fatalf("secret %q leaked into logs or bodies", key)
		}
	}
}

func toString(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case time.Duration:
		return x.String()
	}
	return ""
}

type cfgT = config.Config

func readBody(t *testing.T, res *http.Response) []byte {
	t.Helper()
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// counter reads one counter series from the gateway's registry; labels are name, value pairs.
func (g *gateway) counter(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := g.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
			}
			for i := 0; i+1 < len(labels); i += 2 {
				if got[labels[i]] != labels[i+1] {
					continue next
				}
			}
			return m.GetCounter().GetValue()
		}
	}
	return 0
}

// sse renders chunks as a UI message stream's events.
func sse(chunks ...string) string {
	var b strings.Builder
	for _, c := range chunks {
		b.WriteString("data: " + c + "\n\n")
	}
	return b.String()
}
