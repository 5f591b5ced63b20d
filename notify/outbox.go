package notify

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"sort"
	"strings"
	"sync"
	"time"
)

// Delivery is one event bound for one endpoint, as the outbox keeps it from its detection to
// its answer. Body is the exact JSON sent on every attempt (signed anew each time: the
// timestamp changes, the webhook-id, the event's id, does not).
type Delivery struct {
	// Key is the delivery's name in the outbox: the event's id, "/", the endpoint's name.
	Key      string          `json:"key"`
	ID       string          `json:"id"`
	Endpoint string          `json:"endpoint"`
	Type     string          `json:"type"`
	Body     json.RawMessage `json:"body"`
	// Created is when it entered the outbox (or was requeued): it is retried for
	// retry_for from then.
	Created  time.Time `json:"created"`
	Attempts int       `json:"attempts"`
	// Next is when it is due (pending), or when it became a dead letter.
	Next      time.Time `json:"next"`
	LastError string    `json:"last_error,omitempty"`
	Dead      bool      `json:"dead,omitempty"`
	// Once: the outbox takes the delivery only if it took none of its key in the last
	// SeenFor (Event.Once).
	Once bool `json:"once,omitempty"`

	// lease is the claim this copy was handed under; Done, Retry and Kill act only while it
	// still holds, so a replica whose lease ran out cannot undo another's work.
	lease int64
}

// DeliveryKey names a delivery in the outbox.
func DeliveryKey(eventID, endpoint string) string { return eventID + "/" + endpoint }

// NewID returns a random event id: "evt_" and 32 hex digits (never a dot, which the signed
// content uses as its separator).
func NewID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on supported platforms
	}
	return "evt_" + hex.EncodeToString(b[:])
}

// StableID returns an id derived from parts: the same event detected twice (a retried
// script call, two replicas) gets one id, which the outbox stores once.
func StableID(parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return "evt_" + hex.EncodeToString(h.Sum(nil)[:16])
}

// Outbox holds deliveries until they are answered, dropped or dead. Claims are leased: a
// claimed delivery is handed to no other claimer until its lease runs out, so a claimer that
// dies leaves it to the next one.
type Outbox interface {
	// Add stores deliveries before any attempt; a key already held is left as it is, and so is
	// a Once delivery whose key was added in the last SeenFor (delivered since, or dropped).
	// When the outbox is full the oldest deliveries make room, and are returned.
	Add(ctx context.Context, ds []Delivery) (dropped []Delivery, err error)
	// Claim leases up to n pending deliveries due at now, for lease.
	Claim(ctx context.Context, now time.Time, n int, lease time.Duration) ([]Delivery, error)
	// Done removes a delivered delivery; false if its lease no longer holds.
	Done(ctx context.Context, d Delivery) (bool, error)
	// Retry records a failed attempt (d.Attempts, d.LastError) and makes d due at d.Next;
	// false if its lease no longer holds.
	Retry(ctx context.Context, d Delivery) (bool, error)
	// Kill makes d a dead letter (d.Attempts, d.LastError; Next is set to now); false if its
	// lease no longer holds.
	Kill(ctx context.Context, d Delivery, now time.Time) (bool, error)
	// List returns up to n deliveries: dead letters (dead) by when they died, or pending ones
	// by when they are due (a leased one when its lease runs out).
	List(ctx context.Context, dead bool, n int) ([]Delivery, error)
	// Requeue makes a dead letter pending again, due at now; false if key is no dead letter.
	Requeue(ctx context.Context, key string, now time.Time) (bool, error)
	// Drop removes a delivery, pending or dead; false if there is none of that key.
	Drop(ctx context.Context, key string) (bool, error)
	// Count returns how many deliveries are pending and how many are dead.
	Count(ctx context.Context) (pending, dead int, err error)
}

// SeenFor is how long an outbox remembers the keys of Once deliveries.
const SeenFor = 48 * time.Hour

// ErrInvalid is returned for a delivery without a key, id, endpoint or body.
var ErrInvalid = errors.New("notify: a delivery needs a key, an id, an endpoint and a body")

func validDelivery(d Delivery) bool {
	return d.Key != "" && d.ID != "" && d.Endpoint != "" && len(d.Body) > 0 && !strings.Contains(d.ID, ".")
}

// Memory is an Outbox in process, for a gateway without Redis. What it holds is lost with
// the process: an event detected but not yet delivered when the gateway stops is never sent.
type Memory struct {
	mu    sync.Mutex
	max   int
	seq   int64
	items map[string]*memItem
	seen  map[string]time.Time // Once keys by when added
}

type memItem struct {
	d     Delivery
	due   time.Time // pending: when due, or when the lease runs out
	lease int64     // 0: not leased
}

// NewMemory returns an in-process outbox holding at most max deliveries (pending and dead;
// at least 1).
func NewMemory(max int) *Memory {
	if max < 1 {
		max = 1
	}
	return &Memory{max: max, items: map[string]*memItem{}, seen: map[string]time.Time{}}
}

func (m *Memory) Add(_ context.Context, ds []Delivery) ([]Delivery, error) {
	for _, d := range ds {
		if !validDelivery(d) {
			return nil, ErrInvalid
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var dropped []Delivery
	for k, at := range m.seen {
		if time.Since(at) > SeenFor {
			delete(m.seen, k)
		}
	}
	for _, d := range ds {
		if _, ok := m.items[d.Key]; ok {
			continue
		}
		if d.Once {
			if _, ok := m.seen[d.Key]; ok {
				continue
			}
			m.seen[d.Key] = time.Now()
		}
		for len(m.items) >= m.max {
			oldest := m.oldestLocked()
			dropped = append(dropped, oldest.d)
			delete(m.items, oldest.d.Key)
		}
		d.Dead, d.lease = false, 0
		m.items[d.Key] = &memItem{d: d, due: d.Next}
	}
	return dropped, nil
}

func (m *Memory) oldestLocked() *memItem {
	var o *memItem
	for _, it := range m.items {
		if o == nil || it.d.Created.Before(o.d.Created) || it.d.Created.Equal(o.d.Created) && it.d.Key < o.d.Key {
			o = it
		}
	}
	return o
}

func (m *Memory) Claim(_ context.Context, now time.Time, n int, lease time.Duration) ([]Delivery, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var due []*memItem
	for _, it := range m.items {
		if !it.d.Dead && !it.due.After(now) {
			due = append(due, it)
		}
	}
	sort.Slice(due, func(i, j int) bool {
		if !due[i].due.Equal(due[j].due) {
			return due[i].due.Before(due[j].due)
		}
		return due[i].d.Key < due[j].d.Key
	})
	if len(due) > n {
		due = due[:n]
	}
	out := make([]Delivery, 0, len(due))
	for _, it := range due {
		m.seq++
		it.lease, it.due = m.seq, now.Add(lease)
		d := it.d
		d.lease = it.lease
		out = append(out, d)
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
	if m.held(d) == nil {
		return false, nil
	}
	delete(m.items, d.Key)
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
	it.due, it.lease = d.Next, 0
	return true, nil
}

func (m *Memory) Kill(_ context.Context, d Delivery, now time.Time) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	it := m.held(d)
	if it == nil {
		return false, nil
	}
	it.d.Attempts, it.d.LastError, it.d.Next, it.d.Dead = d.Attempts, d.LastError, now, true
	it.lease = 0
	return true, nil
}

func (m *Memory) List(_ context.Context, dead bool, n int) ([]Delivery, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	var items []*memItem
	for _, it := range m.items {
		if it.d.Dead == dead {
			items = append(items, it)
		}
	}
	at := func(it *memItem) time.Time {
		if dead {
			return it.d.Next
		}
		return it.due
	}
	sort.Slice(items, func(i, j int) bool {
		if a, b := at(items[i]), at(items[j]); !a.Equal(b) {
			return a.Before(b)
		}
		return items[i].d.Key < items[j].d.Key
	})
	out := make([]Delivery, 0, len(items))
	for _, it := range items {
		out = append(out, it.d)
	}
	if len(out) > n {
		out = out[:n]
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
	it.d.Dead, it.d.Next, it.d.Attempts, it.d.Created = false, now, 0, now
	it.due, it.lease = now, 0
	return true, nil
}

func (m *Memory) Drop(_ context.Context, key string) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.items[key]
	delete(m.items, key)
	return ok, nil
}

func (m *Memory) Count(context.Context) (pending, dead int, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, it := range m.items {
		if it.d.Dead {
			dead++
		} else {
			pending++
		}
	}
	return pending, dead, nil
}
