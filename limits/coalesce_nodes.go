package limits

import (
	"context"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"
)

// nodePipeliners holds one auto-pipeliner per Cluster master, so that a batch carries only one
// node's calls: a slow or dead master then delays only its own tenants' decisions. (go-redis's
// cluster auto-pipeliner batches by slot shard, which mixes nodes in one batch.)
type nodePipeliners struct {
	opts *redis.AutoPipelineOptions
	mu   sync.Mutex
	m    map[*redis.Client]*redis.AutoPipeliner
}

// of returns the auto-pipeliner of master node, creating it the first time the node is seen
// (after a failover the promoted replica is a new node client).
func (n *nodePipeliners) of(node *redis.Client) (*redis.AutoPipeliner, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if ap, ok := n.m[node]; ok {
		return ap, nil
	}
	ap, err := node.AutoPipelineWithOptions(n.opts)
	if err != nil {
		return nil, fmt.Errorf("limits: auto-pipeliner: %w", err)
	}
	if n.m == nil {
		n.m = map[*redis.Client]*redis.AutoPipeliner{}
	}
	n.m[node] = ap
	return ap, nil
}

func (n *nodePipeliners) close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for node, ap := range n.m {
		_ = ap.Close()
		delete(n.m, node)
	}
}

// runOnNode runs script on the master serving firstKey through that master's batch.
func (r *Redis) runOnNode(ctx context.Context, script *redis.Script, firstKey []string, args ...any) *redis.Cmd {
	node, err := r.cluster.MasterForKey(ctx, firstKey[0])
	if err != nil {
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(fmt.Errorf("limits: cluster node of %s: %w", firstKey[0], err))
		return cmd
	}
	ap, err := r.nodeAPs.of(node)
	if err != nil {
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(err)
		return cmd
	}
	return script.Run(ctx, ap, firstKey, args...)
}
