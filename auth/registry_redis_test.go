package auth

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/docsgate/gateway/internal/redistest"
)

var getStat = regexp.MustCompile(`cmdstat_get:calls=(\d+)`)

// getCalls sums GET calls over the given servers (INFO commandstats).
func getCalls(t testing.TB, addrs ...string) int {
	t.Helper()
	total := 0
	for _, addr := range addrs {
		c := redis.NewClient(&redis.Options{Addr: addr})
		info, err := c.Info(context.Background(), "commandstats").Result()
		c.Close()
		if err != nil {
			t.Fatalf("INFO commandstats: %v", err)
		}
		if m := getStat.FindStringSubmatch(info); m != nil {
			n, _ := strconv.Atoi(m[1])
			total += n
		}
	}
	return total
}

func newRedisRegistry(t testing.TB, c redis.UniversalClient, o RedisRegistryOptions) *RedisRegistry {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := NewRedisRegistry(ctx, c, o)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Subscribed() {
		t.Fatal("subscription not established at start")
	}
	return r
}

func seedOne(t testing.TB, r Registry) {
	t.Helper()
	e := adminEntry("svc_one", "p1")
	e.Created = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	if err := r.Add(context.Background(), e); err != nil {
		t.Fatal(err)
	}
}

func TestRedisRegistryBasics(t *testing.T) {
	srv := redistest.Start(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent(), ignoreRedisServer)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer c.Close()
	r := newRedisRegistry(t, c, RedisRegistryOptions{Prefix: "t"})
	defer r.Close()
	seedOne(t, r)
	testRegistryBasics(t, r)

	// The stored layout: one JSON value per hash-tagged key, an index set, never a key.
	ctx := context.Background()
	d := Digest("svc_dsc_two")
	val, err := c.Get(ctx, "t:key:{"+d+"}").Result()
	if err != nil {
		t.Fatal(err)
	}
	var e Entry
	if err := json.Unmarshal([]byte(val), &e); err != nil || e.Digest != d {
		t.Fatalf("stored value %q: %v", val, err)
	}
	members, err := c.SMembers(ctx, "t:keys").Result()
	slices.Sort(members)
	want := []string{Digest("svc_one"), d, Digest("svc_replaced"), Digest("svc_scheduled")}
	slices.Sort(want)
	if err != nil || !slices.Equal(members, want) {
		t.Fatalf("index: %v %v", members, err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatal("second close:", err)
	}
}

// Two replicas (separate clients) on one server: what one adds, the other finds; what one
// revokes, the other sees revoked within a second, although it had the entry cached.
func TestRedisRegistryRevocationAcrossReplicas(t *testing.T) {
	srv := redistest.Start(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent(), ignoreRedisServer)
	ca := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer ca.Close()
	cb := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer cb.Close()
	a := newRedisRegistry(t, ca, RedisRegistryOptions{Prefix: "gw", CacheTTL: time.Minute, NegativeTTL: time.Minute})
	defer a.Close()
	b := newRedisRegistry(t, cb, RedisRegistryOptions{Prefix: "gw", CacheTTL: time.Minute, NegativeTTL: time.Minute})
	defer b.Close()
	latencies := propagation(t, a, b, 20)
	t.Logf("revocation seen on the other replica after: median %v, max %v (n=%d)", latencies[len(latencies)/2], latencies[len(latencies)-1], len(latencies))
}

// propagation adds and revokes n keys on a and measures when b sees each revocation. Both
// registries cache for a minute: only invalidation can make b see changes in time.
func propagation(t *testing.T, a, b Registry, n int) []time.Duration {
	t.Helper()
	ctx := context.Background()
	var latencies []time.Duration
	for i := range n {
		e := assistantEntry(fmt.Sprintf("svc_dsc_replica_%d", i), "acme-docs")
		// b caches "unknown" first: the add must still reach it.
		if _, ok, err := b.Lookup(ctx, e.Digest); ok || err != nil {
			t.Fatalf("before add: %v %v", ok, err)
		}
		if err := a.Add(ctx, e); err != nil {
			t.Fatal(err)
		}
		waitFor(t, time.Second, "add to reach the other replica", func() bool {
			got, ok, err := b.Lookup(ctx, e.Digest)
			return err == nil && ok && got.Active()
		})
		start := time.Now()
		if err := a.Revoke(ctx, e.Digest); err != nil {
			t.Fatal(err)
		}
		waitFor(t, time.Second, "revocation to reach the other replica", func() bool {
			got, ok, err := b.Lookup(ctx, e.Digest)
			return err == nil && ok && !got.Active()
		})
		latencies = append(latencies, time.Since(start))
	}
	slices.Sort(latencies)
	return latencies
}

// settle lets the registry's own invalidation of what the test just wrote arrive, so it does
// not drop a cache entry filled after the write (one extra GET, harmless but uncounted).
func settle() { time.Sleep(100 * time.Millisecond) }

func waitFor(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(200 * time.Microsecond)
	}
}

func TestRedisRegistryCache(t *testing.T) {
	srv := redistest.Start(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent(), ignoreRedisServer)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer c.Close()
	r := newRedisRegistry(t, c, RedisRegistryOptions{CacheTTL: 300 * time.Millisecond, NegativeTTL: 300 * time.Millisecond})
	defer r.Close()
	ctx := context.Background()
	seedOne(t, r)
	settle()
	one := Digest("svc_one")

	// Hits are answered locally: one GET for many lookups, known or unknown.
	before := getCalls(t, srv.Addr)
	for range 100 {
		if _, ok, err := r.Lookup(ctx, one); !ok || err != nil {
			t.Fatal(ok, err)
		}
		if _, ok, err := r.Lookup(ctx, Digest("svc_invented")); ok || err != nil {
			t.Fatal(ok, err)
		}
	}
	if n := getCalls(t, srv.Addr) - before; n != 2 {
		t.Fatalf("%d GETs for 200 lookups of 2 keys, want 2", n)
	}

	// The TTL is the safety net for a change that was never announced.
	e, _, _ := r.Lookup(ctx, one)
	e.Label = "changed behind our back"
	data, _ := json.Marshal(e)
	if err := c.Set(ctx, "gw:key:{"+one+"}", data, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if got, _, _ := r.Lookup(ctx, one); got.Label != "" {
		t.Fatal("cache not used")
	}
	waitFor(t, 2*time.Second, "the cache TTL to expire", func() bool {
		got, _, _ := r.Lookup(ctx, one)
		return got.Label == "changed behind our back"
	})

	// A corrupt value is an error, not an unknown key.
	bad := Digest("svc_corrupt")
	c.Set(ctx, "gw:key:{"+bad+"}", "{not json", 0)
	if _, _, err := r.Lookup(ctx, bad); err == nil {
		t.Fatal("corrupt entry read without error")
	}

	// Expired entries are swept, so invented keys do not pile up.
	for i := range 100 {
		r.Lookup(ctx, Digest(fmt.Sprintf("svc_sweep_%d", i)))
	}
	waitFor(t, 3*time.Second, "expired entries to be swept", func() bool {
		n := 0
		r.cache.Range(func(any, any) bool { n++; return true })
		return n <= 1
	})
}

// Concurrent misses for one digest share one GET.
func TestRedisRegistrySingleflight(t *testing.T) {
	srv := redistest.Start(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent(), ignoreRedisServer)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer c.Close()
	r := newRedisRegistry(t, c, RedisRegistryOptions{})
	defer r.Close()
	seedOne(t, r)
	settle()
	c.AddHook(slowGets{})
	r.invalidateAll()
	before := getCalls(t, srv.Addr)
	var wg sync.WaitGroup
	errs := make(chan error, 50)
	for range 50 {
		wg.Go(func() {
			if _, ok, err := r.Lookup(context.Background(), Digest("svc_one")); !ok || err != nil {
				errs <- fmt.Errorf("lookup: %v %v", ok, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := getCalls(t, srv.Addr) - before; n != 1 {
		t.Fatalf("%d GETs for 50 concurrent misses, want 1", n)
	}

	// An invented key too: concurrent lookups share one GET, and the negative answer is
	// cached, so the same key again costs nothing.
	before = getCalls(t, srv.Addr)
	invented := Digest("svc_inventedSECRET")
	for range 2 {
		for range 50 {
			wg.Go(func() {
				if _, ok, err := r.Lookup(context.Background(), invented); ok || err != nil {
					t.Errorf("invented key: %v %v", ok, err)
				}
			})
		}
		wg.Wait()
	}
	if n := getCalls(t, srv.Addr) - before; n != 1 {
		t.Fatalf("%d GETs for 2 x 50 concurrent lookups of an invented key, want 1", n)
	}

	// A follower whose leader gave up (its context ended) reads for itself.
	r.invalidateAll()
	short, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() { _, _, err := r.Lookup(short, Digest("svc_one")); done <- err }()
	time.Sleep(2 * time.Millisecond)
	if _, ok, err := r.Lookup(context.Background(), Digest("svc_one")); !ok || err != nil {
		t.Fatalf("follower: %v %v", ok, err)
	}
	if err := <-done; err == nil {
		t.Fatal("leader with an expired context succeeded")
	}
}

// slowGets delays GETs so concurrent lookups overlap.
type slowGets struct{}

func (slowGets) DialHook(next redis.DialHook) redis.DialHook { return next }
func (slowGets) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() == "get" {
			select {
			case <-time.After(50 * time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return next(ctx, cmd)
	}
}
func (slowGets) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// Redis goes away: cached keys still answer, others fail with an error; when the
// subscription comes back the cache is cleared, since invalidations may have been missed.
func TestRedisRegistryOutage(t *testing.T) {
	srv := redistest.Start(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent(), ignoreRedisServer)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer c.Close()
	r := newRedisRegistry(t, c, RedisRegistryOptions{CacheTTL: time.Minute})
	defer r.Close()
	ctx := context.Background()
	seedOne(t, r)
	settle()
	one := Digest("svc_one")
	if _, ok, err := r.Lookup(ctx, one); !ok || err != nil {
		t.Fatal(ok, err)
	}
	srv.Stop(t)
	waitFor(t, 3*time.Second, "the subscription to notice the outage", func() bool { return !r.Subscribed() })
	if _, ok, err := r.Lookup(ctx, one); !ok || err != nil {
		t.Fatalf("cached key during outage: %v %v", ok, err)
	}
	if _, _, err := r.Lookup(ctx, Digest("svc_other")); err == nil {
		t.Fatal("uncached lookup during outage: no error")
	}
	if err := r.Add(ctx, adminEntry("svc_new", "p")); err == nil {
		t.Fatal("add during outage: no error")
	}
	srv.Restart(t) // empty: nothing is saved
	waitFor(t, 5*time.Second, "the subscription to come back", r.Subscribed)
	if _, ok, err := r.Lookup(ctx, one); ok || err != nil {
		t.Fatalf("after resubscription the stale entry is still cached: %v %v", ok, err)
	}
}

// A Redis that is down at start: the registry still starts (lookups fail) and subscribes
// once Redis answers.
func TestRedisRegistryStartsWithoutRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for the start timeout")
	}
	srv := redistest.Start(t)
	srv.Stop(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent(), ignoreRedisServer)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	r, err := NewRedisRegistry(ctx, c, RedisRegistryOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if _, _, err := r.Lookup(context.Background(), Digest("svc_one")); err == nil {
		t.Fatal("lookup without Redis: no error")
	}
	srv.Restart(t)
	waitFor(t, 5*time.Second, "the subscription", r.Subscribed)
	seedOne(t, r)
	if _, ok, err := r.Lookup(context.Background(), Digest("svc_one")); !ok || err != nil {
		t.Fatal(ok, err)
	}
}

func TestRedisRegistryCluster(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent(), ignoreRedisServer)
	newClient := func() *redis.ClusterClient {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs})
		deadline := time.Now().Add(10 * time.Second)
		for {
			shards, err := c.ClusterShards(context.Background()).Result()
			if err == nil && len(shards) >= 3 {
				return c
			}
			if time.Now().After(deadline) {
				t.Fatalf("cluster shards: %v", err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	ca, cb := newClient(), newClient()
	defer ca.Close()
	defer cb.Close()
	a := newRedisRegistry(t, ca, RedisRegistryOptions{CacheTTL: time.Minute, NegativeTTL: time.Minute})
	defer a.Close()
	b := newRedisRegistry(t, cb, RedisRegistryOptions{CacheTTL: time.Minute, NegativeTTL: time.Minute})
	defer b.Close()
	seedOne(t, a)
	testRegistryBasics(t, a)
	// Entries spread over the masters, and list reads them all back.
	for i := range 20 {
		if err := a.Add(context.Background(), adminEntry(fmt.Sprintf("svc_many_%d", i), "p")); err != nil {
			t.Fatal(err)
		}
	}
	list, err := b.List(context.Background())
	if err != nil || len(list) != 24 { // 4 from the contract test, 20 here
		t.Fatalf("list on the cluster: %d entries, %v", len(list), err)
	}
	lat := propagation(t, a, b, 5)
	t.Logf("cluster: revocation seen on the other replica after: median %v, max %v", lat[len(lat)/2], lat[len(lat)-1])
}

// BenchmarkLookupCached measures the hot path: a cached key, no network (checked).
func BenchmarkLookupCached(b *testing.B) {
	srv := redistest.Start(b)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	defer c.Close()
	r := newRedisRegistry(b, c, RedisRegistryOptions{CacheTTL: time.Hour})
	defer r.Close()
	seedOne(b, r)
	settle()
	ctx := context.Background()
	one := Digest("svc_one")
	if _, ok, err := r.Lookup(ctx, one); !ok || err != nil {
		b.Fatal(ok, err)
	}
	before := getCalls(b, srv.Addr)
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, ok, _ := r.Lookup(ctx, one); !ok {
				b.Fatal("miss")
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, ok, _ := r.Lookup(ctx, one); !ok {
					b.Fatal("miss")
				}
			}
		})
	})
	if n := getCalls(b, srv.Addr) - before; n != 0 {
		b.Fatalf("cached lookups sent %d GETs to Redis", n)
	}
}

// ignoreRedisServer: a restarted redis-server is waited for by redistest's own goroutine.
var ignoreRedisServer = goleak.IgnoreAnyFunction("github.com/docsgate/gateway/internal/redistest.(*Server).launch.func1")
