package auth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// LastUse keeps when each registered key was last used, to the minute, off the request path:
// Touch records a use in memory (no I/O; nothing at all when the key's minute has not
// changed), and Flush, which the process runs once a minute, writes what changed to the store
// in one write. So a replica writes each key at most once a minute, and a request costs no
// store command. The store keeps the latest minute any replica wrote (replica-agnostic).
type LastUse struct {
	store LastUseStore
	seen  sync.Map // digest -> *atomic.Int64: the minute (Unix seconds / 60) last recorded
	mu    sync.Mutex
	dirty map[string]int64 // recorded since the last Flush
}

// LastUseStore keeps last uses by digest, in minutes since the Unix epoch; Save keeps the
// later of what it holds and what it is given.
type LastUseStore interface {
	SaveLastUse(ctx context.Context, minutes map[string]int64) error
	LoadLastUse(ctx context.Context) (map[string]int64, error)
}

// NewLastUse records last uses into store.
func NewLastUse(store LastUseStore) *LastUse {
	return &LastUse{store: store, dirty: map[string]int64{}}
}

// Touch records a use of the key of digest at now.
func (l *LastUse) Touch(digest string, now time.Time) {
	minute := now.Unix() / 60
	v, ok := l.seen.Load(digest)
	if !ok {
		v, _ = l.seen.LoadOrStore(digest, new(atomic.Int64))
	}
	last := v.(*atomic.Int64)
	if old := last.Load(); old >= minute || !last.CompareAndSwap(old, minute) {
		return
	}
	l.mu.Lock()
	l.dirty[digest] = max(l.dirty[digest], minute)
	l.mu.Unlock()
}

// Flush writes the uses recorded since the last Flush; on error they are kept for the next.
func (l *LastUse) Flush(ctx context.Context) error {
	l.mu.Lock()
	batch := l.dirty
	l.dirty = map[string]int64{}
	l.mu.Unlock()
	if len(batch) == 0 {
		return nil
	}
	if err := l.store.SaveLastUse(ctx, batch); err != nil {
		l.mu.Lock()
		for d, m := range batch {
			l.dirty[d] = max(l.dirty[d], m)
		}
		l.mu.Unlock()
		return fmt.Errorf("auth: last use: %w", err)
	}
	return nil
}

// Load is every key's last use as the store has it, with what this replica recorded and has
// not written yet.
func (l *LastUse) Load(ctx context.Context) (map[string]time.Time, error) {
	minutes, err := l.store.LoadLastUse(ctx)
	if err != nil {
		return nil, fmt.Errorf("auth: last use: %w", err)
	}
	l.mu.Lock()
	for d, m := range l.dirty {
		minutes[d] = max(minutes[d], m)
	}
	l.mu.Unlock()
	return Minutes(minutes), nil
}

// Minutes turns minutes since the Unix epoch into times, in UTC.
func Minutes(minutes map[string]int64) map[string]time.Time {
	out := make(map[string]time.Time, len(minutes))
	for d, m := range minutes {
		out[d] = time.Unix(m*60, 0).UTC()
	}
	return out
}

// WithLastUse sets each entry's LastUsed from uses (by digest).
func WithLastUse(es []Entry, uses map[string]time.Time) []Entry {
	for i := range es {
		if t, ok := uses[es[i].Digest]; ok {
			es[i].LastUsed = &t
		}
	}
	return es
}

// RedisLastUse keeps last uses in one sorted set of Redis, "<prefix>:keys:last_used": member
// the digest, score the minute; a save is one ZADD GT, so the latest minute stays whatever the
// order the replicas write in.
type RedisLastUse struct {
	client redis.UniversalClient
	key    string
}

// NewRedisLastUse keeps last uses in client's Redis under prefix ("gw" when empty).
func NewRedisLastUse(client redis.UniversalClient, prefix string) *RedisLastUse {
	if prefix == "" {
		prefix = "gw"
	}
	return &RedisLastUse{client: client, key: prefix + ":keys:last_used"}
}

func (r *RedisLastUse) SaveLastUse(ctx context.Context, minutes map[string]int64) error {
	members := make([]redis.Z, 0, len(minutes))
	for d, m := range minutes {
		members = append(members, redis.Z{Member: d, Score: float64(m)})
	}
	return r.client.ZAddGT(ctx, r.key, members...).Err()
}

func (r *RedisLastUse) LoadLastUse(ctx context.Context) (map[string]int64, error) {
	zs, err := r.client.ZRangeWithScores(ctx, r.key, 0, -1).Result()
	if err != nil {
		return nil, err
	}
	out := make(map[string]int64, len(zs))
	for _, z := range zs {
		if d, ok := z.Member.(string); ok {
			out[d] = int64(z.Score)
		}
	}
	return out, nil
}

// FileLastUse keeps last uses in a JSON file beside the keys file (one replica without Redis):
// a save reads it, keeps the later minute of each key and writes it back atomically.
type FileLastUse struct {
	Path string
	mu   sync.Mutex
}

func (f *FileLastUse) SaveLastUse(_ context.Context, minutes map[string]int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	cur, err := f.read()
	if err != nil {
		return err
	}
	for d, m := range minutes {
		cur[d] = max(cur[d], m)
	}
	data, err := json.Marshal(cur)
	if err != nil {
		return err
	}
	return writeAtomic(f.Path, data, 0o600)
}

func (f *FileLastUse) LoadLastUse(context.Context) (map[string]int64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.read()
}

func (f *FileLastUse) read() (map[string]int64, error) {
	data, err := os.ReadFile(f.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return map[string]int64{}, nil
	}
	if err != nil {
		return nil, err
	}
	out := map[string]int64{}
	if err := json.Unmarshal(data, &out); err != nil {
		return nil, fmt.Errorf("%s: %w", f.Path, err)
	}
	return out, nil
}

// MemoryLastUse keeps last uses in process (a gateway with no store for them: they are lost
// at exit).
type MemoryLastUse struct {
	mu sync.Mutex
	m  map[string]int64
}

func (s *MemoryLastUse) SaveLastUse(_ context.Context, minutes map[string]int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]int64{}
	}
	for d, m := range minutes {
		s.m[d] = max(s.m[d], m)
	}
	return nil
}

func (s *MemoryLastUse) LoadLastUse(context.Context) (map[string]int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]int64, len(s.m))
	for d, m := range s.m {
		out[d] = m
	}
	return out, nil
}
