package limits

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// nodeCombiners holds one combiner per Cluster master, so that a batch carries only one node's
// calls: a slow or dead master then delays only its own tenants' decisions.
type nodeCombiners struct {
	cluster *redis.ClusterClient
	mu      sync.Mutex
	m       map[*redis.Client]*combiner
	closed  bool
	pruning atomic.Bool // a prune is under way
}

// of returns the combiner of master node, creating it the first time the node is seen. A new
// node means a new layout (a failover, a resharding: go-redis then makes new node clients), so
// the combiners of nodes that are no longer masters are closed then, in the background.
func (n *nodeCombiners) of(node *redis.Client) *combiner {
	n.mu.Lock()
	if c, ok := n.m[node]; ok || n.closed {
		n.mu.Unlock()
		return c // nil once closed: the call fails
	}
	if n.m == nil {
		n.m = map[*redis.Client]*combiner{}
	}
	c := newCombiner(node, coalesceDirect, coalesceBatch, coalesceQueue)
	n.m[node] = c
	prune := len(n.m) > 1
	n.mu.Unlock()
	if prune && n.pruning.CompareAndSwap(false, true) {
		go n.prune()
	}
	return c
}

// pruneBound bounds the reading of the layout by prune.
const pruneBound = 5 * time.Second

// prune closes the combiners of nodes that are not masters in the cluster's layout, read
// again. Not under the lock: reading the layout is a round trip, and every decision of every
// node would wait for it (on a loaded machine, past redis.timeout).
func (n *nodeCombiners) prune() {
	defer n.pruning.Store(false)
	ctx, cancel := context.WithTimeout(context.Background(), pruneBound)
	defer cancel()
	var mu sync.Mutex
	masters := map[*redis.Client]bool{}
	err := n.cluster.ForEachMaster(ctx, func(_ context.Context, c *redis.Client) error {
		mu.Lock()
		masters[c] = true
		mu.Unlock()
		return nil
	})
	if err != nil {
		return // the layout is not known now; the next new node tries again
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for node, c := range n.m {
		if !masters[node] {
			delete(n.m, node)
			go c.close() // what it has queued is sent (or fails) first
		}
	}
}

func (n *nodeCombiners) close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.closed = true
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
	c := r.nodeCombs.of(node)
	if c == nil {
		return failedCmd(ctx, errCombinerClosed)
	}
	return c.run(ctx, script, firstKey, args...)
}
