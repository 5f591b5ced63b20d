package notify

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
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
	Attempts int       `json:"attempts,omitempty"`
	// Next is when it is due (pending), or when it became a dead letter.
	Next      time.Time `json:"next"`
	LastError string    `json:"last_error,omitempty"`
	Dead      bool      `json:"dead,omitempty"`
	// Once: the outbox takes the delivery only if it took none of its key in the last
	// SeenFor (Event.Once).
	Once bool `json:"once,omitempty"`
	// Limit and Visitor are the event's Share: what a full outbox drops first, and which
	// deliveries a claim hands out first.
	Limit   string `json:"limit,omitempty"`
	Visitor bool   `json:"visitor,omitempty"`

	// lease is the claim this copy was handed under; Done, Retry and Kill act only while it
	// still holds, so a replica whose lease ran out cannot undo another's work.
	lease int64
}

// Share is whose the delivery is (Delivery.Limit and Visitor).
func (d *Delivery) Share() Share { return Share{Limit: d.Limit, Visitor: d.Visitor} }

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
//
// An outbox holds at most its bound of deliveries, pending and dead. At the bound a new
// delivery makes room by the rule of Share, on Redis and in process alike:
//
//   - a visitor's delivery goes first: the visitors' oldest dead letter, else the pending
//     delivery due first of the visitors' share (limit) holding the most;
//   - when none is held, a visitor's delivery is refused (dropped itself), and a tenant's
//     makes room likewise among the tenants' deliveries: the oldest dead letter, else from
//     the tenants' share holding the most.
//
// So a tenant's delivery is never dropped to make room for a visitor's, visitors cannot fill
// the outbox against a tenant, and one flooded limit cannot push another's deliveries out.
type Outbox interface {
	// Add stores deliveries before any attempt; a key already held is left as it is, and so is
	// a Once delivery whose key was added in the last SeenFor (delivered since, or dropped).
	// When the outbox is full, room is made as the type's comment says; what was dropped (to
	// make room, or refused) is returned.
	Add(ctx context.Context, ds []Delivery) (dropped []Delivery, err error)
	// Claim leases up to n pending deliveries due at now, for lease: the tenants' first, then
	// the visitors', each by when due.
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
