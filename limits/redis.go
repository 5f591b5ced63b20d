package limits

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redis is a Store shared by all gateway replicas. Every Take is one script
// call (EVALSHA, falling back to EVAL on NOSCRIPT) that reads Redis' own TIME,
// so replicas with skewed clocks agree on windows. On a *redis.ClusterClient
// the hits are grouped by hash slot and decided with at most one round trip
// per node (see cluster.go).
//
// Keys are "<prefix>:<rule name>:{<id>}" ("...:tokens:{<id>}", "...:<window>:gcra:{<id>}": counterKeyPart).
// The id is a hash tag, so all rules of one id share a slot.
type Redis struct {
	client  redis.UniversalClient
	cluster *redis.ClusterClient
	master  *masterName // names the node of a standalone or Sentinel client (nodes.go)
	rules   ruleCache
	pool    sync.Pool // *scratch, reused buffers of the hot path
	// onCrossed is told what charges of tokens crossed (WithCrossings); nil: nobody asks.
	onCrossed func(Crossed)

	auditMax     int        // see WithRedisAuditMax
	readsOnly    bool       // see WithReadsOnly
	flags        quotaFlags // which limits have run-time quotas (quota_redis.go)
	waitReplicas int        // see WithWaitReplicas
	waitTimeout  time.Duration
	coalesce     bool           // see WithCoalescing
	comb         *combiner      // coalescing on a standalone or Sentinel client
	nodeCombs    *nodeCombiners // coalescing on a Cluster: one per master
}

// scratch holds the per-Take buffers. Entries are parallel slices per key sent
// to Redis (disabled rules are not sent).
type scratch struct {
	keys    []string // the counters
	qkeys   []string // their tenants' run-time quotas (see quota.go), in the same slots
	all     []string // keys then qkeys, as a standalone call declares them
	args    []any
	idx     []int   // hit index of each key
	units   []int64 // units each key's hit takes (Hit.Units; 0: a check)
	ws      []int64 // window start reported per key (for cluster compensation)
	slots   []uint16
	cmds    []*redis.Cmd
	gargs   []any
	clients []*redis.Client // Cluster: the node of each group (byNode)
	nodes   []string        // and its name
	hold    string          // names the decision's holds (see hold.go); "" without
}

// NewRedis returns a Redis store. prefix (e.g. "gw") starts every key name. An option the
// client cannot honour (coalescing on a client that is neither a *redis.Client nor a
// *redis.ClusterClient) is an error.
func NewRedis(client redis.UniversalClient, prefix string, opts ...RedisOption) (*Redis, error) {
	r := &Redis{client: client}
	switch c := client.(type) {
	case *redis.ClusterClient:
		r.cluster = c
	case *redis.Client:
		r.master = newMasterName(c)
	default:
		r.master = &masterName{addr: "redis"}
	}
	if prefix != "" {
		r.rules.prefix = prefix + ":"
	}
	r.pool.New = func() any { return new(scratch) }
	for _, o := range opts {
		o(r)
	}
	if err := r.startCoalescing(); err != nil {
		return nil, err
	}
	if !r.readsOnly {
		r.flags.start(r)
	}
	return r, nil
}

// BoundByDeadline implements DeadlineBound: go-redis ends a call (pool waits, dials, reads and
// writes) by its context's deadline when the client has ContextTimeoutEnabled.
func (r *Redis) BoundByDeadline() bool {
	switch c := r.client.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	}
	return false
}

// Key returns the Redis key of rule r and id (for operators and tests).
func (r *Redis) Key(rule *Rule, id string) (string, error) {
	cr, err := r.rules.get(rule)
	if err != nil {
		return "", err
	}
	return cr.keyPre + id + "}", nil
}

func (s *scratch) reset() {
	s.keys = s.keys[:0]
	s.qkeys = s.qkeys[:0]
	s.all = s.all[:0]
	clear(s.args) // drop references held from the last call
	s.args = s.args[:0]
	s.idx = s.idx[:0]
	s.units = s.units[:0]
	s.ws = s.ws[:0]
	s.slots = s.slots[:0]
	clear(s.cmds)
	s.cmds = s.cmds[:0]
	clear(s.clients)
	s.clients = s.clients[:0]
	s.nodes = s.nodes[:0]
	s.hold = ""
}

// Take implements Store.
func (r *Redis) Take(ctx context.Context, hits []Hit, d *Decision) error {
	d.reset(len(hits))
	sc := r.pool.Get().(*scratch)
	defer func() { sc.reset(); r.pool.Put(sc) }()
	sc.reset()
	if err := r.prepare(sc, hits, d); err != nil {
		return err
	}
	if len(sc.keys) == 0 {
		d.Allowed = true
		return nil
	}
	if needsHold(hits) {
		sc.hold = newHold()
	}
	if r.cluster != nil && !sameSlot(sc) {
		err := r.takeCluster(ctx, sc, d)
		if err != nil {
			r.releaseLost(sc.hold, hits)
		}
		return r.followTopology(ctx, withKey(err, sc.keys, sc.qkeys))
	}
	sc.all = appendQuotaKeys(append(sc.all, sc.keys...), sc.qkeys)
	if sc.hold != "" {
		sc.args = append(sc.args, "@"+sc.hold)
	}
	var cmd *redis.Cmd
	switch {
	case r.waitReplicas == 0:
		cmd = r.runTake(ctx, sc.all, sc.args)
	case r.cluster != nil: // WAIT must reach the node that ran the script
		node, err := r.cluster.MasterForKey(ctx, sc.keys[0])
		if err != nil {
			return r.followTopology(ctx, fmt.Errorf("limits: take: %w", err))
		}
		cmd = r.runWaited(ctx, node, takeScript, takeLua, sc.all, sc.args...)
	default:
		cmd = r.runWaited(ctx, r.client, takeScript, takeLua, sc.all, sc.args...)
	}
	reply, err := cmd.Text()
	if err != nil {
		r.releaseLost(sc.hold, hits)
		return r.followTopology(ctx, withKey(fmt.Errorf("limits: take: %w", err), sc.all))
	}
	ok, err := parseTake(reply, sc.idx, sc.qkeys, sc.ws, d.Results)
	if err != nil {
		r.releaseLost(sc.hold, hits)
		return withKey(err, sc.all)
	}
	d.Allowed = ok
	if ok {
		d.Hold = sc.hold
	}
	return nil
}

// prepare puts the keys and arguments of hits' enabled rules into sc; a disabled rule's
// result is admitted at once.
func (r *Redis) prepare(sc *scratch, hits []Hit, d *Decision) error {
	for i := range hits {
		h := &hits[i]
		cr, err := r.rules.get(h.Rule)
		if err != nil {
			return fmt.Errorf("limits: take: %w", err)
		}
		d.Results[i].Rule = h.Rule
		if !cr.enabled {
			d.Results[i].Allowed = true
			continue
		}
		if !r.flags.on(h.Rule.Name) {
			sc.keys = append(sc.keys, cr.keyPre+h.ID+"}")
			sc.qkeys = append(sc.qkeys, "")
			sc.args = append(sc.args, withUnits(cr.spec, h))
		} else {
			// Both keys in one allocation: the counter's name, then the quota's.
			both := cr.keyPre + h.ID + "}" + cr.quotaPre + h.ID + "}"
			cut := len(cr.keyPre) + len(h.ID) + 1
			sc.keys = append(sc.keys, both[:cut])
			sc.qkeys = append(sc.qkeys, both[cut:])
			sc.args = append(sc.args, withUnits(cr.specQ, h))
		}
		sc.idx = append(sc.idx, i)
		sc.units = append(sc.units, h.units())
	}
	sc.ws = append(sc.ws, make([]int64, len(sc.keys))...)
	return nil
}

// Usage implements Store.
func (r *Redis) Usage(ctx context.Context, rule *Rule, id string) (Usage, error) {
	cr, err := r.rules.get(rule)
	if err != nil {
		return Usage{}, fmt.Errorf("limits: usage: %w", err)
	}
	u := Usage{Name: rule.Name, Limit: rule.Limit, Unit: rule.Unit, Reserves: rule.Unit == Tokens && rule.Reserve > 0}
	if !cr.enabled {
		return u, nil
	}
	keys := []string{cr.keyPre + id + "}", cr.quotaPre + id + "}"}
	reply, err := usageScript.Run(ctx, r.client, keys, cr.spec).Text()
	if err != nil {
		return Usage{}, withKey(fmt.Errorf("limits: usage %s: %w", rule.Name, err), keys)
	}
	var v [8]int64
	if err := scanInts(reply, v[:]); err != nil {
		return Usage{}, withKey(fmt.Errorf("limits: usage %s: %w", rule.Name, err), keys)
	}
	u.Used, u.Remaining, u.Reset, u.Reserved = v[0], v[1], time.UnixMicro(v[2]).UTC(), v[7]
	u.Limit, u.Granted = v[3], v[4]
	if v[5] > 0 {
		u.Override = &OverrideTerms{Value: v[6], Expires: time.UnixMicro(v[5]).UTC()}
	}
	return u, nil
}

// scanInts reads len(v) space-separated integers, all of reply.
func scanInts(reply string, v []int64) error {
	f := fields{s: reply}
	for i := range v {
		n, err := f.next()
		if err != nil {
			return fmt.Errorf("%w %q", errMalformedReply, reply)
		}
		v[i] = n
	}
	if f.s != "" {
		return fmt.Errorf("%w %q: trailing data", errMalformedReply, reply)
	}
	return nil
}

// parseTake fills results from a takeLua reply; idx maps reply entries to result indexes,
// qkeys says which carry the allowance (those whose quota key was sent), and ws receives the
// window starts.
func parseTake(reply string, idx []int, qkeys []string, ws []int64, res []Result) (bool, error) {
	f := fields{s: reply}
	ok, err := f.next()
	if err != nil || ok < 0 || ok > 1 {
		return false, fmt.Errorf("%w %q", errMalformedReply, reply)
	}
	var v [7]int64
	for k, i := range idx {
		n := 5
		if qkeys[k] != "" {
			n = 7
		}
		for j := range n {
			if v[j], err = f.next(); err != nil {
				return false, fmt.Errorf("%w %q", errMalformedReply, reply)
			}
		}
		r := &res[i]
		r.Allowed = v[0] == 1
		r.Remaining = max(v[1], 0)
		r.Reset = time.Duration(max(v[2], 0)) * time.Microsecond
		r.RetryAfter = time.Duration(max(v[3], 0)) * time.Microsecond
		r.WindowStart = v[4]
		r.Limit, r.base = r.Rule.Limit, r.Rule.Limit
		if n == 7 {
			r.Limit, r.base = v[5], v[6]
		}
		ws[k] = v[4]
	}
	for f.s != "" { // the marks crossed (takeLua)
		for j := range 4 {
			if v[j], err = f.next(); err != nil {
				return false, fmt.Errorf("%w %q: trailing data", errMalformedReply, reply)
			}
		}
		pos, bits := v[0], v[1]
		if pos < 1 || pos > int64(len(idx)) || bits <= 0 || bits > crossedMax {
			return false, fmt.Errorf("%w %q: trailing data", errMalformedReply, reply)
		}
		r := &res[idx[pos-1]]
		r.Crossed, r.Used, r.Held = uint16(bits), v[2], v[3]
	}
	return ok == 1, nil
}

// appendQuotaKeys appends the quota keys that were sent (not "") to keys.
func appendQuotaKeys(keys, qkeys []string) []string {
	for _, k := range qkeys {
		if k != "" {
			keys = append(keys, k)
		}
	}
	return keys
}

var errField = errors.New("limits: bad integer field")

// fields walks space-separated integers without allocating.
type fields struct{ s string }

func (f *fields) next() (int64, error) {
	s := f.s
	i := 0
	neg := false
	if i < len(s) && s[i] == '-' {
		neg = true
		i++
	}
	start := i
	var n int64
	for ; i < len(s) && s[i] >= '0' && s[i] <= '9'; i++ {
		n = n*10 + int64(s[i]-'0')
	}
	if i == start || i-start > 18 {
		return 0, errField
	}
	if i < len(s) {
		if s[i] != ' ' {
			return 0, errField
		}
		i++
	}
	f.s = s[i:]
	if neg {
		n = -n
	}
	return n, nil
}

// Preload loads the scripts into every master (SCRIPT LOAD), so that the first decisions after
// a start or a Redis restart are one EVALSHA each, not EVALSHA, NOSCRIPT and EVAL. The
// NOSCRIPT fallback stays in place for a master that restarts later.
func (r *Redis) Preload(ctx context.Context) error {
	load := func(ctx context.Context, c redis.Scripter) error {
		for _, s := range []*redis.Script{takeScript, usageScript, usagesScript, nodeUsagesScript, giveBackScript, nodeTakeScript, nodeGiveBackScript, debitScript, quotaScript, settleScript, refreshScript, growScript} {
			if err := s.Load(ctx, c).Err(); err != nil {
				return fmt.Errorf("limits: script load: %w", err)
			}
		}
		return nil
	}
	if r.cluster != nil {
		return r.cluster.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return load(ctx, c) })
	}
	return load(ctx, r.client)
}

// followTopology asks a Cluster client to reload the cluster's layout after a failed call: a
// dead master's slots move to its promoted replica, and go-redis would otherwise keep its
// cached layout (and keep failing) until its periodic reload, a minute later. Reloads run in
// the background and are coalesced by go-redis, so a burst of failures costs one reload. A
// reply about a key's data says the node is there: nothing to reload.
func (r *Redis) followTopology(ctx context.Context, err error) error {
	if err != nil && r.cluster != nil && ctx.Err() == nil && Classify(err) != KindData {
		r.cluster.ReloadState(ctx)
	}
	return err
}
