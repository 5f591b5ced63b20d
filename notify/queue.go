package notify

import (
	"cmp"
	"iter"
	"slices"
)

// Share is whose an event (and its deliveries) is, for what a full bound drops: the tenants'
// of a limit (by project, key or org; Limit "" for an event of no limit, as key.revoked), or
// its visitors' (a limit by ip, one counter per client address).
//
// Every bound on events, in the replica and in the outbox, drops by the same rule: a visitor's
// first, from the share that holds the most of them; a tenant's only to make room for another
// tenant's, likewise from the share holding the most; never a tenant's for a visitor's.
type Share struct {
	Limit   string
	Visitor bool
}

// Queue is a bounded first-in, first-out queue of events by Share, waiting to be written into
// the outbox; it is not safe for concurrent use. At its bound, Push makes room by the rule of
// Share, dropping the oldest of the share it picks: one flooded limit cannot push another's
// events out, nor visitors' a tenant's. Push and Pop cost O(1) per item and O(shares) to pick
// the share (a few: one per limit that sends events, of each kind).
type Queue[T any] struct {
	max    int
	n      int
	share  func(T) Share
	shares map[Share]*fifo[T]
}

// fifo is one share's items, oldest first, from head.
type fifo[T any] struct {
	items []T
	head  int
}

func (f *fifo[T]) len() int { return len(f.items) - f.head }

func (f *fifo[T]) pop() T {
	var zero T
	v := f.items[f.head]
	f.items[f.head] = zero
	f.head++
	if f.head == len(f.items) {
		f.items, f.head = f.items[:0], 0
	} else if f.head > 64 && f.head*2 > len(f.items) {
		f.items = append(f.items[:0], f.items[f.head:]...)
		f.head = 0
	}
	return v
}

// NewQueue returns a Queue holding at most bound items (at least 1); share says whose an item
// is.
func NewQueue[T any](bound int, share func(T) Share) *Queue[T] {
	return &Queue[T]{max: max(bound, 1), share: share, shares: map[Share]*fifo[T]{}}
}

// Len is how many items the queue holds.
func (q *Queue[T]) Len() int { return q.n }

// Push adds v at the back of its share. At the bound it first drops the oldest item of the
// share that Share's rule picks, or refuses v: what it dropped (v itself when refused) is
// returned.
func (q *Queue[T]) Push(v T) (dropped T, ok bool) {
	s := q.share(v)
	if q.n >= q.max {
		victim, room := Largest(true, s, q.sizes)
		if !room && !s.Visitor {
			victim, room = Largest(false, s, q.sizes)
		}
		if !room {
			return v, true // a visitor's, and only tenants' are held
		}
		dropped, ok = q.shares[victim].pop(), true
		q.n--
	}
	f := q.shares[s]
	if f == nil {
		f = &fifo[T]{}
		q.shares[s] = f
	}
	f.items = append(f.items, v)
	q.n++
	return dropped, ok
}

// sizes yields how many items each share holds.
func (q *Queue[T]) sizes(yield func(Share, int) bool) {
	for s, f := range q.shares {
		if !yield(s, f.len()) {
			return
		}
	}
}

// Pop takes up to n items: the tenants' first, then the visitors', one of each share in turn
// (shares in a fixed order), each share's oldest first.
func (q *Queue[T]) Pop(n int) []T {
	out := make([]T, 0, min(n, q.n))
	var shares []Share
	for _, visitor := range []bool{false, true} {
		shares = shares[:0]
		for s, f := range q.shares {
			if s.Visitor == visitor && f.len() > 0 {
				shares = append(shares, s)
			}
		}
		slices.SortFunc(shares, func(a, b Share) int { return cmp.Compare(a.Limit, b.Limit) })
		for took := true; took && len(out) < n; {
			took = false
			for _, s := range shares {
				if f := q.shares[s]; f.len() > 0 && len(out) < n {
					out = append(out, f.pop())
					q.n--
					took = true
				}
			}
		}
	}
	return out
}

// PushFront puts items taken by Pop back at the front of their shares, in their order: an
// attempt to write them failed. Call it before any Push since the Pop, so that they fit.
func (q *Queue[T]) PushFront(vs []T) {
	for i := len(vs) - 1; i >= 0; i-- {
		s := q.share(vs[i])
		f := q.shares[s]
		if f == nil {
			f = &fifo[T]{}
			q.shares[s] = f
		}
		if f.head == 0 {
			f.items = append(f.items, vs[i]) // grow, then shift by one
			copy(f.items[1:], f.items)
		} else {
			f.head--
		}
		f.items[f.head] = vs[i]
		q.n++
	}
}

// Largest is the share of visitors (visitor) or of tenants holding the most items, given how
// many each share holds; false when no share of that kind holds any. Ties go to s, the share
// of the item that needs room, then to the first limit by name.
func Largest(visitor bool, s Share, sizes iter.Seq2[Share, int]) (Share, bool) {
	var best Share
	most := 0
	for c, n := range sizes {
		if c.Visitor != visitor || n == 0 {
			continue
		}
		if n > most || n == most && (c == s || best != s && c.Limit < best.Limit) {
			best, most = c, n
		}
	}
	return best, most > 0
}
