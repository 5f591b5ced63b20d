package limits

import (
	"context"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"
)

// The nodes of a Redis store, as the Guard's breakers name them (host:port): on a Cluster the
// master serving a key's slot, in go-redis's cached layout; on a standalone client its
// address; on Sentinel the master the client last connected to.

var _ NodeRouter = (*Redis)(nil)

// clusterUnknown names the node of a call whose slot has no known master (the client could
// not read the cluster's layout yet): such calls share one breaker until it can.
const clusterUnknown = "cluster"

// NodesOf implements NodeRouter.
func (r *Redis) NodesOf(ctx context.Context, hits []Hit, dst []string) []string {
	if r.cluster == nil {
		return append(dst, r.master.name())
	}
	for i := range hits {
		cr, err := r.rules.get(hits[i].Rule)
		if err != nil || !cr.enabled {
			continue // nothing is sent for it
		}
		n := clusterUnknown
		if node, err := r.cluster.MasterForKey(ctx, slotKey(cr, hits[i].ID)); err == nil {
			n = node.Options().Addr
		}
		if !slices.Contains(dst, n) {
			dst = append(dst, n)
		}
	}
	return dst
}

// Nodes implements NodeRouter: the masters of the Cluster's layout (read again), or the one
// master.
func (r *Redis) Nodes(ctx context.Context) ([]string, error) {
	if r.cluster == nil {
		return []string{r.master.name()}, nil
	}
	var mu sync.Mutex
	var out []string
	err := r.cluster.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		out = append(out, c.Options().Addr)
		mu.Unlock()
		return nil
	})
	return out, err
}

// Refused implements NodeRouter. On a Cluster, the layout is read again (go-redis does it in
// the background, at most every 200 ms): a dead master's calls are refused by its breaker
// rather than failing, and no failed call would make the client look, so without this a
// replica promoted meanwhile would serve its slots only once a trial call failed, a cooldown
// later. Once the layout names the new master, its tenants are decided again at once.
func (r *Redis) Refused(string) {
	if r.cluster != nil {
		r.cluster.ReloadState(context.Background())
	}
}

// nodeOf names the Cluster master serving key.
func (r *Redis) nodeOf(ctx context.Context, key string) string {
	if node, err := r.cluster.MasterForKey(ctx, key); err == nil {
		return node.Options().Addr
	}
	return clusterUnknown
}

// slotKey returns a string in the hash slot of the key of cr and id, without building that
// key when it can: the key's hash tag is id up to its first '}' (the key prefix holds one
// '{', at its end), and a string without '}' hashes whole, as its own tag.
func slotKey(cr *compiled, id string) string {
	if cr.plainPre {
		tag := id
		if j := strings.IndexByte(id, '}'); j >= 0 {
			tag = id[:j]
		}
		if tag != "" { // an empty tag: Redis hashes the whole key
			return tag
		}
	}
	return cr.keyPre + id + "}"
}

// masterName names the node of a standalone or Sentinel client.
type masterName struct {
	addr   string                 // the client's address
	dialed atomic.Pointer[string] // Sentinel: the master last connected to
}

// newMasterName names c's node. go-redis's Sentinel (failover) client has no address of its
// own: it asks Sentinel for the master's at each new connection; a dial hook reads it there.
func newMasterName(c *redis.Client) *masterName {
	m := &masterName{addr: c.Options().Addr}
	if m.addr == "FailoverClient" { // the Addr go-redis gives its failover client
		c.AddHook(dialHook{m})
	}
	return m
}

func (m *masterName) name() string {
	if m == nil {
		return ""
	}
	if a := m.dialed.Load(); a != nil {
		return *a
	}
	return m.addr
}

// dialHook records the address of every connection the client makes.
type dialHook struct{ m *masterName }

func (h dialHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		if err == nil {
			a := c.RemoteAddr().String()
			h.m.dialed.Store(&a)
		}
		return c, err
	}
}

func (dialHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (dialHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
