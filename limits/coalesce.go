package limits

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// Coalescing (auto-pipelining): concurrent decisions bound for the same Redis node go out as
// one pipelined write, and their replies come back in one read (see combiner). Each decision is
// still exactly one script call, all-or-nothing on Redis server time; its own deadline (the
// Guard's redis.timeout) bounds how long it waits, and a batch that fails fails only the
// decisions it carried.

// coalesceDirect is how many calls to one node go out on their own at once before calls
// queue for a batch: at moderate load a lone call gains nothing from waiting for one on the
// wire, and sending it at once keeps the latency of no coalescing (measured by make bench in
// open loop at 2,000 req/s: with one call out at a time, p50 was 0.63 ms against 0.51 without
// coalescing). coalesceBatch bounds one batch (64 calls already cost Redis one read per 64);
// coalesceQueue bounds the decisions waiting for a node (past it a decision fails at once, as
// a Redis error does).
const (
	coalesceDirect = 4
	coalesceBatch  = 64
	coalesceQueue  = 4096
)

// WithCoalescing coalesces concurrent decisions per node. It has no effect together with
// WithWaitReplicas: WAIT must follow each script on the connection that ran it.
func WithCoalescing() RedisOption {
	return func(r *Redis) { r.coalesce = true }
}

// startCoalescing builds the combiner of r's client, or one per master on a Cluster.
func (r *Redis) startCoalescing() error {
	if !r.coalesce || r.waitReplicas > 0 {
		return nil
	}
	switch c := r.client.(type) {
	case *redis.Client: // standalone, and Sentinel's failover client
		r.comb = newCombiner(c, coalesceDirect, coalesceBatch, coalesceQueue)
	case *redis.ClusterClient:
		r.nodeCombs = &nodeCombiners{cluster: c} // made as masters are first used
	default:
		return fmt.Errorf("limits: coalescing needs a *redis.Client or *redis.ClusterClient, not %T", r.client)
	}
	return nil
}

// runTake runs takeLua for a decision whose keys share one slot: through the node's combiner
// when coalescing, else on the client.
func (r *Redis) runTake(ctx context.Context, keys []string, args []any) *redis.Cmd {
	switch {
	case r.comb != nil:
		return r.comb.run(ctx, takeScript, keys, args...)
	case r.nodeCombs != nil:
		return r.runOnNode(ctx, takeScript, keys, args...)
	}
	return takeScript.Run(ctx, r.client, keys, args...)
}

// Close stops the combiners, if any, after the decisions under way, and the reading of which
// limits have run-time quotas.
func (r *Redis) Close() error {
	r.flags.close()
	if r.nodeCombs != nil {
		r.nodeCombs.close()
	}
	if r.comb != nil {
		r.comb.close()
	}
	return nil
}
