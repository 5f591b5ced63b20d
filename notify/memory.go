package notify

import (
	"cmp"
	"container/heap"
	"context"
	"slices"
	"sync"
	"time"
)

// Memory is an Outbox in process, for a gateway without Redis. What it holds is lost with
// the process: an event detected but not yet delivered when the gateway stops is never sent.
//
// Add, Claim, Done, Retry, Kill, Requeue and Drop cost O(log n) per delivery (plus O(shares)
// to pick a share: a few, one per limit that sends events, of each kind); List sorts what it
// lists.
type Memory struct {
	mu    sync.Mutex
	max   int
	seq   int64
	items map[string]*memItem
	// pending holds each share's pending deliveries by when due (a leased one: when its
	// lease runs out); dead the dead letters by when they died, tenants' [0] and visitors' [1].
	pending map[Share]*memHeap
	dead    [2]memHeap
	// seen has the keys of Once deliveries by when added; seenOrder the same, oldest first,
	// to forget them after SeenFor without a scan.
	seen      map[string]time.Time
	seenOrder []seenKey
}

type memItem struct {
	d     Delivery
	at    time.Time // pending: when due, or when the lease runs out; dead: when it died
	lease int64     // 0: not leased
	in    *memHeap  // the heap holding it
	index int       // its place there
}

type seenKey struct {
	key string
	at  time.Time
}

// NewMemory returns an in-process outbox holding at most max deliveries (pending and dead;
// at least 1).
func NewMemory(max int) *Memory {
	if max < 1 {
		max = 1
	}
	return &Memory{max: max, items: map[string]*memItem{}, pending: map[Share]*memHeap{}, seen: map[string]time.Time{}}
}

func kind(visitor bool) int {
	if visitor {
		return 1
	}
	return 0
}

func (m *Memory) Add(_ context.Context, ds []Delivery) ([]Delivery, error) {
	for _, d := range ds {
		if !validDelivery(d) {
			return nil, ErrInvalid
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.forget(time.Now())
	var dropped []Delivery
	for _, d := range ds {
		if _, ok := m.items[d.Key]; ok {
			continue
		}
		if d.Once {
			if _, ok := m.seen[d.Key]; ok {
				continue
			}
			now := time.Now()
			m.seen[d.Key] = now
			m.seenOrder = append(m.seenOrder, seenKey{d.Key, now})
		}
		d.Dead, d.lease = false, 0
		if len(m.items) >= m.max {
			victim := m.victim(d.Share())
			if victim == nil {
				dropped = append(dropped, d)
				continue
			}
			m.remove(victim)
			dropped = append(dropped, victim.d)
		}
		it := &memItem{d: d, at: d.Next}
		m.items[d.Key] = it
		m.heapOf(d.Share()).add(it)
	}
	return dropped, nil
}

// forget drops the Once keys added more than SeenFor before now.
func (m *Memory) forget(now time.Time) {
	n := 0
	for _, s := range m.seenOrder {
		if now.Sub(s.at) <= SeenFor {
			break
		}
		if m.seen[s.key].Equal(s.at) {
			delete(m.seen, s.key)
		}
		n++
	}
	m.seenOrder = slices.Delete(m.seenOrder, 0, n)
}

// victim is what makes room for a delivery of share s (Outbox's rule), nil to refuse it.
func (m *Memory) victim(s Share) *memItem {
	for _, visitor := range []bool{true, false} {
		if !visitor && s.Visitor {
			return nil // a visitor's delivery never takes a tenant's room
		}
		if h := &m.dead[kind(visitor)]; h.Len() > 0 {
			return (*h)[0]
		}
		if l, ok := Largest(visitor, s, m.sizes); ok {
			return (*m.pending[l])[0]
		}
	}
	return nil
}

// sizes yields how many pending deliveries each share holds.
func (m *Memory) sizes(yield func(Share, int) bool) {
	for s, h := range m.pending {
		if !yield(s, h.Len()) {
			return
		}
	}
}

func (m *Memory) heapOf(s Share) *memHeap {
	h := m.pending[s]
	if h == nil {
		h = &memHeap{}
		m.pending[s] = h
	}
	return h
}

// remove takes it out of the outbox.
func (m *Memory) remove(it *memItem) {
	it.in.remove(it)
	delete(m.items, it.d.Key)
}

func (m *Memory) Claim(_ context.Context, now time.Time, n int, lease time.Duration) ([]Delivery, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Delivery
	for _, visitor := range []bool{false, true} {
		for len(out) < n {
			// The share whose next delivery is due first; a few shares, looked at each time.
			var first *memItem
			for s, h := range m.pending {
				if s.Visitor == visitor && h.Len() > 0 && (first == nil || (*h)[0].before(first)) {
					first = (*h)[0]
				}
			}
			if first == nil || first.at.After(now) {
				break
			}
			m.seq++
			first.lease, first.at = m.seq, now.Add(lease)
			heap.Fix(first.in, first.index)
			d := first.d
			d.lease = first.lease
			out = append(out, d)
		}
	}
	return out, nil
}

// held returns d's item while d's lease holds.
func (m *Memory) held(d Delivery) *memItem {
	it, ok := m.items[d.Key]
	if !ok || it.d.Dead || it.lease == 0 || it.lease != d.lease {
		return nil
	}
	return it
}

func (m *Memory) Done(_ context.Context, d Delivery) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	it := m.held(d)
	if it == nil {
		return false, nil
	}
	m.remove(it)
	return true, nil
}

func (m *Memory) Retry(_ context.Context, d Delivery) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	it := m.held(d)
	if it == nil {
		return false, nil
	}
	it.d.Attempts, it.d.LastError, it.d.Next = d.Attempts, d.LastError, d.Next
	it.at, it.lease = d.Next, 0
	heap.Fix(it.in, it.index)
	return true, nil
}

func (m *Memory) Kill(_ context.Context, d Delivery, now time.Time) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	it := m.held(d)
	if it == nil {
		return false, nil
	}
	it.in.remove(it)
	it.d.Attempts, it.d.LastError, it.d.Next, it.d.Dead = d.Attempts, d.LastError, now, true
	it.at, it.lease = now, 0
	m.dead[kind(it.d.Visitor)].add(it)
	return true, nil
}

func (m *Memory) List(_ context.Context, dead bool, n int) ([]Delivery, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var items []*memItem
	if dead {
		items = append(items, m.dead[0]...)
		items = append(items, m.dead[1]...)
	} else {
		for _, h := range m.pending {
			items = append(items, *h...)
		}
	}
	slices.SortFunc(items, func(a, b *memItem) int { return a.compare(b) })
	out := make([]Delivery, 0, min(n, len(items)))
	for _, it := range items[:min(n, len(items))] {
		out = append(out, it.d)
	}
	return out, nil
}

func (m *Memory) Requeue(_ context.Context, key string, now time.Time) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	it, ok := m.items[key]
	if !ok || !it.d.Dead {
		return false, nil
	}
	it.in.remove(it)
	it.d.Dead, it.d.Next, it.d.Attempts, it.d.Created = false, now, 0, now
	it.at, it.lease = now, 0
	m.heapOf(it.d.Share()).add(it)
	return true, nil
}

func (m *Memory) Drop(_ context.Context, key string) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	it, ok := m.items[key]
	if ok {
		m.remove(it)
	}
	return ok, nil
}

func (m *Memory) Count(context.Context) (pending, dead int, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	dead = m.dead[0].Len() + m.dead[1].Len()
	return len(m.items) - dead, dead, nil
}

// compare orders items by when (due, or died), then key.
func (it *memItem) compare(o *memItem) int {
	if c := it.at.Compare(o.at); c != 0 {
		return c
	}
	return cmp.Compare(it.d.Key, o.d.Key)
}

func (it *memItem) before(o *memItem) bool { return it.compare(o) < 0 }

// memHeap is a min-heap of items by compare, each knowing its place (container/heap).
type memHeap []*memItem

func (h memHeap) Len() int           { return len(h) }
func (h memHeap) Less(i, j int) bool { return h[i].before(h[j]) }
func (h memHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *memHeap) Push(x any) {
	it := x.(*memItem)
	it.index = len(*h)
	*h = append(*h, it)
}
func (h *memHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return it
}

func (h *memHeap) add(it *memItem) {
	it.in = h
	heap.Push(h, it)
}

func (h *memHeap) remove(it *memItem) {
	heap.Remove(h, it.index)
	it.in = nil
}
