package limits

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/docsgate/gateway/internal/redistest"
	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
)

// testGCRADifferential replays one request sequence (bursts with denials and
// pauses for replenishment) against the store's GCRA and redis_rate/v10 on a
// separate key; every allowed/remaining decision must match.
//
// The two are asked one after the other, so the time between the calls of a step counts
// against the sequence's margins: the sequence runs at a scale (an emission interval of
// 2 s, margins of 500 ms) that a loaded machine's delay between two calls stays inside.
// (Whole seconds: redis_rate computes remaining in floating point, and 1.6 s intervals
// round 4 down to 3.)
func testGCRADifferential(t *testing.T, b backend) {
	const unit = 2 * time.Second // emission interval: 5 per 10 s
	s := b.stores(t, 1)[0]
	ctx := context.Background()
	lim := redis_rate.NewLimiter(b.ref)
	r := rule(t, "gdiff", 5, "10s", GCRA)
	refLimit := redis_rate.Limit{Rate: 5, Burst: 5, Period: 5 * unit}
	refKey := "ref:" + uniquePrefix()
	const slack = unit / 4
	var d Decision
	denials := 0
	step := func(label string) {
		t.Helper()
		want, err := lim.Allow(ctx, refKey, refLimit)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.Take(ctx, []Hit{{Rule: r, ID: "x"}}, &d); err != nil {
			t.Fatal(err)
		}
		got := d.Results[0]
		if got.Allowed != (want.Allowed == 1) || got.Remaining != int64(want.Remaining) {
			t.Fatalf("%s: got allowed=%v remaining=%d, redis_rate allowed=%d remaining=%d",
				label, got.Allowed, got.Remaining, want.Allowed, want.Remaining)
		}
		if !got.Allowed {
			denials++
			if (got.RetryAfter - want.RetryAfter).Abs() > slack {
				t.Fatalf("%s: retry after %v, redis_rate %v", label, got.RetryAfter, want.RetryAfter)
			}
		}
		if (got.Reset - want.ResetAfter).Abs() > slack {
			t.Fatalf("%s: reset %v, redis_rate %v", label, got.Reset, want.ResetAfter)
		}
	}
	for i := 0; i < 7; i++ {
		step(fmt.Sprintf("burst %d", i))
	}
	time.Sleep(unit + unit/4) // one unit back, a quarter into the next
	for i := 0; i < 3; i++ {
		step(fmt.Sprintf("after 1.25 units %d", i))
	}
	time.Sleep(2*unit + unit/2) // two and a half more
	for i := 0; i < 4; i++ {
		step(fmt.Sprintf("after 2.5 units more %d", i))
	}
	if denials < 4 {
		t.Fatalf("sequence had only %d denials; it must exercise them", denials)
	}
}

// TestKeysAndTTL checks key names and that every key expires at most a
// minute after its window ends.
func TestKeysAndTTL(t *testing.T) {
	c := redistest.Start(t).Client(t)
	ctx := context.Background()
	s := newRedisT(t, c, "gw")
	rules := []*Rule{
		rule(t, "per_project", 100, "hour", Fixed),
		rule(t, "per_key", 10000, "month", Fixed),
		rule(t, "per_ip", 10000, "day", Fixed),
		rule(t, "burst", 10, "10s", Fixed),
		rule(t, "smooth", 100, "hour", GCRA),
	}
	var hits []Hit
	for _, r := range rules {
		hits = append(hits, Hit{Rule: r, ID: "abc"})
	}
	var d Decision
	if err := s.Take(ctx, hits, &d); err != nil || !d.Allowed {
		t.Fatal(d, err)
	}
	now := time.Now()
	for i, r := range rules {
		key, _ := s.Key(r, "abc")
		want := "gw:" + r.Name + ":{abc}" // a fixed window's key names no window (counterKeyPart)
		if r.Algorithm == GCRA {
			want = "gw:" + r.Name + ":" + r.Window.String() + ":gcra:{abc}"
		}
		if key != want {
			t.Fatalf("key %q, want %q", key, want)
		}
		ttl, err := c.PTTL(ctx, key).Result()
		if err != nil || ttl <= 0 {
			t.Fatalf("%s: PTTL %v %v (key must exist and expire)", key, ttl, err)
		}
		var windowLeft time.Duration
		if r.Algorithm == GCRA {
			windowLeft = d.Results[i].Reset // until fully replenished
		} else {
			_, end := r.Window.Bounds(now)
			windowLeft = time.Until(end)
		}
		if ttl > windowLeft+time.Minute {
			t.Fatalf("%s: TTL %v, window ends in %v", key, ttl, windowLeft)
		}
	}
	if n, _ := c.DBSize(ctx).Result(); n != int64(len(rules)) {
		t.Fatalf("%d keys, want %d", n, len(rules))
	}
}

func commandCalls(t testing.TB, c *redis.Client, cmd string) int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":calls="); ok {
			n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
			return n
		}
	}
	return 0
}

// TestOneRoundTrip: each Take of several hits is exactly one EVALSHA and no
// other command.
func TestOneRoundTrip(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	stats := srv.Client(t)
	ctx := context.Background()
	s := newRedisT(t, c, "gw")
	hits := []Hit{
		{Rule: rule(t, "a", 100, "hour", Fixed), ID: "p"},
		{Rule: rule(t, "b", 100, "month", Fixed), ID: "k"},
		{Rule: rule(t, "c", 100, "day", GCRA), ID: "o"},
		{Rule: rule(t, "d", 100, "10s", Fixed), ID: "ip"},
	}
	var d Decision
	if err := s.Take(ctx, hits, &d); err != nil { // loads the script (NOSCRIPT, EVAL)
		t.Fatal(err)
	}
	if n := commandCalls(t, stats, "eval"); n != 1 {
		t.Fatalf("eval calls after first Take = %d, want 1 (NOSCRIPT fallback)", n)
	}
	before := commandCalls(t, stats, "evalsha")
	hmgetBefore := commandCalls(t, stats, "hmget")
	const takes = 10
	for i := 0; i < takes; i++ {
		if err := s.Take(ctx, hits, &d); err != nil || !d.Allowed {
			t.Fatal(d, err)
		}
	}
	if got := commandCalls(t, stats, "evalsha") - before; got != takes {
		t.Fatalf("evalsha calls grew by %d over %d Takes, want exactly %d", got, takes, takes)
	}
	if n := commandCalls(t, stats, "eval"); n != 1 {
		t.Fatalf("eval calls = %d, want still 1", n)
	}
	// Sanity: the script did run its reads (so the stats are live).
	if commandCalls(t, stats, "hmget") == hmgetBefore {
		t.Fatal("no HMGET calls recorded: commandstats not reflecting script work")
	}
	// After SCRIPT FLUSH the fallback to EVAL keeps working.
	if err := stats.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Take(ctx, hits, &d); err != nil || !d.Allowed {
		t.Fatal("after SCRIPT FLUSH:", d, err)
	}
}

// TestClusterRoundTrips: on a 3-master cluster a Take over ids on three
// nodes sends exactly one script call to each node; a Take whose ids share a
// slot sends one call in total.
func TestClusterRoundTrips(t *testing.T) {
	cl := redistest.StartCluster(t, 3)
	cc := cl.Client(t)
	ctx := context.Background()
	s := newRedisT(t, cc, "gw")
	ids := idsOnDistinctNodes(3)
	r1, r2, r3 := rule(t, "a", 1000, "hour", Fixed), rule(t, "b", 1000, "hour", GCRA), rule(t, "c", 1000, "day", Fixed)
	spread := []Hit{{Rule: r1, ID: ids[0]}, {Rule: r2, ID: ids[1]}, {Rule: r3, ID: ids[2]}}
	same := []Hit{{Rule: r1, ID: ids[0]}, {Rule: r2, ID: ids[0]}, {Rule: r3, ID: ids[0]}}
	var d Decision
	for _, h := range [][]Hit{spread, same} { // warm up: load scripts on every node
		if err := s.Take(ctx, h, &d); err != nil || !d.Allowed {
			t.Fatal(d, err)
		}
	}
	nodes := make([]*redis.Client, len(cl.Addrs))
	for i, a := range cl.Addrs {
		nodes[i] = redis.NewClient(&redis.Options{Addr: a})
		defer nodes[i].Close()
	}
	calls := func() []int64 {
		out := make([]int64, len(nodes))
		for i, n := range nodes {
			out[i] = commandCalls(t, n, "evalsha") + commandCalls(t, n, "eval")
		}
		return out
	}
	before := calls()
	const takes = 5
	for i := 0; i < takes; i++ {
		if err := s.Take(ctx, spread, &d); err != nil || !d.Allowed {
			t.Fatal(d, err)
		}
	}
	after := calls()
	for i := range nodes {
		if got := after[i] - before[i]; got != takes {
			t.Fatalf("node %s: %d script calls over %d spread Takes, want %d", cl.Addrs[i], got, takes, takes)
		}
	}
	for i := 0; i < takes; i++ {
		if err := s.Take(ctx, same, &d); err != nil || !d.Allowed {
			t.Fatal(d, err)
		}
	}
	final := calls()
	var total int64
	for i := range nodes {
		total += final[i] - after[i]
	}
	if total != takes {
		t.Fatalf("%d script calls over %d same-slot Takes, want %d", total, takes, takes)
	}
}

// After Preload, the very first decisions on a fresh server are one EVALSHA each.
func TestPreloadAvoidsNoscript(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	store := newRedisT(t, client, "gw")
	if err := store.Preload(context.Background()); err != nil {
		t.Fatal(err)
	}
	rule := &Rule{Name: "r", Limit: 10, Window: mustWindow(t, "hour")}
	before := redistest.ScriptCalls(t, client)
	var d Decision
	for range 5 {
		if err := store.Take(context.Background(), []Hit{{Rule: rule, ID: "a"}}, &d); err != nil {
			t.Fatal(err)
		}
	}
	if got := redistest.ScriptCalls(t, client) - before; got != 5 {
		t.Fatalf("%d script calls for 5 decisions after Preload, want 5", got)
	}
}
