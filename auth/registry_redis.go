package auth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/zap"
	"golang.org/x/sync/singleflight"
)

// RedisRegistryOptions configures a RedisRegistry.
type RedisRegistryOptions struct {
	// Prefix names the keys: "<prefix>:key:{<digest>}" (JSON value), the index set
	// "<prefix>:keys" and the pub/sub channel "<prefix>:keys:changed". Default "gw".
	Prefix string
	// CacheTTL is the safety net: cached entries (and negative "unknown" answers) expire after
	// this even when an invalidation was lost. Default 10s.
	CacheTTL time.Duration
	// NegativeTTL is how long "unknown key" answers are cached (default 1s, at most CacheTTL):
	// invented keys must not hammer Redis.
	NegativeTTL time.Duration
	Logger      *zap.Logger
}

// RedisRegistry keeps entries in Redis, shared by every replica, behind a local cache.
//
// Lookups are answered from the cache (a sync.Map: no lock, no allocation, no network) until
// the entry expires. Add and Revoke write Redis, then PUBLISH the digest; every replica's
// subscription drops that digest from its cache, so changes reach all replicas within a
// round trip or two. When the subscription is (re)established the whole cache is dropped,
// since messages may have been missed meanwhile; CacheTTL bounds staleness if the
// subscription is silently broken.
type RedisRegistry struct {
	client  redis.UniversalClient
	log     *zap.Logger
	prefix  string
	index   string
	channel string
	ttl     time.Duration
	negTTL  time.Duration

	cache sync.Map // digest -> *cached

	// storeMu orders cache fills after a Redis read against invalidations: a fill is kept only
	// when no invalidation happened since its read began (gen unchanged). Never taken by
	// cache hits.
	storeMu sync.Mutex
	gen     uint64

	// flights shares one Redis read among concurrent lookups of one digest, so a burst of
	// requests with the same uncached (or invented) key costs one GET.
	flights singleflight.Group

	psMu   sync.Mutex
	ps     *redis.PubSub
	closed bool

	subscribed atomic.Bool
	firstSub   chan struct{}
	cancel     context.CancelFunc
	done       chan struct{}
	closeOnce  sync.Once
	closeErr   error
}

var _ Registry = (*RedisRegistry)(nil)

type cached struct {
	e       Entry
	ok      bool
	expires time.Time
}

// lookup is what one shared read found.
type lookup struct {
	e  Entry
	ok bool
}

const (
	// receiveWait is how often the subscription loop wakes up when idle, for housekeeping.
	receiveWait = time.Second
	// pingAfter: an idle subscription is pinged after this long; no pong within pingAfter
	// more and the subscription is rebuilt.
	pingAfter = 3 * time.Second
	// startWait bounds how long NewRedisRegistry waits for the first subscription.
	startWait = 2 * time.Second
	// closeWait bounds how long Close waits for the subscription goroutine.
	closeWait = 5 * time.Second
	// listChunk is how many GETs List sends per pipeline.
	listChunk = 500
	// casAttempts bounds the retries of a check-and-set on an entry (Add, Revoke, Rotate).
	casAttempts = 10
)

// NewRedisRegistry starts the invalidation subscription and waits (at most 2s, or until ctx
// ends) for it to be established. A Redis that is down at start is not an error: lookups fail
// until it answers, and the subscription keeps retrying by itself. Close stops it; the client
// stays open (the caller owns it).
func NewRedisRegistry(ctx context.Context, client redis.UniversalClient, o RedisRegistryOptions) (*RedisRegistry, error) {
	if client == nil {
		return nil, errors.New("auth: redis registry: no client")
	}
	if o.Prefix == "" {
		o.Prefix = "gw"
	}
	if o.CacheTTL < 0 || o.NegativeTTL < 0 {
		return nil, errors.New("auth: redis registry: negative cache TTL")
	}
	if o.CacheTTL == 0 {
		o.CacheTTL = 10 * time.Second
	}
	if o.NegativeTTL == 0 {
		o.NegativeTTL = time.Second
	}
	o.NegativeTTL = min(o.NegativeTTL, o.CacheTTL)
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	runCtx, cancel := context.WithCancel(context.Background())
	r := &RedisRegistry{
		client:   client,
		log:      o.Logger,
		prefix:   o.Prefix,
		index:    o.Prefix + ":keys",
		channel:  o.Prefix + ":keys:changed",
		ttl:      o.CacheTTL,
		negTTL:   o.NegativeTTL,
		firstSub: make(chan struct{}),
		cancel:   cancel,
		done:     make(chan struct{}),
	}
	r.ps = client.Subscribe(runCtx, r.channel)
	go r.run(runCtx)
	timer := time.NewTimer(startWait)
	defer timer.Stop()
	select {
	case <-r.firstSub:
	case <-timer.C:
		r.log.Warn("key registry: invalidation subscription not established yet; retrying in the background")
	case <-ctx.Done():
	}
	return r, nil
}

func (r *RedisRegistry) keyName(digest string) string {
	return r.prefix + ":key:{" + digest + "}"
}

// Subscribed reports whether the invalidation subscription is currently established.
func (r *RedisRegistry) Subscribed() bool { return r.subscribed.Load() }

// Lookup answers from the local cache when it can; a miss reads Redis once (concurrent misses
// for one digest share that read) and caches the answer, positive for CacheTTL, negative for
// NegativeTTL. An error means Redis could not be read and nothing was cached.
func (r *RedisRegistry) Lookup(ctx context.Context, digest string) (Entry, bool, error) {
	if e, ok, hit := r.LookupCached(digest); hit {
		return e, ok, nil
	}
	if !ValidDigest(digest) {
		return Entry{}, false, nil
	}
	return r.fetch(ctx, digest)
}

// LookupCached is Lookup's answer from the replica's cache alone (hit false: not cached, or
// expired), with no I/O: the gateway then makes no trace span for the lookup.
func (r *RedisRegistry) LookupCached(digest string) (e Entry, ok, hit bool) {
	if v, found := r.cache.Load(digest); found {
		c := v.(*cached)
		if time.Now().Before(c.expires) {
			return c.e, c.ok, true
		}
	}
	return Entry{}, false, false
}

func (r *RedisRegistry) fetch(ctx context.Context, digest string) (Entry, bool, error) {
	for {
		ch := r.flights.DoChan(digest, func() (any, error) {
			r.storeMu.Lock()
			gen := r.gen
			r.storeMu.Unlock()
			// The first caller's context bounds the shared read.
			e, ok, err := r.get(ctx, digest)
			if err != nil {
				return nil, err
			}
			ttl := r.ttl
			if !ok {
				ttl = r.negTTL
			}
			r.storeMu.Lock()
			if r.gen == gen {
				r.cache.Store(digest, &cached{e: e, ok: ok, expires: time.Now().Add(ttl)})
			}
			r.storeMu.Unlock()
			return lookup{e, ok}, nil
		})
		select {
		case res := <-ch:
			// The first caller's context ended: ours has not, so read for ourselves.
			if res.Err != nil && (errors.Is(res.Err, context.Canceled) || errors.Is(res.Err, context.DeadlineExceeded)) && ctx.Err() == nil {
				continue
			}
			if res.Err != nil {
				return Entry{}, false, res.Err
			}
			l := res.Val.(lookup)
			return l.e.clone(), l.ok, nil
		case <-ctx.Done():
			return Entry{}, false, ctx.Err()
		}
	}
}

// get reads one entry from Redis.
func (r *RedisRegistry) get(ctx context.Context, digest string) (Entry, bool, error) {
	data, err := r.client.Get(ctx, r.keyName(digest)).Bytes()
	if errors.Is(err, redis.Nil) {
		return Entry{}, false, nil
	}
	if err != nil {
		return Entry{}, false, fmt.Errorf("auth: registry lookup: %w", err)
	}
	e, err := r.decode(digest, data)
	if err != nil {
		return Entry{}, false, err
	}
	return e, true, nil
}

func (r *RedisRegistry) decode(digest string, data []byte) (Entry, error) {
	var e Entry
	if err := json.Unmarshal(data, &e); err != nil {
		return Entry{}, fmt.Errorf("auth: registry entry %s: %w", digest, err)
	}
	if err := e.Validate(); err != nil {
		return Entry{}, fmt.Errorf("auth: registry entry %s: %w", digest, err)
	}
	if e.Digest != digest {
		return Entry{}, fmt.Errorf("auth: registry entry %s: holds digest %s", digest, e.Digest)
	}
	return e, nil
}

// Add writes the entry (insert or replace) and announces the change to every replica.
func (r *RedisRegistry) Add(ctx context.Context, e Entry) error {
	if err := e.Validate(); err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	// Two keys in different slots on a Cluster: not one transaction. The entry is written
	// first, so the index never names a key that was never written. The write is a
	// check-and-set on the entry's own key, so a revoked entry is never replaced and a
	// concurrent revocation is never overwritten (the transaction fails and is retried).
	key := r.keyName(e.Digest)
	update := func(tx *redis.Tx) error {
		next := e
		old, err := tx.Get(ctx, key).Bytes()
		if err != nil && !errors.Is(err, redis.Nil) {
			return err
		}
		if err == nil {
			var cur Entry
			if json.Unmarshal(old, &cur) == nil {
				if err := inactiveErr(cur, time.Now()); err != nil {
					return err
				}
				next = next.updating(cur)
			}
		}
		data, err := json.Marshal(next.normalize(time.Now()))
		if err != nil {
			return err
		}
		_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Set(ctx, key, data, 0)
			return nil
		})
		return err
	}
	var err error
	for range casAttempts {
		if err = r.client.Watch(ctx, update, key); !errors.Is(err, redis.TxFailedErr) {
			break
		}
	}
	if errors.Is(err, ErrRevoked) || errors.Is(err, ErrExpired) {
		return err
	}
	if err != nil {
		return fmt.Errorf("auth: registry add: %w", err)
	}
	if err := r.client.SAdd(ctx, r.index, e.Digest).Err(); err != nil {
		return fmt.Errorf("auth: registry add (index): %w", err)
	}
	return r.changed(ctx, e.Digest)
}

// Revoke marks the entry revoked now (a check-and-set on its key, so a concurrent change is
// not lost) and announces the change to every replica. Revoking twice keeps the first time.
func (r *RedisRegistry) Revoke(ctx context.Context, digest string) error {
	if !ValidDigest(digest) {
		return ErrUnknownKey
	}
	err := r.update(ctx, digest, func(e Entry) (Entry, bool, error) {
		now := time.Now()
		if e.Revoked != nil && !e.Revoked.After(now) {
			return e, false, nil // already revoked; still announced below
		}
		// Never revoked, or revoked at a time still to come: revoked now.
		return revokedNow(e, now), true, nil
	})
	if errors.Is(err, ErrUnknownKey) {
		return ErrUnknownKey
	}
	if err != nil {
		return fmt.Errorf("auth: registry revoke: %w", err)
	}
	return r.changed(ctx, digest)
}

// update changes one entry in an optimistic transaction on its key (WATCH, GET, SET in
// MULTI), retried while another writer gets in between. change gets the stored entry and says
// what to store and whether to store it; its error ends the update as it is. A digest that is
// not stored is ErrUnknownKey.
func (r *RedisRegistry) update(ctx context.Context, digest string, change func(Entry) (Entry, bool, error)) error {
	key := r.keyName(digest)
	var err error
	for range casAttempts {
		err = r.client.Watch(ctx, func(tx *redis.Tx) error {
			data, err := tx.Get(ctx, key).Bytes()
			if errors.Is(err, redis.Nil) {
				return ErrUnknownKey
			}
			if err != nil {
				return err
			}
			cur, err := r.decode(digest, data)
			if err != nil {
				return err
			}
			next, write, err := change(cur)
			if err != nil || !write {
				return err
			}
			if data, err = json.Marshal(next); err != nil {
				return err
			}
			_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.Set(ctx, key, data, 0)
				return nil
			})
			return err
		}, key)
		if !errors.Is(err, redis.TxFailedErr) {
			return err
		}
	}
	return err
}

// Rotate registers next and schedules old's end (Registry.Rotate). The two keys may live on
// different Cluster nodes, so it is no one transaction: next is written first, only if its
// digest is free (SET NX), then old is changed in a check-and-set on its own key; when that
// is refused (old revoked, expired or rotated meanwhile), next is deleted again. A rotation
// cut short between the two leaves next registered and unknown to anyone (its key was never
// handed out) and old as it was.
func (r *RedisRegistry) Rotate(ctx context.Context, old string, next Entry, oldEnds time.Time) (Entry, error) {
	if err := next.Validate(); err != nil {
		return Entry{}, fmt.Errorf("auth: %w", err)
	}
	if !ValidDigest(old) {
		return Entry{}, ErrUnknownKey
	}
	cur, ok, err := r.get(ctx, old)
	switch {
	case err != nil:
		return Entry{}, err
	case !ok:
		return Entry{}, ErrUnknownKey
	}
	rotatedExists := false
	if cur.RotatedTo != "" {
		n, err := r.client.Exists(ctx, r.keyName(cur.RotatedTo)).Result()
		if err != nil {
			return Entry{}, fmt.Errorf("auth: registry rotate: %w", err)
		}
		rotatedExists = n > 0
	}
	if err := inactiveErr(cur, time.Now()); err != nil {
		return Entry{}, err
	}
	if cur.RotatedTo != "" && rotatedExists {
		return Entry{}, ErrRotated
	}
	data, err := json.Marshal(next.normalize(time.Now()))
	if err != nil {
		return Entry{}, err
	}
	set, err := r.client.SetNX(ctx, r.keyName(next.Digest), data, 0).Result()
	if err != nil {
		return Entry{}, fmt.Errorf("auth: registry rotate: %w", err)
	}
	if !set {
		return Entry{}, ErrKeyExists
	}
	out, err := r.rotateOld(ctx, old, cur.RotatedTo, next, oldEnds)
	if err != nil {
		_ = r.client.Del(context.WithoutCancel(ctx), r.keyName(next.Digest)).Err()
		return Entry{}, err
	}
	if err := r.client.SAdd(ctx, r.index, next.Digest).Err(); err != nil {
		return Entry{}, fmt.Errorf("auth: registry rotate (index): %w", err)
	}
	if err := r.changed(ctx, next.Digest); err != nil {
		return out, err
	}
	return out, r.changed(ctx, old)
}

// rotateOld points old at next and schedules its end, in a check-and-set on its key: refused
// when old changed since it was read as pointing at rotatedTo.
func (r *RedisRegistry) rotateOld(ctx context.Context, old, rotatedTo string, next Entry, oldEnds time.Time) (Entry, error) {
	var out Entry
	err := r.update(ctx, old, func(cur Entry) (Entry, bool, error) {
		if cur.RotatedTo != rotatedTo {
			return cur, false, ErrRotated // rotated meanwhile
		}
		// Existence was checked before: next's by SET NX, an earlier successor's by EXISTS.
		var err error
		out, err = rotation(cur, next, oldEnds, time.Now(), func(string) bool { return false })
		return out, err == nil, err
	})
	if err != nil && !errors.Is(err, ErrUnknownKey) && !errors.Is(err, ErrRevoked) && !errors.Is(err, ErrExpired) && !errors.Is(err, ErrRotated) {
		return Entry{}, fmt.Errorf("auth: registry rotate: %w", err)
	}
	return out, err
}

// changed drops the digest locally and publishes it to every replica.
func (r *RedisRegistry) changed(ctx context.Context, digest string) error {
	r.invalidate(digest)
	if err := r.client.Publish(ctx, r.channel, digest).Err(); err != nil {
		return fmt.Errorf("auth: registry change stored, but not announced to other replicas (they see it within the cache TTL, %v): %w", r.ttl, err)
	}
	return nil
}

// List reads every entry named by the index, sorted by Created then Digest.
func (r *RedisRegistry) List(ctx context.Context) ([]Entry, error) {
	digests, err := r.client.SMembers(ctx, r.index).Result()
	if err != nil {
		return nil, fmt.Errorf("auth: registry list: %w", err)
	}
	out := make([]Entry, 0, len(digests))
	for start := 0; start < len(digests); start += listChunk {
		chunk := digests[start:min(start+listChunk, len(digests))]
		cmds := make([]*redis.StringCmd, len(chunk))
		_, err := r.client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, d := range chunk {
				cmds[i] = p.Get(ctx, r.keyName(d))
			}
			return nil
		})
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("auth: registry list: %w", err)
		}
		for i, cmd := range cmds {
			data, err := cmd.Bytes()
			if errors.Is(err, redis.Nil) {
				continue // indexed but gone: skip
			}
			if err != nil {
				return nil, fmt.Errorf("auth: registry list: %w", err)
			}
			e, err := r.decode(chunk[i], data)
			if err != nil {
				return nil, err
			}
			out = append(out, e)
		}
	}
	sortEntries(out)
	return out, nil
}

// Close stops the subscription and waits (bounded) for its goroutine. The client is not
// closed.
func (r *RedisRegistry) Close() error {
	r.closeOnce.Do(func() {
		r.cancel()
		r.psMu.Lock()
		r.closed = true
		_ = r.ps.Close()
		r.psMu.Unlock()
		timer := time.NewTimer(closeWait)
		defer timer.Stop()
		select {
		case <-r.done:
		case <-timer.C:
			r.closeErr = errors.New("auth: registry subscription did not stop in time")
		}
	})
	return r.closeErr
}

// invalidate drops one digest from the cache, and keeps reads already in flight from
// filling it with what they read before the change.
func (r *RedisRegistry) invalidate(digest string) {
	r.storeMu.Lock()
	r.gen++
	r.cache.Delete(digest)
	r.storeMu.Unlock()
}

func (r *RedisRegistry) invalidateAll() {
	r.storeMu.Lock()
	r.gen++
	r.cache.Clear()
	r.storeMu.Unlock()
}

// sweep drops expired entries, so invented keys do not pile up.
func (r *RedisRegistry) sweep(now time.Time) {
	r.cache.Range(func(k, v any) bool {
		if c := v.(*cached); !now.Before(c.expires) {
			r.cache.CompareAndDelete(k, v)
		}
		return true
	})
}

func (r *RedisRegistry) pubsub() *redis.PubSub {
	r.psMu.Lock()
	defer r.psMu.Unlock()
	return r.ps
}

// resubscribe replaces a subscription that stopped answering pings.
func (r *RedisRegistry) resubscribe(ctx context.Context) {
	r.psMu.Lock()
	defer r.psMu.Unlock()
	if r.closed {
		return
	}
	_ = r.ps.Close()
	r.ps = r.client.Subscribe(ctx, r.channel)
}

// run receives invalidations until Close. go-redis reconnects and resubscribes a broken
// subscription by itself on the next receive; each (re)subscription confirmation clears the
// cache.
func (r *RedisRegistry) run(ctx context.Context) {
	defer close(r.done)
	var (
		firstDone    bool
		down         bool // an outage was logged
		backoff      = 50 * time.Millisecond
		lastActivity = time.Now()
		pingSent     time.Time
		nextSweep    = time.Now().Add(r.negTTL)
	)
	for {
		msg, err := r.pubsub().ReceiveTimeout(ctx, receiveWait)
		now := time.Now()
		if !now.Before(nextSweep) {
			r.sweep(now)
			nextSweep = now.Add(r.negTTL)
		}
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				switch {
				case !pingSent.IsZero() && now.Sub(pingSent) > pingAfter:
					r.subscribed.Store(false)
					r.log.Warn("key registry: invalidation subscription stopped answering; rebuilding it")
					down = true
					r.resubscribe(ctx)
					pingSent, lastActivity = time.Time{}, now
				case pingSent.IsZero() && now.Sub(lastActivity) > pingAfter:
					if r.pubsub().Ping(ctx) == nil {
						pingSent = now
					}
				}
				continue
			}
			if r.subscribed.Swap(false) || !down {
				r.log.Warn("key registry: invalidation subscription lost; retrying (cached keys expire within cache_ttl)", zap.Error(err))
				down = true
			}
			if !sleepCtx(ctx, backoff) {
				return
			}
			backoff = min(backoff*2, time.Second)
			continue
		}
		lastActivity, pingSent = now, time.Time{}
		switch m := msg.(type) {
		case *redis.Subscription:
			if m.Kind == "subscribe" && m.Channel == r.channel {
				r.invalidateAll()
				r.subscribed.Store(true)
				backoff = 50 * time.Millisecond
				if down {
					r.log.Info("key registry: invalidation subscription re-established; cache cleared")
					down = false
				}
				if !firstDone {
					firstDone = true
					close(r.firstSub)
				}
			}
		case *redis.Message:
			if m.Channel == r.channel {
				r.invalidate(m.Payload)
			}
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
