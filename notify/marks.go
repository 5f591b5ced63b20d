package notify

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Marks remember which events were announced, each until a time of its own: for events that
// every replica detects again and again over a span longer than the outbox remembers them
// (SeenFor), such as a key's notice of its end, days long.
type Marks interface {
	// Mark records key until until and reports whether it was not recorded yet: true for
	// exactly one caller across the replicas that share the store.
	Mark(ctx context.Context, key string, until time.Time) (bool, error)
}

// RedisMarks keep marks in Redis, "<prefix>:notify:mark:<key>", each expiring at its until:
// shared by every replica, kept across restarts.
type RedisMarks struct {
	c      redis.UniversalClient
	prefix string
}

// NewRedisMarks keeps marks under prefix (redis.key_prefix).
func NewRedisMarks(c redis.UniversalClient, prefix string) *RedisMarks {
	return &RedisMarks{c: c, prefix: prefix + ":notify:mark:"}
}

func (m *RedisMarks) Mark(ctx context.Context, key string, until time.Time) (bool, error) {
	ok, err := m.c.SetArgs(ctx, m.prefix+key, 1, redis.SetArgs{Mode: "NX", ExpireAt: until}).Result()
	if err == redis.Nil {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("notify: mark: %w", err)
	}
	return ok == "OK", nil
}

// MemoryMarks keep marks in process (one replica without Redis; a restart forgets them).
type MemoryMarks struct {
	mu    sync.Mutex
	m     map[string]time.Time
	swept time.Time
}

func (m *MemoryMarks) Mark(_ context.Context, key string, until time.Time) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	if m.m == nil {
		m.m = map[string]time.Time{}
	}
	if now.Sub(m.swept) >= time.Minute {
		m.swept = now
		for k, u := range m.m {
			if !now.Before(u) {
				delete(m.m, k)
			}
		}
	}
	if u, ok := m.m[key]; ok && now.Before(u) {
		return false, nil
	}
	m.m[key] = until
	return true, nil
}
