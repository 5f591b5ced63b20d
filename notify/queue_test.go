package notify

import (
	"fmt"
	"slices"
	"testing"
)

type item struct {
	s Share
	i int
}

func (it item) String() string {
	kind := "t"
	if it.s.Visitor {
		kind = "v"
	}
	return fmt.Sprintf("%s:%s%d", kind, it.s.Limit, it.i)
}

func newItemQueue(bound int) *Queue[item] {
	return NewQueue(bound, func(it item) Share { return it.s })
}

var (
	orgs  = Share{Limit: "org"}
	keysT = Share{Limit: "key"}
	ipA   = Share{Limit: "ip_a", Visitor: true}
	ipB   = Share{Limit: "ip_b", Visitor: true}
)

// A full queue drops visitors' items first, from the share that holds the most, oldest first;
// a visitor's item never displaces a tenant's, and a tenant's displaces a tenant's only when no
// visitor's is left.
func TestQueueDropsFairly(t *testing.T) {
	q := newItemQueue(6)
	push := func(it item) string {
		d, ok := q.Push(it)
		if !ok {
			return ""
		}
		return d.String()
	}
	for i := range 4 {
		if d := push(item{ipA, i}); d != "" {
			t.Fatalf("dropped %s with room", d)
		}
	}
	push(item{ipB, 0})
	push(item{orgs, 0})
	// Full: ip_a holds 4, ip_b 1, org 1. A tenant's item and ip_b's take room from ip_a,
	// oldest first, until ip_a holds no more than ip_b.
	for _, tc := range []struct {
		in   item
		drop string
	}{
		{item{orgs, 1}, "v:ip_a0"},
		{item{ipB, 1}, "v:ip_a1"},
		{item{ipB, 2}, "v:ip_b0"}, // a tie (2 and 2) goes to the share pushing
		{item{ipA, 4}, "v:ip_a2"},
		{item{keysT, 0}, "v:ip_a3"}, // a tie of two other shares goes to the first by name
		{item{orgs, 2}, "v:ip_b1"},
		{item{keysT, 1}, "v:ip_a4"},
		{item{orgs, 3}, "v:ip_b2"},
		// Only tenants' left: a visitor's item is refused, a tenant's takes from the
		// tenants' share holding the most.
		{item{ipA, 5}, "v:ip_a5"},
		{item{keysT, 2}, "t:org0"},
	} {
		if d := push(tc.in); d != tc.drop {
			t.Fatalf("pushing %s dropped %q, want %q", tc.in, d, tc.drop)
		}
	}
	if q.Len() != 6 {
		t.Fatalf("holds %d", q.Len())
	}
	// Pop: the tenants' first, a share at a time in turn, oldest first.
	got := fmt.Sprint(q.Pop(4))
	if got != "[t:key0 t:org1 t:key1 t:org2]" {
		t.Fatalf("popped %s", got)
	}
	q.PushFront(q.Pop(1))
	if got := fmt.Sprint(q.Pop(10)); got != "[t:key2 t:org3]" || q.Len() != 0 {
		t.Fatalf("popped %s, %d left", got, q.Len())
	}
}

// Pop takes the visitors' shares in turn too, and PushFront puts back what it took, in order.
func TestQueuePopInTurn(t *testing.T) {
	q := newItemQueue(100)
	for i := range 5 {
		q.Push(item{ipA, i})
	}
	q.Push(item{ipB, 0})
	q.Push(item{orgs, 0})
	first := q.Pop(4)
	if fmt.Sprint(first) != "[t:org0 v:ip_a0 v:ip_b0 v:ip_a1]" {
		t.Fatalf("popped %v", first)
	}
	q.PushFront(first)
	if all := q.Pop(100); fmt.Sprint(all) != "[t:org0 v:ip_a0 v:ip_b0 v:ip_a1 v:ip_a2 v:ip_a3 v:ip_a4]" {
		t.Fatalf("after PushFront: %v", all)
	}
}

// Over many pushes the queue stays at its bound and every share's items leave in order.
func TestQueueLongRun(t *testing.T) {
	q := newItemQueue(50)
	last := map[Share]int{}
	for i := range 10_000 {
		s := []Share{ipA, ipA, ipA, ipB, orgs}[i%5]
		q.Push(item{s, i})
		if q.Len() > 50 {
			t.Fatalf("holds %d", q.Len())
		}
		if i%7 == 0 {
			for _, it := range q.Pop(3) {
				if it.i <= last[it.s] && last[it.s] != 0 {
					t.Fatalf("%v out of order", it)
				}
				last[it.s] = it.i
			}
		}
	}
	left := q.Pop(50)
	if !slices.ContainsFunc(left, func(it item) bool { return it.s == orgs }) {
		t.Fatalf("no tenant's item left: %v", left)
	}
}
