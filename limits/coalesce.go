package limits

import (
	"context"
	"fmt"
	"sync"

	"github.com/redis/go-redis/v9"
)

// Coalescing (auto-pipelining): concurrent decisions bound for the same Redis node go out as
// one pipelined write, and their replies come back in one read. It is go-redis's own
// AutoPipeliner (blocking face, half-duplex): a lone decision is written at once, with no
// batching window; the decisions that arrive while a batch is on the wire queue up and go out
// together as the next batch, in one write. Each decision is still exactly one script call,
// all-or-nothing on Redis server time; its own deadline (the Guard's redis.timeout) bounds how
// long it waits, and a batch that fails fails only the decisions it carried.

// coalesceBatch is the target size of one batch; go-redis treats it as the point where it
// stops waiting for more, and coalesceQueue as a hard bound on decisions accepted and not yet
// answered (past it a decision fails at once, as a Redis error does).
const (
	coalesceBatch = 256
	coalesceQueue = 4096
)

// WithCoalescing sends concurrent decisions through go-redis's auto-pipeliner. It has no
// effect together with WithWaitReplicas: WAIT must follow a script on the same connection,
// and the auto-pipeliner runs WAIT apart.
func WithCoalescing() RedisOption {
	return func(r *Redis) { r.coalesce = true }
}

// startCoalescing builds the auto-pipeliner for r's client, per node on a Cluster.
func (r *Redis) startCoalescing() error {
	if !r.coalesce || r.waitReplicas > 0 {
		return nil
	}
	opts := &redis.AutoPipelineOptions{MaxBatchSize: coalesceBatch, MaxConcurrentBatches: 1, MaxQueuedCommands: coalesceQueue}
	var ap *redis.AutoPipeliner
	var err error
	switch c := r.client.(type) {
	case *redis.Client: // standalone, and Sentinel's failover client
		ap, err = c.AutoPipelineWithOptions(opts)
	case *redis.ClusterClient:
		// One auto-pipeliner per master, made when the master is first used.
		r.nodeAPs = &nodePipeliners{opts: opts}
		return nil
	default:
		return fmt.Errorf("limits: coalescing needs a *redis.Client or *redis.ClusterClient, not %T", r.client)
	}
	if err != nil {
		return fmt.Errorf("limits: auto-pipeliner: %w", err)
	}
	r.ap = ap
	return nil
}

// runTake runs takeLua for a decision whose keys share one slot: through the auto-pipeliner
// of the node serving them when coalescing, else on the client.
func (r *Redis) runTake(ctx context.Context, keys []string, args []any) *redis.Cmd {
	switch {
	case r.ap != nil:
		return takeScript.Run(ctx, r.ap, keys, args...)
	case r.nodeAPs != nil:
		return r.runOnNode(ctx, takeScript, keys, args...)
	}
	return takeScript.Run(ctx, r.client, keys, args...)
}

// coalescing reports whether decisions go through auto-pipeliners.
func (r *Redis) coalescing() bool { return r.ap != nil || r.nodeAPs != nil }

// takeGroupsCoalesced is takeCluster's first step when coalescing: each node's call goes to
// that node's batch (the call's first key routes it), the nodes in parallel.
func (r *Redis) takeGroupsCoalesced(ctx context.Context, sc *scratch, groups []group) {
	cmds := make([]*redis.Cmd, len(groups))
	var wg sync.WaitGroup
	for gi, g := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			argv := nodeArgs(sc.keys[g.lo:g.hi], sc.args[g.lo:g.hi])
			cmds[gi] = r.runOnNode(ctx, nodeTakeScript, sc.keys[g.lo:g.lo+1], argv...)
		}()
	}
	wg.Wait()
	sc.cmds = append(sc.cmds, cmds...)
}

// Close stops the auto-pipeliner, if any, after the decisions under way.
func (r *Redis) Close() error {
	if r.nodeAPs != nil {
		r.nodeAPs.close()
	}
	if r.ap == nil {
		return nil
	}
	if err := r.ap.Close(); err != nil {
		return fmt.Errorf("limits: auto-pipeliner: %w", err)
	}
	return nil
}
