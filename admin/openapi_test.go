package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	vconfig "github.com/pb33f/libopenapi-validator/config"
	v3 "github.com/pb33f/libopenapi/datamodel/high/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/engine"
	"github.com/docsgate/gateway/limits"
	"github.com/docsgate/gateway/metrics"
	"github.com/docsgate/gateway/notify"
	"github.com/docsgate/gateway/proxy"
)

// The admin API and its OpenAPI document (openapi.json) describe each other: the document is
// valid OpenAPI 3.1; every pattern the mux registers serves a documented operation and every
// documented operation is served by a pattern of its own; every request the test sends and
// every answer it gets is validated against the document by libopenapi-validator (an answer
// of an undocumented status, content type, field or error code fails); every documented
// parameter is sent and every documented (status, code) of every operation is produced, but
// the few listed in notDriven.

const oaToken = "openapi-test-token-0123456789"

// notDriven are the documented answers this test does not produce, and why.
var notDriven = map[string]string{
	"ui_page 500 internal": "the page's template failing to render",
	"pprof_profile 400 ":   "a duration beyond the server's write timeout (the admin listener sets none)",
	"pprof_trace 400 ":     "a duration beyond the server's write timeout (the admin listener sets none)",
	"pprof_profile 500 ":   "two CPU profiles at once",
	"pprof_trace 500 ":     "two execution traces at once",
}

type oaOp struct {
	id, method, path string
	op               *v3.Operation
	write            bool // behind the write rules
}

func mustDoc(t *testing.T) libopenapi.Document {
	t.Helper()
	doc, err := libopenapi.NewDocument(openAPI)
	if err != nil {
		t.Fatal(err)
	}
	return doc
}

// oaDoc loads the document, validates it as OpenAPI 3.1 and builds a strict validator.
func oaDoc(t *testing.T) (*v3.Document, validator.Validator) {
	t.Helper()
	doc := mustDoc(t)
	if v := doc.GetVersion(); v != "3.1.0" {
		t.Fatalf("openapi %q, want 3.1.0", v)
	}
	model, err := doc.BuildV3Model()
	if err != nil {
		t.Fatalf("the document does not build: %v", err)
	}
	v, errs := validator.NewValidator(doc, vconfig.WithStrictMode(), vconfig.WithStrictIgnoredHeadersExtra(
		// Sent to test the cross-origin checks; set on every answer (not part of its contract).
		"Sec-Fetch-Site", "Origin", "Cache-Control", "X-Content-Type-Options", "Content-Security-Policy", "Referrer-Policy"))
	if len(errs) > 0 {
		t.Fatalf("validator: %v", errs)
	}
	if ok, verrs := v.ValidateDocument(); !ok {
		for _, e := range verrs {
			t.Errorf("document: %s: %s", e.Message, e.Reason)
		}
		t.FailNow()
	}
	return &model.Model, v
}

func oaOps(t *testing.T, doc *v3.Document) []oaOp {
	var ops []oaOp
	for path, item := range doc.Paths.PathItems.FromOldest() {
		for method, op := range item.GetOperations().FromOldest() {
			m := strings.ToUpper(method)
			write := false
			if op.RequestBody != nil || m != "GET" {
				write = op.OperationId != "usage_key"
			}
			ops = append(ops, oaOp{op.OperationId, m, path, op, write})
		}
	}
	if len(ops) == 0 {
		t.Fatal("no operations")
	}
	return ops
}

// example is the operation's path with its parameters' examples, and a query of its required
// parameters.
func (o oaOp) example() string {
	path := o.path
	q := url.Values{}
	for _, p := range o.op.Parameters {
		ex := p.Example.Value
		switch p.In {
		case "path":
			path = strings.ReplaceAll(path, "{"+p.Name+"}", url.PathEscape(ex))
		case "query":
			if p.Required != nil && *p.Required {
				q.Set(p.Name, ex)
			}
		}
	}
	if len(q) > 0 {
		path += "?" + q.Encode()
	}
	return path
}

// documented is every (status, code) an operation documents; code is "" for an answer that
// is not an Error.
func (o oaOp) documented() []string {
	var out []string
	for status, r := range o.op.Responses.Codes.FromOldest() {
		codes := []string{""}
		if r.Content == nil {
			out = append(out, o.id+" "+status+" ")
			continue
		}
		if mt, ok := r.Content.Get("application/json"); ok && mt.Schema != nil {
			if s := mt.Schema.Schema(); len(s.AllOf) == 2 && s.AllOf[0].GetReference() == "#/components/schemas/Error" {
				codes = nil
				code, _ := s.AllOf[1].Schema().Properties.Get("code")
				for _, e := range code.Schema().Enum {
					codes = append(codes, e.Value)
				}
			}
		}
		for _, c := range codes {
			out = append(out, o.id+" "+status+" "+c)
		}
	}
	return out
}

// failing backends, for the 503 answers.
type down struct{}

var errDown = errors.New("store down")

func (down) UsageViews(context.Context, string, string) ([]limits.View, error) { return nil, errDown }
func (down) Top(context.Context, string, int) ([]limits.TopList, error)        { return nil, errDown }
func (down) Add(context.Context, auth.Entry) error                             { return errDown }
func (down) Revoke(context.Context, string) error                              { return errDown }
func (down) List(context.Context) ([]auth.Entry, error)                        { return nil, errDown }
func (down) Rotate(context.Context, string, auth.Entry, time.Time) (auth.Entry, error) {
	return auth.Entry{}, errDown
}
func (down) History(context.Context, string, string, string) (limits.TenantHistory, error) {
	return limits.TenantHistory{}, errDown
}
func (down) Export(context.Context, string, string, string) (limits.Export, error) {
	return limits.Export{}, errDown
}
func (down) Grant(context.Context, string, string, int64, limits.Who) (limits.Grant, limits.AuditEntry, error) {
	return limits.Grant{}, limits.AuditEntry{}, errDown
}
func (down) SetOverride(context.Context, string, string, int64, time.Time, limits.Who) (limits.Override, limits.AuditEntry, error) {
	return limits.Override{}, limits.AuditEntry{}, errDown
}
func (down) EndOverride(context.Context, string, string, limits.Who) (limits.AuditEntry, error) {
	return limits.AuditEntry{}, errDown
}
func (down) Reset(context.Context, string, string, limits.Who) (limits.AuditEntry, error) {
	return limits.AuditEntry{}, errDown
}
func (down) Overrides(context.Context) ([]limits.Override, error)    { return nil, errDown }
func (down) Audit(context.Context, int) ([]limits.AuditEntry, error) { return nil, errDown }

const oaConfig = `
upstream:
  url: %s
limits:
  agent_job_per_project: {limit: 100, window: hour, history: 2}
routes:
  - name: agent_job
`

// oaServers are the admin handlers the test drives, on the real gateway and in-process store
// (main), on stores that fail (down), without a token (open), and with a budget of one wrong
// token (limited).
type oaServers struct {
	main, down, open, limited *httptest.Server
	mux                       *routes
	notReady, reloadFails     atomic.Bool
	public                    *httptest.Server
	box                       *notify.Memory
	dead1, dead2, pending     string // the outbox's keys
}

func newOAServers(t *testing.T) *oaServers {
	t.Helper()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"status":"done"}`)
	}))
	t.Cleanup(up.Close)
	cfg, err := config.Parse(strings.NewReader(fmt.Sprintf(oaConfig, up.URL)), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	mem := limits.NewMemory()
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	eng := engine.New(engine.Options{Limiter: mem, Quotas: mem, History: mem, Metrics: m, Logger: zap.NewNop()})
	gw, err := proxy.New(proxy.Options{Config: cfg, Logger: zap.NewNop(), Metrics: m, Engine: eng})
	if err != nil {
		t.Fatal(err)
	}
	past := time.Now().Add(-time.Hour)
	keys, err := auth.NewMemoryRegistry([]auth.Entry{{Digest: auth.Digest(oaExpiredKey), Kind: "admin", Org: "acme", Projects: []string{"*"}, Expires: &past}})
	if err != nil {
		t.Fatal(err)
	}
	// An outbox holding two dead letters and a pending delivery.
	s := &oaServers{box: notify.NewMemory(100)}
	s.dead1, s.dead2, s.pending = seedOutbox(t, s.box)
	s.public = httptest.NewServer(gw)
	t.Cleanup(s.public.Close)
	base := Options{
		Ready: func() (bool, string) {
			if s.notReady.Load() {
				return false, "draining"
			}
			return true, "ready"
		},
		Metrics: metrics.Handler(reg), Usage: eng, Top: eng, TopTimeout: 10 * time.Second,
		Reload: func() error {
			if s.reloadFails.Load() {
				return errors.New("limits.x: unknown key")
			}
			return nil
		},
		Keys: keys, KnownPlan: func(p string) bool { return p == "gold" }, Quotas: eng, History: eng,
		Notifications: s.box, Token: oaToken, UsageTimeout: 5 * time.Second, Logger: zap.NewNop(),
	}
	start := func(o Options) *httptest.Server {
		h, _ := build(o)
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		return srv
	}
	var h http.Handler
	h, s.mux = build(base)
	s.main = httptest.NewServer(h)
	t.Cleanup(s.main.Close)
	d := base
	d.Usage, d.Top, d.Keys, d.Quotas, d.History, d.Notifications = down{}, down{}, down{}, down{}, down{}, downOutbox{}
	s.down = start(d)
	o := base
	o.Token = ""
	s.open = start(o)
	l := base
	l.FailureLimit = 1
	s.limited = start(l)
	return s
}

// oaCall is one request of the test.
type oaCall struct {
	srv     *httptest.Server
	method  string
	target  string // path and query
	body    string
	ctype   string // "": application/json when there is a body
	auth    string // "bearer" (default), "none", "wrong", or "basic:<user>"
	header  map[string]string
	host    string
	good    bool // the request follows the document: it must validate
	status  int  // the status wanted
	code    string
	stalled bool // the answer's body is not read (an export held open)
}

type oaRun struct {
	t        *testing.T
	doc      *v3.Document
	v        validator.Validator
	loose    validator.Validator // not strict, for the document's own answer
	ops      []oaOp
	produced map[string]bool
	params   map[string]bool // "opid name" of parameters sent in a request answered 2xx
}

// opOf finds the documented operation a request names, as the validator's router does.
// A literal path of the document wins over a template (/debug/pprof/cmdline over {profile}).
func (r *oaRun) opOf(req *http.Request) *oaOp {
	for _, literal := range []bool{true, false} {
		for i := range r.ops {
			o := &r.ops[i]
			if o.method != req.Method || strings.Contains(o.path, "{") == literal {
				continue
			}
			if (literal && o.path == req.URL.Path) || (!literal && pathMatches(o.path, req.URL.Path)) {
				return o
			}
		}
	}
	return nil
}

func pathMatches(tmpl, path string) bool {
	re := "^" + regexp.MustCompile(`\\\{[^}]+\\\}`).ReplaceAllString(regexp.QuoteMeta(tmpl), `[^/]+`) + "$"
	return regexp.MustCompile(re).MatchString(path)
}

func (r *oaRun) do(c oaCall) {
	t := r.t
	t.Helper()
	var body io.Reader
	if c.body != "" {
		body = strings.NewReader(c.body)
	}
	req, err := http.NewRequest(c.method, c.srv.URL+c.target, body)
	if err != nil {
		t.Fatal(err)
	}
	if c.body != "" {
		ct := c.ctype
		if ct == "" {
			ct = "application/json"
		}
		req.Header.Set("Content-Type", ct)
	}
	switch {
	case c.auth == "" || c.auth == "bearer":
		req.Header.Set("Authorization", "Bearer "+oaToken)
	case c.auth == "wrong":
		req.Header.Set("Authorization", "Bearer wrong-token")
	case strings.HasPrefix(c.auth, "basic:"):
		req.SetBasicAuth(strings.TrimPrefix(c.auth, "basic:"), oaToken)
	}
	for k, v := range c.header {
		req.Header.Set(k, v)
	}
	if c.host != "" {
		req.Host = c.host
	}
	what := c.method + " " + c.target
	// The validator reads the request's body: it gets a copy.
	vreq := req.Clone(context.Background())
	vreq.URL.Host, vreq.URL.Scheme = "127.0.0.1:9090", "http"
	if c.body != "" {
		vreq.Body = io.NopCloser(strings.NewReader(c.body))
	}
	op := r.opOf(req)
	if op == nil {
		t.Errorf("%s: no documented operation", what)
		return
	}
	item := r.doc.Paths.PathItems.GetOrZero(op.path)
	reqOK, reqErrs := r.v.ValidateHttpRequestSyncWithPathItem(vreq, item, op.path)
	if c.good && !reqOK {
		for _, e := range reqErrs {
			t.Errorf("%s: the request does not follow the document: %s: %s", what, e.Message, e.Reason)
		}
	}
	res, err := noRedirects.Do(req)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	defer res.Body.Close()
	if c.stalled {
		return
	}
	raw, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	res.Body = io.NopCloser(bytes.NewReader(raw))
	vreq = req.Clone(context.Background())
	vreq.URL.Host, vreq.URL.Scheme = "127.0.0.1:9090", "http"
	v := r.v
	if op.id == "openapi" {
		// The answer is this document, compared byte for byte in TestOpenAPIServed: its
		// schema declares the top-level fields only.
		v = r.loose
	}
	if ok, errs := v.GetResponseBodyValidator().ValidateResponseBodyWithPathItem(vreq, res, item, op.path); !ok {
		for _, e := range errs {
			t.Errorf("%s: answer %d %.160q does not follow the document: %s: %s", what, res.StatusCode, raw, e.Message, e.Reason)
		}
	}
	var e struct {
		Code string `json:"code"`
	}
	if strings.HasPrefix(res.Header.Get("Content-Type"), "application/json") {
		_ = json.Unmarshal(raw, &e)
	}
	if c.status != 0 && (res.StatusCode != c.status || e.Code != c.code) {
		t.Errorf("%s: %d %q (%.160q), want %d %q", what, res.StatusCode, e.Code, raw, c.status, c.code)
	}
	r.produced[fmt.Sprintf("%s %d %s", op.id, res.StatusCode, e.Code)] = true
	if res.StatusCode < 300 {
		for name := range req.URL.Query() {
			r.params[op.id+" "+name] = true
		}
		for _, p := range op.op.Parameters {
			if p.In == "path" {
				r.params[op.id+" "+p.Name] = true
			}
		}
	}
}

// slashAliases are the patterns that serve, at the address with a trailing slash, what a
// documented path serves without it: the document has no path ending in a slash (Redocly's
// no-path-trailing-slash), and the docs and Go's tools still use these addresses.
// TestSlashAliases checks that they answer as the documented path does.
var slashAliases = map[string]string{"GET /ui/{$}": "/ui", "GET /debug/pprof/": "/debug/pprof"}

func TestOpenAPIRoutes(t *testing.T) {
	doc, _ := oaDoc(t)
	ops := oaOps(t, doc)
	_, mux := build(Options{
		Ready: func() (bool, string) { return true, "" }, Metrics: http.NotFoundHandler(),
		Top: down{}, History: down{}, Keys: down{}, Quotas: down{}, Notifications: downOutbox{}, Reload: func() error { return nil },
		Logger: zap.NewNop(),
	})
	served := map[string]bool{}
	for _, o := range ops {
		req := httptest.NewRequest(o.method, "http://127.0.0.1"+o.example(), nil)
		_, pattern := mux.Handler(req)
		if pattern == "" || pattern == "/" {
			t.Errorf("%s %s is documented but not served (pattern %q)", o.method, o.path, pattern)
			continue
		}
		served[pattern] = true
	}
	for _, p := range mux.patterns {
		if _, alias := slashAliases[p]; p != "/" && !served[p] && !alias {
			t.Errorf("%s is served but no documented operation reaches it", p)
		}
	}
}

// The addresses with a trailing slash answer as the documented paths do: the usage page the
// same page, the profiles' index the same index, whose links resolve under /debug/pprof/ at
// either address.
func TestSlashAliases(t *testing.T) {
	s := newOAServers(t)
	get := func(path string) (int, string, string) {
		req, _ := http.NewRequest("GET", s.main.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+oaToken)
		res, err := noRedirects.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		return res.StatusCode, res.Header.Get("Content-Type"), string(body)
	}
	for alias, path := range map[string]string{"/ui/": "/ui", "/debug/pprof/": "/debug/pprof", "/ui/?partial=1": "/ui?partial=1"} {
		as, actype, abody := get(alias)
		ps, pctype, pbody := get(path)
		if as != 200 || ps != 200 || actype != pctype {
			t.Errorf("%s: %d %s; %s: %d %s", alias, as, actype, path, ps, pctype)
		}
		if path == "/ui" && (!strings.Contains(abody, `href="/ui/assets/style.css"`) || !strings.Contains(pbody, `href="/ui/assets/style.css"`)) {
			t.Errorf("%s or %s is not the usage page", alias, path)
		}
		if path == "/debug/pprof" {
			if !strings.Contains(pbody, `<base href="/debug/pprof/">`) || !strings.Contains(pbody, "goroutine?debug=2") {
				t.Errorf("/debug/pprof links nowhere:\n%s", pbody)
			}
			// The index shows live counts (goroutines, heap samples), which change between the
			// two reads: compared with the numbers masked.
			counts := regexp.MustCompile(`[0-9]+`)
			if counts.ReplaceAllString(strings.Replace(pbody, `<base href="/debug/pprof/">`, "", 1), "N") != counts.ReplaceAllString(abody, "N") {
				t.Errorf("/debug/pprof and /debug/pprof/ differ beyond the base element and the live counts")
			}
		}
	}
}

func TestOpenAPIServed(t *testing.T) {
	s := newOAServers(t)
	for _, srv := range []*httptest.Server{s.main, s.open} {
		req, _ := http.NewRequest("GET", srv.URL+"/openapi.json", nil)
		req.Header.Set("Authorization", "Bearer "+oaToken)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 200 || res.Header.Get("Content-Type") != "application/json" || !bytes.Equal(body, openAPI) {
			t.Fatalf("GET /openapi.json: %d %q, %d bytes; want 200 application/json and the document's %d bytes", res.StatusCode, res.Header.Get("Content-Type"), len(body), len(openAPI))
		}
	}
	onDisk, err := os.ReadFile("openapi.json")
	if err != nil || !bytes.Equal(onDisk, openAPI) {
		t.Fatalf("the embedded document is not admin/openapi.json: %v", err)
	}
}

var noRedirects = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

const oaKey = "svc_dsc_s3cr3tvalue0123456789abcdef"

// goodRequests are requests of each operation that its handler serves (target and body),
// where the document's examples are not enough.
var goodRequests = map[string][2]string{
	"usage_key":          {"", `{"key":"svc_abc"}`},
	"keys_add":           {"", `{"key":"` + oaKey + `","kind":"assistant","org":"acme","domains":["acme-docs"],"plan":"gold","label":"docs site"}`},
	"quota_grant":        {"", `{"limit":"agent_job_per_project","id":"proj-1","amount":50,"reason":"launch week"}`},
	"quota_override":     {"", `{"limit":500,"ttl":"1h","reason":"launch week"}`},
	"quota_override_end": {"/quota/overrides/agent_job_per_project/proj-1?reason=over", ""},
	"quota_reset":        {"", `{"limit":"agent_job_per_project","id":"proj-1","reason":"refund"}`},
	// Keys the outbox does not hold: the protection checks act on nothing.
	"notifications_retry": {"", `{"keys":["evt_nope/billing"]}`},
	"notifications_drop":  {"", `{"keys":["evt_nope/billing"]}`},
	"pprof_profile":       {"/debug/pprof/profile?seconds=1", ""},
	"pprof_trace":         {"/debug/pprof/trace?seconds=1", ""},
}

func (o oaOp) good(srv *httptest.Server) oaCall {
	c := oaCall{srv: srv, method: o.method, target: o.example(), good: true, status: 0}
	if g, ok := goodRequests[o.id]; ok {
		if g[0] != "" {
			c.target = g[0]
		}
		c.body = g[1]
	}
	return c
}

// oaExpiredKey is registered with an expiry past.
const oaExpiredKey = "svc_openapi_expired_key"

func TestOpenAPIDrive(t *testing.T) {
	doc, v := oaDoc(t)
	loose, errs := validator.NewValidator(mustDoc(t))
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	r := &oaRun{t: t, doc: doc, v: v, loose: loose, ops: oaOps(t, doc), produced: map[string]bool{}, params: map[string]bool{}}
	s := newOAServers(t)
	// Some use to read back.
	for range 3 {
		req, _ := http.NewRequest("POST", s.public.URL+"/v2/agent/proj-1/job", strings.NewReader(`{"prompt":"x"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer svc_openapi_admin_key")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != 200 {
			t.Fatalf("public request: %d", res.StatusCode)
		}
	}
	digest := auth.Digest(oaKey)
	unsure := 0 // the status is not asserted: the answer is still validated and counted
	main := s.main
	calls := []oaCall{
		{srv: main, method: "GET", target: "/healthz", auth: "none", good: true, status: 200},
		{srv: main, method: "GET", target: "/readyz", auth: "none", good: true, status: 200},
		{srv: main, method: "GET", target: "/metrics", good: true, status: 200},
		{srv: main, method: "GET", target: "/openapi.json", good: true, status: 200},
		{srv: main, method: "GET", target: "/usage/projects/proj-1", good: true, status: 200},
		{srv: main, method: "GET", target: "/usage/orgs/acme", good: true, status: 200},
		{srv: main, method: "GET", target: "/usage/ips/192.0.2.7", good: true, status: 200},
		{srv: main, method: "GET", target: "/usage/ips/not-an-ip", status: 400, code: "invalid_request"},
		{srv: main, method: "POST", target: "/usage/key", body: `{"key":"svc_abc"}`, good: true, status: 200},
		{srv: main, method: "POST", target: "/usage/key", body: `{"key":""}`, status: 400, code: "invalid_request"},
		{srv: main, method: "GET", target: "/usage/top", good: true, status: 200},
		{srv: main, method: "GET", target: "/usage/top?limit=agent_job_per_project&n=5", good: true, status: 200},
		{srv: main, method: "GET", target: "/usage/top?n=0", status: 400, code: "invalid_request"},
		{srv: main, method: "GET", target: "/usage/top?limit=nope", good: true, status: 404, code: "unknown_limit"},
		{srv: main, method: "GET", target: "/usage/history?limit=agent_job_per_project&id=proj-1", good: true, status: 200},
		{srv: main, method: "GET", target: "/usage/history?limit=agent_job_per_project", status: 400, code: "invalid_request"},
		{srv: main, method: "GET", target: "/usage/history?limit=agent_job_per_project&id=proj-1&unit=tokens", good: true, status: 200},
		{srv: main, method: "GET", target: "/usage/history?limit=agent_job_per_project&id=proj-1&unit=streams", status: 400, code: "invalid_request"},
		{srv: main, method: "GET", target: "/usage/export?limit=agent_job_per_project&window=current&unit=requests", good: true, status: 200},
		{srv: main, method: "GET", target: "/usage/history?limit=nope&id=proj-1", good: true, status: 404, code: "unknown_limit"},
		{srv: main, method: "GET", target: "/usage/export?limit=agent_job_per_project&window=current&format=json", good: true, status: 200},
		{srv: main, method: "GET", target: "/usage/export?limit=agent_job_per_project&window=previous&format=csv", good: true, status: 200},
		{srv: main, method: "GET", target: "/usage/export?limit=agent_job_per_project&window=2001-01-01T00:00:00Z", good: true, status: 404, code: "unknown_window"},
		{srv: main, method: "GET", target: "/usage/export?limit=nope&window=current", good: true, status: 404, code: "unknown_limit"},
		{srv: main, method: "GET", target: "/usage/export?limit=agent_job_per_project&window=current&format=xml", status: 400, code: "invalid_request"},
		{srv: main, method: "GET", target: "/usage/export?limit=agent_job_per_project&window=current", header: map[string]string{"Sec-Fetch-Site": "cross-site"}, status: 403, code: "cross_origin_refused"},
		{srv: main, method: "POST", target: "/keys", body: goodRequests["keys_add"][1], good: true, status: 201},
		{srv: main, method: "POST", target: "/keys", body: `{"digest":"` + auth.Digest("svc_other") + `","kind":"admin","org":"acme","projects":["*"],"created":"2027-01-01","revoked":"2030-01-01T00:00:00Z"}`, good: true, status: 201},
		{srv: main, method: "POST", target: "/keys", body: `{"kind":"x"}`, status: 400, code: "invalid_request"},
		{srv: main, method: "GET", target: "/keys", good: true, status: 200},
		{srv: main, method: "DELETE", target: "/keys/" + digest, good: true, status: 200},
		{srv: main, method: "POST", target: "/keys", body: goodRequests["keys_add"][1], good: true, status: 409, code: "key_revoked"},
		{srv: main, method: "DELETE", target: "/keys/" + strings.Repeat("0", 64), good: true, status: 404, code: "not_found"},
		{srv: main, method: "POST", target: "/keys/" + auth.Digest("svc_other") + "/rotate", good: true, status: 201},
		{srv: main, method: "POST", target: "/keys/" + auth.Digest("svc_other") + "/rotate", body: `{"overlap":"0s"}`, good: true, status: 409, code: "key_rotated"},
		{srv: main, method: "POST", target: "/keys/" + digest + "/rotate", body: `{"overlap":"7d","expires":"2099-01-01"}`, good: true, status: 409, code: "key_revoked"},
		{srv: main, method: "POST", target: "/keys/" + auth.Digest(oaExpiredKey) + "/rotate", good: true, status: 409, code: "key_expired"},
		{srv: main, method: "POST", target: "/keys", body: `{"digest":"` + auth.Digest(oaExpiredKey) + `","kind":"admin","org":"acme","projects":["*"]}`, good: true, status: 409, code: "key_expired"},
		{srv: main, method: "POST", target: "/keys/" + strings.Repeat("0", 64) + "/rotate", good: true, status: 404, code: "not_found"},
		{srv: main, method: "POST", target: "/keys/" + auth.Digest("svc_other") + "/rotate", body: `{"overlap":"-1h"}`, status: 400, code: "invalid_request"},
		{srv: main, method: "DELETE", target: "/keys/not-a-digest", status: 400, code: "invalid_request"},
		{srv: main, method: "POST", target: "/quota/grants", body: goodRequests["quota_grant"][1], good: true, status: 201},
		{srv: main, method: "POST", target: "/quota/grants", body: `{"limit":"agent_job_per_project","id":"proj-1","amount":0,"reason":"x"}`, status: 400, code: "invalid_request"},
		{srv: main, method: "POST", target: "/quota/grants", body: `{"limit":"nope","id":"proj-1","amount":5,"reason":"x"}`, good: true, status: 404, code: "unknown_limit"},
		{srv: main, method: "PUT", target: "/quota/overrides/agent_job_per_project/proj-1", body: goodRequests["quota_override"][1], good: true, status: 200},
		{srv: main, method: "GET", target: "/usage/projects/proj-1", good: true, status: 200}, // with the grant and the override
		{srv: main, method: "GET", target: "/usage/top?limit=agent_job_per_project", good: true, status: 200},
		{srv: main, method: "GET", target: "/quota/overrides", good: true, status: 200},
		{srv: main, method: "PUT", target: "/quota/overrides/agent_job_per_project/proj-1", body: `{"limit":400,"expires":"` + time.Now().Add(time.Hour).UTC().Format(time.RFC3339) + `","reason":"again"}`, good: true, status: 200},
		{srv: main, method: "PUT", target: "/quota/overrides/agent_job_per_project/proj-1", body: `{"limit":400,"ttl":"8x","reason":"x"}`, status: 400, code: "invalid_request"},
		{srv: main, method: "PUT", target: "/quota/overrides/nope/proj-1", body: goodRequests["quota_override"][1], good: true, status: 404, code: "unknown_limit"},
		{srv: main, method: "DELETE", target: "/quota/overrides/agent_job_per_project/proj-1?reason=over", good: true, status: 200},
		{srv: main, method: "DELETE", target: "/quota/overrides/agent_job_per_project/proj-1?reason=over", good: true, status: 404, code: "unknown_override"},
		{srv: main, method: "DELETE", target: "/quota/overrides/nope/proj-1", body: `{"reason":"over"}`, good: true, status: 404, code: "unknown_limit"},
		{srv: main, method: "DELETE", target: "/quota/overrides/agent_job_per_project/proj-1", status: 400, code: "invalid_request"},
		{srv: main, method: "POST", target: "/quota/resets", body: goodRequests["quota_reset"][1], good: true, status: 200},
		{srv: main, method: "POST", target: "/quota/resets", body: `{"limit":"agent_job_per_project","id":"proj-1"}`, status: 400, code: "invalid_request"},
		{srv: main, method: "POST", target: "/quota/resets", body: `{"limit":"nope","id":"proj-1","reason":"x"}`, good: true, status: 404, code: "unknown_limit"},
		{srv: main, method: "GET", target: "/quota/audit?n=10", good: true, status: 200},
		{srv: main, method: "GET", target: "/quota/audit?n=0", status: 400, code: "invalid_request"},
		{srv: main, method: "GET", target: "/notifications", good: true, status: 200},
		{srv: main, method: "GET", target: "/notifications?state=pending&n=10", good: true, status: 200},
		{srv: main, method: "GET", target: "/notifications?state=gone", status: 400, code: "invalid_request"},
		{srv: main, method: "GET", target: "/notifications?n=1001", status: 400, code: "invalid_request"},
		{srv: main, method: "POST", target: "/notifications/retry", body: `{"keys":["` + s.dead1 + `","` + s.pending + `"]}`, good: true, status: 200},
		{srv: main, method: "POST", target: "/notifications/drop", body: `{"keys":["` + s.dead2 + `","evt_nope/billing"]}`, good: true, status: 200},
		{srv: main, method: "POST", target: "/notifications/drop", body: `{"keys":[]}`, status: 400, code: "invalid_request"},
		{srv: main, method: "POST", target: "/notifications/retry", body: `{"keys":["no slash"]}`, status: 400, code: "invalid_request"},
		{srv: main, method: "GET", target: "/notifications?state=dead&n=5", good: true, status: 200},
		{srv: main, method: "POST", target: "/reload", good: true, status: 200},
		{srv: main, method: "GET", target: "/ui", good: true, status: 200},
		{srv: main, method: "GET", target: "/ui?partial=1", good: true, status: 200},
		{srv: main, method: "GET", target: "/ui/assets/app.js", good: true, status: 200},
		{srv: main, method: "GET", target: "/ui/assets/style.css", good: true, status: 200},
		{srv: main, method: "GET", target: "/ui/assets/favicon.svg", good: true, status: 200},
		{srv: main, method: "GET", target: "/ui/assets/nope.js", good: true, status: 404},
		{srv: main, method: "GET", target: "/debug/pprof", good: true, status: 200},
		{srv: main, method: "GET", target: "/debug/pprof/cmdline", good: true, status: 200},
		{srv: main, method: "GET", target: "/debug/pprof/symbol", good: true, status: 200},
		{srv: main, method: "GET", target: "/debug/pprof/profile?seconds=1", good: true, status: 200},
		{srv: main, method: "GET", target: "/debug/pprof/trace?seconds=1", good: true, status: 200},
		{srv: main, method: "GET", target: "/debug/pprof/heap?debug=1&gc=1", good: true, status: 200},
		{srv: main, method: "GET", target: "/debug/pprof/allocs?seconds=1", good: true, status: 200},
		{srv: main, method: "GET", target: "/debug/pprof/nope", good: true, status: 404},
	}
	for _, c := range calls {
		r.do(c)
	}
	s.notReady.Store(true)
	r.do(oaCall{srv: main, method: "GET", target: "/readyz", auth: "none", good: true, status: 503})
	s.reloadFails.Store(true)
	r.do(oaCall{srv: main, method: "POST", target: "/reload", good: true, status: 422, code: "reload_rejected"})

	// The protection layer, on every documented operation.
	r.do(oaCall{srv: s.limited, method: "GET", target: "/metrics", auth: "wrong", status: 401, code: "invalid_credentials"})
	for _, o := range r.ops {
		guarded := o.op.Security == nil
		_, pattern := s.mux.Handler(httptest.NewRequest(o.method, "http://127.0.0.1"+o.example(), nil))
		_, write := s.mux.writes[pattern]
		unsafe := unsafeMethod(o.method)
		// One CPU profile or trace at a time: those served are driven above only.
		profiles := o.id == "pprof_profile" || o.id == "pprof_trace"
		c := o.good(main)
		c.host, c.good, c.status, c.code = "evil.example:80", false, 421, "misdirected_request"
		r.do(c)
		c = o.good(main)
		c.auth, c.good, c.status = "none", false, unsure
		if guarded {
			c.status, c.code = 401, "invalid_credentials"
		}
		r.do(c)
		if guarded {
			c = o.good(main)
			c.auth, c.good, c.status, c.code = "basic:ops\u2028forged", false, 400, "invalid_request"
			r.do(c)
			c = o.good(s.limited)
			c.auth, c.good, c.status, c.code = "wrong", false, 429, "too_many_auth_failures"
			r.do(c)
		}
		if profiles {
			continue
		}
		c = o.good(main)
		c.header, c.good, c.status = map[string]string{"Sec-Fetch-Site": "cross-site"}, false, unsure
		if unsafe {
			c.status, c.code = 403, "cross_origin_refused"
		}
		r.do(c)
		c = o.good(s.open)
		c.auth, c.good, c.status = "none", false, unsure
		if write {
			c.status, c.code = 403, "admin_token_required"
		}
		r.do(c)
		if unsafe {
			c = o.good(main)
			if c.body == "" {
				c.body = "reason=x"
			}
			c.ctype, c.good, c.status, c.code = "application/x-www-form-urlencoded", false, 415, "unsupported_media_type"
			r.do(c)
		}
		// On stores that fail.
		c = o.good(s.down)
		c.status = unsure
		r.do(c)
	}

	// Exports beyond the replica's bound.
	f := &fakeExports{n: 3, row: plainRow, hold: make(chan struct{})}
	o := Options{MaxExports: 1, Token: oaToken, Ready: func() (bool, string) { return true, "" }, Metrics: http.NotFoundHandler(),
		History: f, TopTimeout: 10 * time.Second, UsageTimeout: time.Second, Logger: zap.NewNop()}
	h, _ := build(o)
	busy := httptest.NewServer(h)
	defer busy.Close()
	held := make(chan struct{})
	go func() {
		defer close(held)
		req, _ := http.NewRequest("GET", busy.URL+"/usage/export?limit=per_project&window=current", nil)
		req.Header.Set("Authorization", "Bearer "+oaToken)
		if res, err := http.DefaultClient.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
		}
	}()
	for deadline := time.Now().Add(10 * time.Second); f.opened.Load() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first export did not start")
		}
	}
	r.do(oaCall{srv: busy, method: "GET", target: "/usage/export?limit=per_project&window=current", good: true, status: 429, code: "too_many_exports"})
	close(f.hold)
	<-held

	// Every documented answer was produced, and every documented parameter sent.
	for _, o := range r.ops {
		for _, d := range o.documented() {
			if !r.produced[d] && notDriven[d] == "" {
				t.Errorf("documented but never produced: %q", d)
			}
		}
		for _, p := range o.op.Parameters {
			if !r.params[o.id+" "+p.Name] {
				t.Errorf("%s: parameter %s documented but never sent in a served request", o.id, p.Name)
			}
		}
	}
	var got []string
	for k := range r.produced {
		got = append(got, k)
	}
	sort.Strings(got)
	t.Logf("%d answers produced: %s", len(got), strings.Join(got, "; "))
}
