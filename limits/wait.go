package limits

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrNotReplicated is returned when fewer replicas than asked acknowledged a decision's writes
// in time (WithWaitReplicas): the request is not admitted on a count that a failover could
// lose.
var ErrNotReplicated = errors.New("limits: the decision's count did not reach enough replicas in time")

// RedisOption configures NewRedis.
type RedisOption func(*Redis)

// WithWaitReplicas makes every decision wait until n replicas hold its writes: WAIT n
// follows the script in the same pipeline (one round trip still), and a decision that fewer
// replicas acknowledged within timeout fails with ErrNotReplicated. Redis replication is
// asynchronous, so without it the counts of the last moments before a master dies can be lost
// with it, and tenants then get more than their quota after the failover.
func WithWaitReplicas(n int, timeout time.Duration) RedisOption {
	return func(r *Redis) {
		r.waitReplicas = n
		r.waitTimeout = timeout
	}
}

// runWaited runs script on c followed by WAIT in one pipeline, and returns the script's reply.
// A NOSCRIPT answer (nothing ran) is retried with the script's source.
func (r *Redis) runWaited(ctx context.Context, c redis.Cmdable, script *redis.Script, src string, keys []string, args ...any) *redis.Cmd {
	cmd, wait := r.pipeWaited(ctx, c, func(p redis.Pipeliner) *redis.Cmd { return p.EvalSha(ctx, script.Hash(), keys, args...) })
	if redis.HasErrorPrefix(cmd.Err(), "NOSCRIPT") {
		cmd, wait = r.pipeWaited(ctx, c, func(p redis.Pipeliner) *redis.Cmd { return p.Eval(ctx, src, keys, args...) })
	}
	if cmd.Err() != nil {
		return cmd
	}
	if n, err := wait.Int64(); err != nil {
		cmd.SetErr(fmt.Errorf("limits: wait for replicas: %w", err))
	} else if n < int64(r.waitReplicas) {
		cmd.SetErr(fmt.Errorf("%w: %d of %d replicas within %v", ErrNotReplicated, n, r.waitReplicas, r.waitTimeout))
	}
	return cmd
}

func (r *Redis) pipeWaited(ctx context.Context, c redis.Cmdable, add func(redis.Pipeliner) *redis.Cmd) (*redis.Cmd, *redis.Cmd) {
	pipe := c.Pipeline()
	cmd := add(pipe)
	// Pipeliner has no Wait method; the command is the same.
	wait := pipe.Do(ctx, "wait", r.waitReplicas, r.waitTimeout.Milliseconds())
	_, _ = pipe.Exec(ctx) // errors are inspected per command
	return cmd, wait
}

// clusterWaited sends each node's script call with its WAIT to that node, the nodes in
// parallel (WAIT has no key, so it must go down the same connection as the script).
func (r *Redis) clusterWaited(ctx context.Context, nodes []*redis.Client, argv [][]any, firstKeys [][]string) []*redis.Cmd {
	cmds := make([]*redis.Cmd, len(nodes))
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cmds[i] = r.runWaited(ctx, nodes[i], nodeTakeScript, nodeTakeLua, firstKeys[i], argv[i]...)
		}()
	}
	wg.Wait()
	return cmds
}
