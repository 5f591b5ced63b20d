package limits

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/docsgate/gateway/internal/redistest"
)

func TestClassify(t *testing.T) {
	opErr := &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connect: connection refused")}
	for _, c := range []struct {
		err  error
		want ErrorKind
	}{
		{nil, ""},
		{fmt.Errorf("limits: take: %w", redisReply("WRONGTYPE Operation against a key holding the wrong kind of value (key gw:a:hour:{x})")), KindData},
		{fmt.Errorf("limits: take: %w", redisReply("ERR user_script:1: limits: bad rule spec")), KindData},
		{fmt.Errorf("x: %w %q", errMalformedReply, "1 2"), KindData},
		{fmt.Errorf("x: %w", ErrInvalidRule), KindData},
		{redisReply("LOADING Redis is loading the dataset in memory"), KindNode},
		{redisReply("READONLY You can't write against a read only replica."), KindNode},
		{redisReply("CLUSTERDOWN The cluster is down"), KindNode},
		{redisReply("BUSY Redis is busy running a script."), KindNode},
		{redisReply("OOM command not allowed when used memory > 'maxmemory'."), KindNode},
		{redisReply("ERR max number of clients reached"), KindNode},
		{redisReply("LOADINGX not a node state"), KindData},
		{fmt.Errorf("limits: take: %w", opErr), KindNode},
		{fmt.Errorf("limits: take: %w", io.EOF), KindNode},
		{fmt.Errorf("limits: take: %w", ErrNotReplicated), KindNode},
		{fmt.Errorf("limits: guard: store call exceeded 100ms: %w", context.DeadlineExceeded), KindTimeout},
		{redis.ErrPoolTimeout, KindTimeout},
		{&net.OpError{Op: "read", Net: "tcp", Err: timeoutErr{}}, KindTimeout},
		{fmt.Errorf("limits: guard: %w", context.Canceled), KindCanceled},
		{ErrBreakerOpen, KindBreakerOpen},
		// Several nodes of one Cluster decision: the node failure wins over a data reply.
		{errors.Join(redisReply("WRONGTYPE x"), fmt.Errorf("give back: %w", opErr)), KindNode},
		{errors.Join(redisReply("WRONGTYPE x"), redisReply("CLUSTERDOWN y")), KindNode},
		{errors.Join(redisReply("WRONGTYPE x"), redisReply("ERR z")), KindData},
		{&DataError{Key: "k", Err: redisReply("WRONGTYPE x")}, KindData},
	} {
		if got := Classify(c.err); got != c.want {
			t.Errorf("Classify(%v) = %q, want %q", c.err, got, c.want)
		}
	}
	for _, k := range ErrorKinds() {
		if k.MovesBreaker() != (k == KindNode || k == KindTimeout) {
			t.Errorf("%s.MovesBreaker() = %v", k, k.MovesBreaker())
		}
	}
}

type redisReply string

func (e redisReply) Error() string { return string(e) }
func (redisReply) RedisError()     {}

type timeoutErr struct{}

func (timeoutErr) Error() string   { return "i/o timeout" }
func (timeoutErr) Timeout() bool   { return true }
func (timeoutErr) Temporary() bool { return true }

// A key someone wrote with another type under one tenant's counter fails that tenant's
// decisions with a DataError naming the key, never moves the breaker (default settings), and
// the other tenants are decided as usual throughout, on a standalone Redis and on a Cluster
// (where the planted key's node fails and the other nodes give their units back).
func TestPlantedKeyFailsOnlyItsTenant(t *testing.T) {
	srv := redistest.Start(t)
	cl := redistest.StartCluster(t, 3)
	for _, c := range []struct {
		name   string
		client redis.UniversalClient
	}{{"redis", srv.Client(t)}, {"cluster", cl.Client(t)}} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			store := newRedisT(t, c.client, uniquePrefix())
			var opened stateLog
			// The breaker's defaults (5 failures, 1 s). The bound of a call is what this test is
			// not about: a second, so that a -race run on a loaded machine does not turn a
			// scheduling stall into a timeout (TestPlantedKeyBesideHealthyTenants runs the binary
			// with every default, redis.timeout's 100 ms included).
			g := NewGuard(store, GuardOptions{OnBreaker: opened.add, Timeout: time.Second})
			fixed := rule(t, "per_id", 1000, "hour", Fixed)
			gcra := rule(t, "smooth", 1000, "hour", GCRA)
			other := rule(t, "other", 1000, "hour", Fixed)
			ids := idsOnDistinctNodes(3)
			bad, good := ids[0], ids[1]
			plants := map[*Rule]func(key string) error{
				fixed: func(key string) error { return c.client.RPush(ctx, key, "x").Err() },
				gcra:  func(key string) error { return c.client.HSet(ctx, key, "n", "1").Err() },
			}
			for r, plant := range plants {
				key, _ := store.Key(r, bad)
				if err := plant(key); err != nil {
					t.Fatal(err)
				}
				var d Decision
				for burst := range 2 { // bursts of ten, as many as open the breaker on failures
					for i := range 10 {
						// The bad tenant's decision also holds another limit on another
						// node: nothing of it may stay consumed.
						err := g.Take(ctx, []Hit{{Rule: r, ID: bad}, {Rule: other, ID: ids[2]}}, &d)
						var de *DataError
						if !errors.As(err, &de) || de.Key != key || Classify(err) != KindData || !strings.Contains(err.Error(), "WRONGTYPE") {
							t.Fatalf("%s take %d on the planted key: %v (%T), want a DataError naming %s", r.Algorithm, i, err, err, key)
						}
					}
					for i := range 10 {
						if err := g.Take(ctx, []Hit{{Rule: r, ID: good}}, &d); err != nil || !d.Allowed {
							t.Fatalf("%s burst %d: take %d of another tenant: %v %+v", r.Algorithm, burst, i, err, d)
						}
					}
				}
				if _, err := g.Usage(ctx, r, bad); Classify(err) != KindData {
					t.Fatalf("usage of the planted key: %v", err)
				}
				if u, err := g.Usage(ctx, other, ids[2]); err != nil || u.Used != 0 {
					t.Fatalf("the failed decisions left units taken on another node: %+v %v", u, err)
				}
				if u, err := g.Usage(ctx, r, good); err != nil || u.Used != 20 {
					t.Fatalf("good tenant: %+v %v", u, err)
				}
				if err := c.client.Del(ctx, key).Err(); err != nil {
					t.Fatal(err)
				}
				if err := g.Take(ctx, []Hit{{Rule: r, ID: bad}}, &d); err != nil || !d.Allowed {
					t.Fatalf("once the key is gone: %v %+v", err, d)
				}
			}
			if open := g.OpenNodes(); len(open) != 0 || len(opened.get()) != 0 {
				t.Fatalf("the breaker moved: open %v, changes %v", open, opened.get())
			}
		})
	}
}

// A hash whose count is not an integer fails before anything is written: the other limit of
// the decision is not consumed.
func TestCorruptCountFailsBeforeWriting(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	s := newRedisT(t, c, uniquePrefix())
	a, b := rule(t, "a", 10, "hour", Fixed), rule(t, "b", 10, "hour", Fixed)
	var d Decision
	if err := s.Take(ctx, []Hit{{Rule: a, ID: "x"}, {Rule: b, ID: "x"}}, &d); err != nil {
		t.Fatal(err)
	}
	key, _ := s.Key(b, "x")
	if err := c.HSet(ctx, key, "n", "1.5").Err(); err != nil {
		t.Fatal(err)
	}
	err := s.Take(ctx, []Hit{{Rule: a, ID: "x"}, {Rule: b, ID: "x"}}, &d)
	var de *DataError
	if !errors.As(err, &de) || de.Key != key {
		t.Fatalf("%v, want a DataError naming %s", err, key)
	}
	if u, _ := s.Usage(ctx, a, "x"); u.Used != 1 {
		t.Fatalf("a used %d after the failed decision, want 1", u.Used)
	}
}
