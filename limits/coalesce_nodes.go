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
	m    map[*redis.Client]*nodeLane
}

// nodeLane is one master's auto-pipeliner and the count of its calls on the wire.
type nodeLane struct {
	ap   *redis.AutoPipeliner
	lane lane
}

// of returns the auto-pipeliner of master node, creating it the first time the node is seen
// (after a failover the promoted replica is a new node client).
func (n *nodePipeliners) of(node *redis.Client) (*nodeLane, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if nl, ok := n.m[node]; ok {
		return nl, nil
	}
	ap, err := node.AutoPipelineWithOptions(n.opts)
	if err != nil {
		return nil, fmt.Errorf("limits: auto-pipeliner: %w", err)
	}
	if n.m == nil {
		n.m = map[*redis.Client]*nodeLane{}
	}
	nl := &nodeLane{ap: ap}
	n.m[node] = nl
	return nl, nil
}

func (n *nodePipeliners) close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	for node, nl := range n.m {
		_ = nl.ap.Close()
		delete(n.m, node)
	}
}

// runOnNode runs script on the master serving firstKey: through that master's batch once
// several calls to it are on the wire, before that straight out (see lane).
func (r *Redis) runOnNode(ctx context.Context, script *redis.Script, firstKey []string, args ...any) *redis.Cmd {
	node, err := r.cluster.MasterForKey(ctx, firstKey[0])
	if err != nil {
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(fmt.Errorf("limits: cluster node of %s: %w", firstKey[0], err))
		return cmd
	}
	nl, err := r.nodeAPs.of(node)
	if err != nil {
		cmd := redis.NewCmd(ctx)
		cmd.SetErr(err)
		return cmd
	}
	direct := nl.lane.enter()
	defer nl.lane.leave()
	if direct {
		return script.Run(ctx, node, firstKey, args...)
	}
	return script.Run(ctx, nl.ap, firstKey, args...)
}
