package limits

import (
	"context"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"
)

// nodeCombiners holds one combiner per Cluster master, so that a batch carries only one node's
// calls: a slow or dead master then delays only its own tenants' decisions.
type nodeCombiners struct {
	mu sync.Mutex
	m  map[*redis.Client]*combiner
}

// of returns the combiner of master node, creating it the first time the node is seen (after
// a failover the promoted replica is a new node client).
func (n *nodeCombiners) of(node *redis.Client) *combiner {
	n.mu.Lock()
	defer n.mu.Unlock()
	if c, ok := n.m[node]; ok {
		return c
	}
	if n.m == nil {
		n.m = map[*redis.Client]*combiner{}
	}
	c := newCombiner(node, coalesceBatch, coalesceQueue)
	n.m[node] = c
	return c
}

func (n *nodeCombiners) close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for node, c := range n.m {
		c.close()
		delete(n.m, node)
	}
}

// runOnNode runs script on the master serving firstKey, through that master's combiner.
func (r *Redis) runOnNode(ctx context.Context, script *redis.Script, firstKey []string, args ...any) *redis.Cmd {
	node, err := r.cluster.MasterForKey(ctx, firstKey[0])
	if err != nil {
		return failedCmd(ctx, fmt.Errorf("limits: cluster node of %s: %w", firstKey[0], err))
	}
	return r.nodeCombs.of(node).run(ctx, script, firstKey, args...)
}
