package auth

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/docsgate/gateway/internal/redistest"
)

// registries are the registries the lifecycle tests run on: in process, on a real
// redis-server, and on a real three-master Cluster.
func registries(t *testing.T) map[string]Registry {
	t.Helper()
	mem, err := NewMemoryRegistry(nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := redistest.Start(t)
	c := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { c.Close() })
	cl := redistest.StartCluster(t, 3)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs})
	t.Cleanup(func() { cc.Close() })
	return map[string]Registry{
		"memory":  mem,
		"redis":   newRedisRegistry(t, c, RedisRegistryOptions{}),
		"cluster": newRedisRegistry(t, cc, RedisRegistryOptions{}),
	}
}

// A rotation registers the successor with the same org, grants, plan, label and scopes in the
// first key's lineage, and schedules the old key's end: both keys work until then, and a chain
// of rotations stays one tenant. A key rotated already, revoked or expired is refused, and so
// is a successor whose digest is registered.
func TestRotate(t *testing.T) {
	for name, reg := range registries(t) {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			first := Entry{Digest: Digest("svc_dsc_first"), Kind: "assistant", Org: "acme", Domains: []string{"acme-docs"},
				Plan: "gold", Label: "docs", Scopes: []string{"assistant_message_v2"}}
			if err := reg.Add(ctx, first); err != nil {
				t.Fatal(err)
			}
			ends := time.Now().Add(time.Hour)
			second := Successor(first, Digest("svc_dsc_second"), nil)
			old, err := reg.Rotate(ctx, first.Digest, second, ends)
			if err != nil {
				t.Fatal(err)
			}
			if old.RotatedTo != second.Digest || old.Revoked == nil || old.Revoked.Sub(ends).Abs() > time.Second || !old.Active() {
				t.Fatalf("the old key after the rotation: %+v", old)
			}
			got, ok, err := reg.Lookup(ctx, second.Digest)
			if err != nil || !ok || !got.Active() || got.Tenant() != first.Digest || got.Replaces != first.Digest ||
				got.Org != "acme" || got.Plan != "gold" || got.Label != "docs" || strings.Join(got.Scopes, ",") != "assistant_message_v2" {
				t.Fatalf("the new key: %+v %v %v", got, ok, err)
			}
			if _, err := reg.Rotate(ctx, first.Digest, Successor(first, Digest("svc_dsc_third"), nil), ends); !errors.Is(err, ErrRotated) {
				t.Fatalf("a second rotation of the same key: %v", err)
			}
			third := Successor(got, Digest("svc_dsc_third"), nil)
			if _, err := reg.Rotate(ctx, second.Digest, third, time.Now()); err != nil {
				t.Fatal(err)
			}
			got, _, _ = reg.Lookup(ctx, third.Digest)
			if got.Tenant() != first.Digest {
				t.Fatalf("a chain of rotations is one tenant: %s, want %s", got.Tenant(), first.Digest)
			}
			waitFor(t, 5*time.Second, "the second key ends at once (overlap 0)", func() bool {
				e, _, _ := reg.Lookup(ctx, second.Digest)
				return !e.Active()
			})
			if _, err := reg.Rotate(ctx, second.Digest, Successor(second, Digest("svc_dsc_fourth"), nil), ends); !errors.Is(err, ErrRevoked) {
				t.Fatalf("rotating a revoked key: %v", err)
			}
			if _, err := reg.Rotate(ctx, third.Digest, Successor(third, first.Digest, nil), ends); !errors.Is(err, ErrKeyExists) {
				t.Fatalf("a successor whose digest is registered: %v", err)
			}
			if _, err := reg.Rotate(ctx, Digest("svc_dsc_nobody"), third, ends); !errors.Is(err, ErrUnknownKey) {
				t.Fatalf("rotating an unknown key: %v", err)
			}
			past := time.Now().Add(-time.Minute)
			expired := Entry{Digest: Digest("svc_dsc_expired"), Kind: "assistant", Org: "acme", Domains: []string{"d"}, Expires: &past}
			if err := reg.Add(ctx, expired); err != nil {
				t.Fatal(err)
			}
			if _, err := reg.Rotate(ctx, expired.Digest, Successor(expired, Digest("svc_dsc_fifth"), nil), ends); !errors.Is(err, ErrExpired) {
				t.Fatalf("rotating an expired key: %v", err)
			}
			if err := reg.Add(ctx, expired); !errors.Is(err, ErrExpired) {
				t.Fatalf("re-registering an expired key: %v", err)
			}
		})
	}
}

func TestEntryLifecycle(t *testing.T) {
	now := time.Now()
	soon, past := now.Add(time.Hour), now.Add(-time.Hour)
	e := Entry{Digest: Digest("svc_dsc_a"), Kind: "assistant", Org: "acme", Domains: []string{"d"}}
	if !e.Active() || e.Expired(now) || e.Ends() != nil || e.Tenant() != e.Digest || !e.AllowsRoute("anything") {
		t.Fatalf("a plain key: %+v", e)
	}
	e.Expires, e.Revoked = &soon, &past
	if e.Active() || !e.RevokedAt(now) || *e.Ends() != past {
		t.Fatal("revoked before it expires")
	}
	e.Revoked = nil
	e.Scopes = []string{"assistant_message_v2"}
	if !e.Active() || e.AllowsRoute("assistant_message") || !e.AllowsRoute("assistant_message_v2") {
		t.Fatal("scopes")
	}
	e.Expires = &past
	if e.Active() || !e.Expired(now) {
		t.Fatal("expired")
	}
	for _, bad := range []Entry{
		{Digest: Digest("svc_a"), Kind: "admin", Org: "o", Projects: []string{"p"}, Scopes: []string{"agent job"}},
		{Digest: Digest("svc_a"), Kind: "admin", Org: "o", Projects: []string{"p"}, Lineage: "nope"},
		{Digest: Digest("svc_a"), Kind: "admin", Org: "o", Projects: []string{"p"}, Scopes: []string{"svc_leaked_key"}},
	} {
		if err := bad.Validate(); err == nil {
			t.Errorf("%+v validated", bad)
		}
	}
}
