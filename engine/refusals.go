package engine

import (
	"sync"
	"time"

	"github.com/docsgate/gateway/limits"
)

// The refusals of each limit, counted by this process as its decisions are accounted (no
// store write on the request path): in the limit's current window and since the process
// started. The usage page shows them beside each limit. The counters belong to the Engine
// and outlive reloads; a reload sets the window they count in (the limit's, as its default
// limits count it).

type refusalCounts struct {
	since time.Time
	mu    sync.RWMutex
	by    map[string]*refusalCount // limit name -> its count
}

func newRefusalCounts(since time.Time) *refusalCounts {
	return &refusalCounts{since: since, by: map[string]*refusalCount{}}
}

// of is the count of limit name, created on first use; window is the limit's (zero: none).
func (rc *refusalCounts) of(name string, window limits.Window) *refusalCount {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	c := rc.by[name]
	if c == nil {
		c = &refusalCount{}
		rc.by[name] = c
	}
	c.mu.Lock()
	c.window = window
	c.mu.Unlock()
	return c
}

// add counts one refusal of limit name at now (shadow: one a shadow limit would have made).
// A limit no policy put in force counts nothing.
func (rc *refusalCounts) add(name string, shadow bool, now time.Time) {
	rc.mu.RLock()
	c := rc.by[name]
	rc.mu.RUnlock()
	c.add(shadow, now)
}

// read is limit name's counts as of now.
func (rc *refusalCounts) read(name string, now time.Time) limits.Refusals {
	rc.mu.RLock()
	c := rc.by[name]
	rc.mu.RUnlock()
	out := limits.Refusals{Since: rc.since}
	if c == nil {
		return out
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	out.Total, out.ShadowTotal = c.total, c.shadowTotal
	if c.window.IsZero() {
		return out
	}
	start, _ := c.window.Bounds(now)
	out.WindowStart = start
	if c.start == start.Unix() {
		out.InWindow, out.ShadowInWindow = c.inWindow, c.shadowInWindow
	}
	return out
}

// refusalCount is one limit's.
type refusalCount struct {
	mu                       sync.Mutex
	window                   limits.Window // zero: no window (streams)
	start                    int64         // the window inWindow counts (Unix seconds)
	inWindow, shadowInWindow int64
	total, shadowTotal       int64
}

// add counts one refusal (shadow: one a shadow limit would have made) at now.
func (c *refusalCount) add(shadow bool, now time.Time) {
	if c == nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.window.IsZero() {
		if start, _ := c.window.Bounds(now); start.Unix() != c.start {
			c.start, c.inWindow, c.shadowInWindow = start.Unix(), 0, 0
		}
	}
	if shadow {
		c.shadowInWindow++
		c.shadowTotal++
		return
	}
	c.inWindow++
	c.total++
}
