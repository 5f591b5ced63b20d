package engine

import (
	"errors"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/docsgate/gateway/limits"
)

// dataErrorEvery is how often a limiter reply about one key's data is logged at most.
const dataErrorEvery = time.Minute

// dataErrorLog logs limiter replies about one key's data (limits.KindData: a key someone wrote
// with another type under a tenant's counter) at most once a minute: such a key fails every
// request of its tenant, and one line a minute naming it and the error is what an operator
// needs to delete it, where a line per request would flood the log. Each request is counted
// in gateway_ratelimit_decision_errors_total{kind="data"} all the same.
type dataErrorLog struct {
	mu         sync.Mutex
	last       time.Time
	suppressed int // not logged since the last line
}

func (l *dataErrorLog) log(log *zap.Logger, err error) {
	now := time.Now()
	l.mu.Lock()
	if !l.last.IsZero() && now.Sub(l.last) < dataErrorEvery {
		l.suppressed++
		l.mu.Unlock()
		return
	}
	l.last = now
	suppressed := l.suppressed
	l.suppressed = 0
	l.mu.Unlock()
	key := ""
	var de *limits.DataError
	if errors.As(err, &de) {
		key = de.Key
	}
	log.Error("limiter data error: a Redis key holds what the limiter cannot read; its tenant's requests are answered by redis.on_error until it is deleted",
		zap.String("redis_key", key), zap.Error(err), zap.Int("not_logged_since_last", suppressed))
}
