package limits

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"
)

// Usages is Usage for several counters at once: the Usage of each hit's rule for its id, in
// the order of hits, read without consuming anything. The Redis store reads them in one script
// call (on a Cluster, one per node touched, the nodes in parallel), so a caller that needs
// every counter a request would be subject to pays one round trip, not one per counter.
type Usages interface {
	Usages(ctx context.Context, hits []Hit) ([]Usage, error)
}

var (
	_ Usages = (*Memory)(nil)
	_ Usages = (*Redis)(nil)
	_ Usages = (*Guard)(nil)
)

// Usages implements Usages: one Usage after the other, each under its shard's lock.
func (m *Memory) Usages(ctx context.Context, hits []Hit) ([]Usage, error) {
	return usagesEach(ctx, m, hits)
}

// usagesLua is usageLua for many counters: KEYS[2i-1] is a counter, KEYS[2i] its tenant's
// quota, ARGV[i] its spec. Reply: usageLua's eight fields for each counter, in order, all
// read at one TIME.
const usagesLua = windowLua + quotaLua + quotaStateLua + `
local t = redis.call('TIME')
local sec, us = tonumber(t[1]), tonumber(t[2])
local out = {}
for i = 1, #ARGV do
  local ckey, qkey = KEYS[2 * i - 1], KEYS[2 * i]
  local algo, limit, win = parse(ARGV[i])
  local reserve = hold_terms(ARGV[i])
  local allow, used, g, base, ends, reset = state(ckey, qkey, algo, limit, win, sec, us)
  local reserved = 0
  if algo == 't' and reserve > 0 then
    reserved = holds(ckey, sec * 1000000 + us)
  end
  out[i] = string.format('%d %d %d %d %d %d %d %d', used, math.max(allow - used - reserved, 0), reset, allow, g, ends, base, reserved)
end
return table.concat(out, ' ')
`

var (
	usagesScript     = redis.NewScript(usagesLua)
	nodeUsagesScript = redis.NewScript(nodePrelude + usagesLua)
)

// Usages implements Usages: one script call on a standalone or Sentinel client; on a Cluster
// one call of the node variant per master serving the counters (a counter and its tenant's
// quota share a hash tag, so a slot), the nodes in parallel.
func (r *Redis) Usages(ctx context.Context, hits []Hit) ([]Usage, error) {
	out, rd, err := r.usageCounters(hits)
	switch {
	case err != nil:
		return nil, err
	case len(rd.idx) == 0:
		return out, nil
	case r.cluster == nil:
		reply, err := usagesScript.Run(ctx, r.client, rd.keys, rd.specs...).Text()
		if err != nil {
			return nil, r.followTopology(ctx, withKey(fmt.Errorf("limits: usage: %w", err), rd.keys))
		}
		if err := parseUsages(reply, rd.idx, out); err != nil {
			return nil, withKey(err, rd.keys)
		}
		return out, nil
	}
	if err := r.usagesByNode(ctx, rd, out); err != nil {
		return nil, err
	}
	return out, nil
}

// usageRead is what Usages sends: the counters of the enabled limits of its hits.
type usageRead struct {
	keys  []string // counter, quota, counter, quota, ...
	specs []any    // per pair
	idx   []int    // the hit of each pair
}

// usageCounters returns a Usage per hit with what its rule says (the rest is read), and the
// counters to read.
func (r *Redis) usageCounters(hits []Hit) ([]Usage, usageRead, error) {
	out := make([]Usage, len(hits))
	var rd usageRead
	for i, h := range hits {
		cr, err := r.rules.get(h.Rule)
		if err != nil {
			return nil, rd, fmt.Errorf("limits: usage: %w", err)
		}
		rule := h.Rule
		out[i] = Usage{Name: rule.Name, Limit: rule.Limit, Unit: rule.Unit, Reserves: rule.Unit == Tokens && rule.Reserve > 0}
		if !cr.enabled {
			continue
		}
		rd.keys = append(rd.keys, cr.keyPre+h.ID+"}", cr.quotaPre+h.ID+"}")
		rd.specs = append(rd.specs, cr.spec)
		rd.idx = append(rd.idx, i)
	}
	return out, rd, nil
}

// usagesByNode reads rd on a Cluster, one call of the node script per master serving its
// pairs, the masters in parallel, and fills out.
func (r *Redis) usagesByNode(ctx context.Context, rd usageRead, out []Usage) error {
	clients, node, err := r.pairNodes(ctx, rd)
	if err != nil {
		return r.followTopology(ctx, err)
	}
	replies := make([]string, len(clients))
	errs := make([]error, len(clients))
	eachNode(len(clients), func(n int) {
		var nkeys []string
		var nspecs []any
		for k := range rd.idx {
			if node[k] == n {
				nkeys = append(nkeys, rd.keys[2*k], rd.keys[2*k+1])
				nspecs = append(nspecs, rd.specs[k])
			}
		}
		// The node script's ARGV, as nodeArgs builds it, here without copying nspecs: they
		// then stay on this goroutine's stack.
		argv := make([]any, 0, 1+len(nkeys)+len(nspecs))
		argv = append(argv, len(nkeys))
		for _, k := range nkeys {
			argv = append(argv, k)
		}
		argv = append(argv, nspecs...)
		replies[n], errs[n] = nodeUsagesScript.Run(ctx, clients[n], nkeys[:1], argv...).Text()
		if errs[n] != nil {
			errs[n] = withKey(fmt.Errorf("limits: usage on %s: %w", clients[n].Options().Addr, errs[n]), nkeys)
		}
	})
	for n := range clients {
		if errs[n] != nil {
			return r.followTopology(ctx, errs[n])
		}
		var nidx []int
		for k, i := range rd.idx {
			if node[k] == n {
				nidx = append(nidx, i)
			}
		}
		if err := parseUsages(replies[n], nidx, out); err != nil {
			return err
		}
	}
	return nil
}

// pairNodes returns the masters serving rd's pairs (from go-redis's cached cluster state),
// and for each pair the index of its master among them.
func (r *Redis) pairNodes(ctx context.Context, rd usageRead) ([]*redis.Client, []int, error) {
	var clients []*redis.Client
	node := make([]int, len(rd.idx))
	for k := range rd.idx {
		c, err := r.cluster.MasterForKey(ctx, rd.keys[2*k])
		if err != nil {
			return nil, nil, fmt.Errorf("limits: cluster node of %s: %w", rd.keys[2*k], err)
		}
		n := slices.Index(clients, c)
		if n < 0 {
			n = len(clients)
			clients = append(clients, c)
		}
		node[k] = n
	}
	return clients, node, nil
}

// parseUsages fills out[idx[k]] from the k-th eight fields of a usagesLua reply.
func parseUsages(reply string, idx []int, out []Usage) error {
	f := fields{s: reply}
	var v [8]int64
	for _, i := range idx {
		for j := range v {
			n, err := f.next()
			if err != nil {
				return fmt.Errorf("%w %q", errMalformedReply, reply)
			}
			v[j] = n
		}
		u := &out[i]
		u.Used, u.Remaining, u.Reset, u.Reserved = v[0], v[1], time.UnixMicro(v[2]).UTC(), v[7]
		u.Limit, u.Granted = v[3], v[4]
		if v[5] > 0 {
			u.Override = &OverrideTerms{Value: v[6], Expires: time.UnixMicro(v[5]).UTC()}
		}
	}
	if f.s != "" {
		return fmt.Errorf("%w %q: trailing data", errMalformedReply, reply)
	}
	return nil
}

// Usages implements Usages within the guard's timeout and breakers, as Usage does. A store
// without Usages is read one counter at a time.
func (g *Guard) Usages(ctx context.Context, hits []Hit) ([]Usage, error) {
	cctx, cancel := context.WithTimeout(ctx, g.o.Timeout)
	defer cancel()
	own := slices.Clone(hits) // an abandoned call never touches the caller's memory
	nodes := g.nodesOf(cctx, own, nil)
	if err := g.admit(nodes); err != nil {
		return nil, err
	}
	type result struct {
		us  []Usage
		err error
	}
	done := make(chan result, 1)
	go func() {
		us, err := UsagesOf(cctx, g.s, own)
		done <- result{us, err}
	}()
	var res result
	select {
	case res = <-done:
	case <-cctx.Done():
		if ctx.Err() != nil {
			res.err = fmt.Errorf("limits: guard: %w", ctx.Err())
		} else {
			res.err = fmt.Errorf("limits: guard: store call exceeded %v: %w", g.o.Timeout, context.DeadlineExceeded)
		}
	}
	err := g.record(ctx, nodes, res.err)
	if err != nil {
		return nil, err
	}
	return res.us, nil
}

// UsagesOf reads hits through s's Usages when it has one, else one Usage at a time.
func UsagesOf(ctx context.Context, s Store, hits []Hit) ([]Usage, error) {
	if m, ok := s.(Usages); ok {
		return m.Usages(ctx, hits)
	}
	return usagesEach(ctx, s, hits)
}

// usagesEach reads hits one Usage at a time.
func usagesEach(ctx context.Context, s Store, hits []Hit) ([]Usage, error) {
	out := make([]Usage, len(hits))
	for i, h := range hits {
		u, err := s.Usage(ctx, h.Rule, h.ID)
		if err != nil {
			return nil, err
		}
		out[i] = u
	}
	return out, nil
}
