package rls

import (
	"context"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/engine"
	"github.com/docsgate/gateway/internal/redistest"
	"github.com/docsgate/gateway/limits"
	"github.com/docsgate/gateway/metrics"
)

// referenceConfig maps the domains and descriptors of Envoy's reference service's integration
// tests (basic and another) to limits of the same allowances and windows, and a shadow limit.
const referenceConfig = `
listen: 127.0.0.1:18080
admin_listen: 127.0.0.1:19090
upstream: {url: "http://127.0.0.1:1"}
limits:
  key1_per_second: {limit: 50, window: 1s, by: project}
  key2_per_minute: {limit: 20, window: 1m, by: project}
  key3_per_hour: {limit: 10, window: hour, by: project}
  key4_per_day: {limit: 20, window: day, by: project}
  shadow_per_minute: {limit: 2, window: 1m, by: project, mode: shadow}
  tokens_per_hour: {limit: 100, window: hour, by: org, unit: tokens}
  per_ip: {limit: 3, window: hour, by: ip}
redis: {timeout: 2s} # exact counts under -race on a busy machine
rate_limit_service:
  listen: 127.0.0.1:18081
  domains:
    - domain: basic
      descriptors:
        - {entries: [{key: key1}], limits: [key1_per_second]}
    - domain: another
      descriptors:
        - {entries: [{key: key2}], limits: [key2_per_minute]}
        - {entries: [{key: key3}], limits: [key3_per_hour]}
        - {entries: [{key: key4}], limits: [key4_per_day]}
        - {entries: [{key: shadow}], limits: [shadow_per_minute]}
        - {entries: [{key: ai}, {key: org}], limits: [tokens_per_hour]}
        - {entries: [{key: remote_address}], limits: [per_ip]}
`

// harness is a service on a real gRPC server on loopback, and the generated client.
type harness struct {
	client rlsv3.RateLimitServiceClient
	svc    *Service
	eng    *engine.Engine
	reg    *prometheus.Registry
}

func start(t testing.TB, yaml string, store engine.Limiter, allowOnError bool) *harness {
	t.Helper()
	cfg, err := config.Parse(strings.NewReader(yaml), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	eng := engine.New(engine.Options{Limiter: store, Metrics: m, Logger: zap.NewNop()})
	pol, err := eng.Compile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	eng.Use(pol)
	svc := New(Options{Engine: eng, AllowOnError: allowOnError, Metrics: m, Logger: zap.NewNop()}, cfg.RateLimitService)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	svc.Register(g)
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	return &harness{client: rlsv3.NewRateLimitServiceClient(conn), svc: svc, eng: eng, reg: reg}
}

// desc is a descriptor of key/value pairs.
func desc(kv ...string) *commonv3.RateLimitDescriptor {
	d := &commonv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func withHits(d *commonv3.RateLimitDescriptor, n uint64) *commonv3.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

func (h *harness) call(t *testing.T, domain string, hits uint32, ds ...*commonv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := h.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds, HitsAddend: hits})
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	return resp
}

// want is a descriptor status: code, limit (0: none shown), unit, remaining.
type want struct {
	code      rlsv3.RateLimitResponse_Code
	limit     uint32
	unit      rlsv3.RateLimitResponse_RateLimit_Unit
	remaining uint32
}

func expect(t *testing.T, step string, resp *rlsv3.RateLimitResponse, overall rlsv3.RateLimitResponse_Code, ws ...want) {
	t.Helper()
	if resp.GetOverallCode() != overall || len(resp.GetStatuses()) != len(ws) {
		t.Fatalf("%s: overall %v with %d statuses, want %v with %d: %v", step, resp.GetOverallCode(), len(resp.GetStatuses()), overall, len(ws), resp)
	}
	for i, w := range ws {
		st := resp.GetStatuses()[i]
		if st.GetCode() != w.code || st.GetLimitRemaining() != w.remaining {
			t.Fatalf("%s: status %d: %v remaining %d, want %v remaining %d", step, i, st.GetCode(), st.GetLimitRemaining(), w.code, w.remaining)
		}
		if w.limit == 0 {
			if st.GetCurrentLimit() != nil || st.GetDurationUntilReset() != nil {
				t.Fatalf("%s: status %d shows a limit for a descriptor nothing maps: %v", step, i, st)
			}
			continue
		}
		cl := st.GetCurrentLimit()
		if cl.GetRequestsPerUnit() != w.limit || cl.GetUnit() != w.unit || st.GetDurationUntilReset() == nil {
			t.Fatalf("%s: status %d: limit %v, want %d per %v with a duration until reset", step, i, st, w.limit, w.unit)
		}
	}
}

// stores are the in-process store and a real redis-server.
func stores(t *testing.T) map[string]func(t *testing.T) engine.Limiter {
	srv := redistest.Start(t)
	n := 0
	return map[string]func(t *testing.T) engine.Limiter{
		"memory": func(*testing.T) engine.Limiter { return limits.NewMemory() },
		"redis": func(t *testing.T) engine.Limiter {
			n++
			r, err := limits.NewRedis(srv.Client(t), "rls"+strings.Repeat("x", n))
			if err != nil {
				t.Fatal(err)
			}
			return r
		},
	}
}

// TestReferenceCases replays the request/response cases of Envoy's reference service's
// integration tests through the gRPC client: an unknown domain, one descriptor, a minute limit
// run past, two descriptors of one domain in order, and the duration until reset running
// down; then hits_addend, shadow limits and unknown descriptors beside known ones.
func TestReferenceCases(t *testing.T) {
	for name, store := range stores(t) {
		t.Run(name, func(t *testing.T) {
			h := start(t, referenceConfig, store(t), false)
			const (
				OK   = rlsv3.RateLimitResponse_OK
				OVER = rlsv3.RateLimitResponse_OVER_LIMIT
				SEC  = rlsv3.RateLimitResponse_RateLimit_SECOND
				MIN  = rlsv3.RateLimitResponse_RateLimit_MINUTE
				HOUR = rlsv3.RateLimitResponse_RateLimit_HOUR
			)
			// A domain nothing maps: OK, no limit.
			expect(t, "unknown domain", h.call(t, "foo", 1, desc("hello", "world")), OK, want{code: OK})
			// One descriptor: 50 a second, 49 left.
			expect(t, "key1", h.call(t, "basic", 1, desc("key1", "foo")), OK, want{OK, 50, SEC, 49})
			// 25 calls against 20 a minute: 20 OK counting down, then OVER_LIMIT with 0 left.
			for i := range 25 {
				w := want{OK, 20, MIN, uint32(max(20-(i+1), 0))}
				overall := OK
				if i >= 20 {
					w.code, overall = OVER, OVER
				}
				expect(t, "key2 call "+itoa(i), h.call(t, "another", 1, desc("key2", "run")), overall, w)
			}
			// Two descriptors in order, 20 a minute and 10 an hour: once the hour limit is
			// spent the call is refused whole, and the minute limit keeps its 10 (the
			// gateway's all-or-nothing; the reference service counts it on).
			for i := range 15 {
				w1 := want{OK, 20, MIN, uint32(20 - (i + 1))}
				w2 := want{OK, 10, HOUR, uint32(10 - (i + 1))}
				overall := OK
				if i >= 10 {
					w1.remaining, w2.code, w2.remaining, overall = 10, OVER, 0, OVER
				}
				expect(t, "key2+key3 call "+itoa(i), h.call(t, "another", 1, desc("key2", "pair"), desc("key3", "pair")), overall, w1, w2)
			}
			// hits_addend: the request's (0 counts as 1), a descriptor's own (0 checks).
			expect(t, "request hits 5", h.call(t, "another", 5, desc("key4", "hits")), OK, want{OK, 20, rlsv3.RateLimitResponse_RateLimit_DAY, 15})
			expect(t, "request hits 0", h.call(t, "another", 0, desc("key4", "hits")), OK, want{OK, 20, rlsv3.RateLimitResponse_RateLimit_DAY, 14})
			expect(t, "descriptor hits 0", h.call(t, "another", 5, withHits(desc("key4", "hits"), 0)), OK, want{OK, 20, rlsv3.RateLimitResponse_RateLimit_DAY, 14})
			expect(t, "descriptor hits 15 of 14", h.call(t, "another", 1, withHits(desc("key4", "hits"), 15)), OVER, want{OVER, 20, rlsv3.RateLimitResponse_RateLimit_DAY, 14})
			expect(t, "descriptor hits 14", h.call(t, "another", 1, withHits(desc("key4", "hits"), 14)), OK, want{OK, 20, rlsv3.RateLimitResponse_RateLimit_DAY, 0})
			// Shadow: OK whatever it says, and counted (2 a minute: 1, 0, then 0 left).
			for i, rem := range []uint32{1, 0, 0} {
				expect(t, "shadow call "+itoa(i), h.call(t, "another", 1, desc("shadow", "s")), OK, want{OK, 2, MIN, rem})
			}
			// Unknown descriptors beside known ones: OK without a limit, in their place.
			expect(t, "unknown beside known", h.call(t, "another", 1, desc("nope", "x"), desc("key3", "mixed"), desc("key3", "a", "extra", "b")),
				OK, want{code: OK}, want{OK, 10, HOUR, 9}, want{code: OK})
			// A refused descriptor takes nothing from the others of the call.
			for range 3 {
				h.call(t, "another", 1, desc("remote_address", "192.0.2.7"))
			}
			expect(t, "ip spent", h.call(t, "another", 1, desc("key3", "mixed"), desc("remote_address", "192.0.2.7")),
				OVER, want{OK, 10, HOUR, 9}, want{OVER, 3, HOUR, 0})
			expect(t, "nothing taken", h.call(t, "another", 1, withHits(desc("key3", "mixed"), 0)), OK, want{OK, 10, HOUR, 9})
			// A call that counts nothing after calls that did: no limit, no header of theirs.
			for _, domain := range []string{"foo", "another"} {
				resp := h.call(t, domain, 1, desc("nope", "x"))
				expect(t, "nothing counted in "+domain, resp, OK, want{code: OK})
				if len(resp.GetResponseHeadersToAdd()) != 0 {
					t.Fatalf("nothing counted in %s: headers %v", domain, resp.GetResponseHeadersToAdd())
				}
			}
		})
	}
}

// TestDurationUntilResetRunsDown: the same descriptor asked twice, two seconds apart.
func TestDurationUntilResetRunsDown(t *testing.T) {
	t.Parallel() // it sleeps
	h := start(t, referenceConfig, limits.NewMemory(), false)
	first := h.call(t, "another", 1, desc("key4", "dur")).GetStatuses()[0].GetDurationUntilReset().AsDuration()
	time.Sleep(2 * time.Second)
	second := h.call(t, "another", 1, desc("key4", "dur")).GetStatuses()[0].GetDurationUntilReset().AsDuration()
	if second >= first || first > 24*time.Hour {
		t.Fatalf("duration until reset %v then %v", first, second)
	}
}

// TestTokensOnStreamDone: a tokens limit is checked with hits 0 (an Envoy AI Gateway's
// request) and debited the hits it reports when the stream is done, as the proxy's answers are.
func TestTokensOnStreamDone(t *testing.T) {
	for name, store := range stores(t) {
		t.Run(name, func(t *testing.T) {
			h := start(t, referenceConfig, store(t), false)
			ai := func(hits uint64) *commonv3.RateLimitDescriptor {
				return withHits(desc("ai", "gpt", "org", "tok"), hits)
			}
			const OK, OVER = rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
			HOUR := rlsv3.RateLimitResponse_RateLimit_HOUR
			expect(t, "check", h.call(t, "another", 1, ai(0)), OK, want{OK, 100, HOUR, 100})
			expect(t, "stream done, 60", h.call(t, "another", 1, ai(60)), OK, want{OK, 100, HOUR, 40})
			expect(t, "stream done, 50", h.call(t, "another", 1, ai(50)), OVER, want{OVER, 100, HOUR, 0})
			expect(t, "check when spent", h.call(t, "another", 1, ai(0)), OVER, want{OVER, 100, HOUR, 0})
		})
	}
}

// TestInvalidRequests: each malformed request is INVALID_ARGUMENT naming its field.
func TestInvalidRequests(t *testing.T) {
	h := start(t, referenceConfig, limits.NewMemory(), false)
	neg := desc("key2", "x")
	neg.IsNegativeHits = true
	for _, c := range []struct {
		req   *rlsv3.RateLimitRequest
		field string
	}{
		{&rlsv3.RateLimitRequest{Descriptors: []*commonv3.RateLimitDescriptor{desc("key2", "x")}}, "domain"},
		{&rlsv3.RateLimitRequest{Domain: "another"}, "descriptors"},
		{&rlsv3.RateLimitRequest{Domain: "another", Descriptors: []*commonv3.RateLimitDescriptor{{}}}, "descriptors[0].entries"},
		{&rlsv3.RateLimitRequest{Domain: "another", Descriptors: []*commonv3.RateLimitDescriptor{desc("key2", "x"), desc("", "x")}}, "descriptors[1].entries[0].key"},
		{&rlsv3.RateLimitRequest{Domain: "another", Descriptors: []*commonv3.RateLimitDescriptor{neg}}, "descriptors[0].is_negative_hits"},
		{&rlsv3.RateLimitRequest{Domain: "another", Descriptors: []*commonv3.RateLimitDescriptor{withHits(desc("key2", "x"), 1<<60)}}, "descriptors[0].hits_addend"},
		{&rlsv3.RateLimitRequest{Domain: "another", Descriptors: []*commonv3.RateLimitDescriptor{desc("remote_address", "not-an-ip")}}, "descriptors[0].entries[0].value"},
		{&rlsv3.RateLimitRequest{Domain: "another", Descriptors: []*commonv3.RateLimitDescriptor{desc("key2", "")}}, "descriptors[0].entries[0].value"},
		{&rlsv3.RateLimitRequest{Domain: "another", Descriptors: slices.Repeat([]*commonv3.RateLimitDescriptor{desc("key2", "x")}, maxDescriptors+1)}, "descriptors"},
		{&rlsv3.RateLimitRequest{Domain: "another", Descriptors: []*commonv3.RateLimitDescriptor{desc(slices.Repeat([]string{"k", "v"}, maxEntries+1)...)}}, "descriptors[0].entries"},
		{&rlsv3.RateLimitRequest{Domain: "another", Descriptors: []*commonv3.RateLimitDescriptor{desc("key2", strings.Repeat("x", maxValue+1))}}, "descriptors[0].entries[0].value"},
		{&rlsv3.RateLimitRequest{Domain: "another", Descriptors: []*commonv3.RateLimitDescriptor{desc(strings.Repeat("k", maxValue+1), "x")}}, "descriptors[0].entries[0].key"},
	} {
		_, err := h.client.ShouldRateLimit(context.Background(), c.req)
		if status.Code(err) != codes.InvalidArgument || !strings.HasPrefix(status.Convert(err).Message(), c.field+": ") {
			t.Errorf("%v: got %v, want INVALID_ARGUMENT naming %s", c.req, err, c.field)
		}
	}
}

// TestStoreFailure: a Redis that is gone answers as redis.on_error says.
func TestStoreFailure(t *testing.T) {
	srv := redistest.Start(t)
	for _, allow := range []bool{false, true} {
		r, err := limits.NewRedis(srv.Client(t), "down")
		if err != nil {
			t.Fatal(err)
		}
		h := start(t, referenceConfig, r, allow)
		if !allow {
			srv.Stop(t)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		resp, err := h.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "another", Descriptors: []*commonv3.RateLimitDescriptor{desc("key2", "x"), desc("nope", "y")}})
		cancel()
		if !allow {
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("on_error deny: %v %v, want UNAVAILABLE", resp, err)
			}
			continue
		}
		if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || len(resp.GetStatuses()) != 2 {
			t.Fatalf("on_error allow: %v %v, want OK for both descriptors", resp, err)
		}
	}
}

// TestConcurrentCallsExact: 40 concurrent calls against a limit of 20 over two services
// sharing one Redis admit exactly 20.
func TestConcurrentCallsExact(t *testing.T) {
	srv := redistest.Start(t)
	var hs [2]*harness
	for i := range hs {
		r, err := limits.NewRedis(srv.Client(t), "exact")
		if err != nil {
			t.Fatal(err)
		}
		hs[i] = start(t, referenceConfig, r, false)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok := 0
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp := hs[i%2].call(t, "another", 1, desc("key2", "concurrent"))
			if resp.GetOverallCode() == rlsv3.RateLimitResponse_OK {
				mu.Lock()
				ok++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if ok != 20 {
		t.Fatalf("%d of 40 admitted, want 20", ok)
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

// TestKeyDigestDescriptors: with id key_digest, the registry resolves a digest to the key, its
// org and its plan: limits by key count the key, limits by org its org, each in the key's plan;
// a digest the registry does not know, or a revoked key, counts nothing; a value that is no
// digest is INVALID_ARGUMENT.
func TestKeyDigestDescriptors(t *testing.T) {
	const yaml = `
listen: 127.0.0.1:18080
admin_listen: 127.0.0.1:19090
upstream: {url: "http://127.0.0.1:1"}
auth: {mode: registry, keys_file: /nonexistent/keys.yaml}
orgs: {acme: [acme-docs]}
plans:
  gold: {assistant_per_key: {limit: 5}}
limits:
  assistant_per_key: {limit: 2, window: hour}
  assistant_per_org: {limit: 3, window: hour}
rate_limit_service:
  listen: 127.0.0.1:18081
  domains:
    - domain: docsgate
      descriptors:
        - {entries: [{key: api_key}], id: key_digest, limits: [assistant_per_key, assistant_per_org]}
`
	cfg, err := config.Parse(strings.NewReader(yaml), func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	gold, plain, revoked := auth.Digest("svc_dsc_gold"), auth.Digest("svc_dsc_plain"), auth.Digest("svc_dsc_revoked")
	when := time.Now()
	reg, err := auth.NewMemoryRegistry([]auth.Entry{
		{Digest: gold, Kind: "assistant", Org: "acme", Plan: "gold", Domains: []string{"*"}, Created: when},
		{Digest: plain, Kind: "assistant", Org: "acme", Domains: []string{"*"}, Created: when},
		{Digest: revoked, Kind: "assistant", Org: "acme", Domains: []string{"*"}, Created: when, Revoked: &when},
	})
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New(prometheus.NewRegistry())
	eng := engine.New(engine.Options{Limiter: limits.NewMemory(), Metrics: m, Logger: zap.NewNop()})
	pol, err := eng.Compile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	eng.Use(pol)
	svc := New(Options{Engine: eng, Registry: reg, Metrics: m, Logger: zap.NewNop()}, cfg.RateLimitService)
	ask := func(digest string) (*rlsv3.RateLimitResponse, error) {
		return svc.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "docsgate", Descriptors: []*commonv3.RateLimitDescriptor{desc("api_key", digest)}})
	}
	// The gold key (5 an hour by key) and the plain key (2) share acme's 3 an hour.
	for i, c := range []struct {
		digest    string
		code      rlsv3.RateLimitResponse_Code
		name      string
		remaining uint32
	}{
		{gold, rlsv3.RateLimitResponse_OK, "assistant_per_org", 2},
		{plain, rlsv3.RateLimitResponse_OK, "assistant_per_key", 1}, // a tie: the first limit shows
		{plain, rlsv3.RateLimitResponse_OK, "assistant_per_key", 0},
		{gold, rlsv3.RateLimitResponse_OVER_LIMIT, "assistant_per_org", 0},
	} {
		resp, err := ask(c.digest)
		if err != nil || resp.GetOverallCode() != c.code {
			t.Fatalf("call %d: %v %v, want %v", i, resp, err, c.code)
		}
		st := resp.GetStatuses()[0]
		if st.GetCurrentLimit().GetName() != c.name || st.GetLimitRemaining() != c.remaining {
			t.Fatalf("call %d: %v, want %s with %d left", i, st, c.name, c.remaining)
		}
	}
	for _, digest := range []string{revoked, auth.Digest("svc_dsc_unknown")} {
		resp, err := ask(digest)
		if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || len(resp.GetStatuses()) != 1 || resp.GetStatuses()[0].GetCurrentLimit() != nil {
			t.Fatalf("unknown or revoked key: %v %v, want OK counting nothing", resp, err)
		}
	}
	if _, err := ask("svc_dsc_not_a_digest"); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("a key instead of its digest: %v, want INVALID_ARGUMENT", err)
	}
}

// TestSameCounterTwiceInOneCall: descriptors of one call that count the same limit and tenant
// take their units' sum from it, all or nothing: two of 15 on a limit of 20 are refused (both
// shown OVER_LIMIT) and take nothing (two of 10 are admitted after), two of 10 take all 20;
// hits adding up past the counter's bound are INVALID_ARGUMENT. Before, each was admitted against the count before
// the call and only one was counted.
func TestSameCounterTwiceInOneCall(t *testing.T) {
	for name, store := range stores(t) {
		t.Run(name, func(t *testing.T) {
			h := start(t, referenceConfig, store(t), false)
			over := want{code: rlsv3.RateLimitResponse_OVER_LIMIT, limit: 20, unit: rlsv3.RateLimitResponse_RateLimit_MINUTE, remaining: 20}
			expect(t, "15 + 15 of 20", h.call(t, "another", 0, withHits(desc("key2", "p"), 15), desc("key9", "x"), withHits(desc("key2", "p"), 15)),
				rlsv3.RateLimitResponse_OVER_LIMIT, over, want{code: rlsv3.RateLimitResponse_OK}, over)
			ok := want{code: rlsv3.RateLimitResponse_OK, limit: 20, unit: rlsv3.RateLimitResponse_RateLimit_MINUTE, remaining: 0}
			expect(t, "10 + 10 of 20", h.call(t, "another", 0, withHits(desc("key2", "p"), 10), withHits(desc("key2", "p"), 10)),
				rlsv3.RateLimitResponse_OK, ok, ok)
			over.remaining = 0
			expect(t, "a check after", h.call(t, "another", 0, withHits(desc("key2", "p"), 0)), rlsv3.RateLimitResponse_OVER_LIMIT, over)
			_, err := h.client.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "another", Descriptors: []*commonv3.RateLimitDescriptor{
				withHits(desc("key3", "q"), limits.MaxLimit), withHits(desc("key3", "q"), limits.MaxLimit)}})
			if status.Code(err) != codes.InvalidArgument || !strings.HasPrefix(status.Convert(err).Message(), "descriptors[1].entries[0].value: ") {
				t.Fatalf("hits past the counter's bound: %v, want INVALID_ARGUMENT naming descriptors[1]", err)
			}
		})
	}
}
