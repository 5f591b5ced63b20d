package main

import (
	"context"
	"time"

	"go.uber.org/zap"

	"github.com/docsgate/gateway/auth"
	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/notify"
)

// keyEvents announces what happens to registered keys, read from the registry every
// keysEvery by every replica:
//   - key.revoked when a key's revocation comes (now, or at the time scheduled: a rotation's
//     overlap ends so), within revokedWithin of it;
//   - key.rotated when a key is rotated into a successor, within revokedWithin of it;
//   - key.expiring once per key and end, when the key's end (expiry or scheduled revocation)
//     comes within auth.expiry_notice. The notice spans days, longer than the outbox
//     remembers an event (notify.SeenFor): the marks (Redis, shared) take it once.
//
// Each is sent once across the replicas: Event.Once with an id derived from what it reports.
type keyEvents struct {
	nt *notifier
	// announced are the events published, by id, until their time is revokedWithin past (a
	// key.expiring's: until its end), so that a replica asks the outbox and the marks once.
	announced map[string]time.Time
}

// wanted reports whether some endpoint takes a key event.
func (ke *keyEvents) wanted() bool {
	w := ke.nt.wants
	return w.Wants(config.EventKeyRevoked, "") || w.Wants(config.EventKeyRotated, "") || w.Wants(config.EventKeyExpiring, "")
}

// read lists the keys and announces what came; it returns when to read them next: in
// keysEvery, or as the first notice to come starts (never sooner than a second from now).
func (ke *keyEvents) read(ctx context.Context, keys auth.Registry) time.Time {
	now := time.Now()
	next := now.Add(keysEvery)
	rctx, cancel := context.WithTimeout(ctx, overridesEvery)
	defer cancel()
	list, err := keys.List(rctx)
	if err != nil {
		ke.nt.log.Warn("keys not read for their events", zap.Error(err))
		return next
	}
	for id, at := range ke.announced {
		if now.Sub(at) > revokedWithin {
			delete(ke.announced, id)
		}
	}
	notice := time.Duration(ke.nt.notice.Load())
	for _, e := range list {
		ke.revoked(ctx, &e, now)
		ke.rotated(ctx, &e, now)
		if notice <= 0 {
			continue
		}
		if ends := e.Ends(); ends != nil && ends.After(now) {
			if starts := ends.Add(-notice); starts.After(now) {
				next = minTime(next, starts.Add(50*time.Millisecond))
			} else {
				ke.expiring(ctx, &e, *ends, now)
			}
		}
	}
	return maxTime(next, now.Add(time.Second))
}

func (ke *keyEvents) revoked(ctx context.Context, e *auth.Entry, now time.Time) {
	if e.Revoked == nil || e.Revoked.After(now) || now.Sub(*e.Revoked) > revokedWithin ||
		!ke.nt.wants.Wants(config.EventKeyRevoked, "") {
		return
	}
	id := notify.StableID(config.EventKeyRevoked, e.Digest, e.Revoked.UTC().Format(time.RFC3339Nano))
	data := keyData(e)
	data["revoked_at"] = e.Revoked.UTC().Format(time.RFC3339)
	ke.announce(ctx, notify.Event{Type: config.EventKeyRevoked, ID: id, Time: *e.Revoked, Once: true, Data: data})
}

func (ke *keyEvents) rotated(ctx context.Context, e *auth.Entry, now time.Time) {
	if e.Replaces == "" || now.Sub(e.Created) > revokedWithin || !ke.nt.wants.Wants(config.EventKeyRotated, "") {
		return
	}
	id := notify.StableID(config.EventKeyRotated, e.Digest)
	data := keyData(e)
	data["replaces"] = e.Replaces
	data["rotated_at"] = e.Created.UTC().Format(time.RFC3339)
	ke.announce(ctx, notify.Event{Type: config.EventKeyRotated, ID: id, Time: e.Created, Once: true, Data: data})
}

// expiring announces e's end, once per key and end: the marks (shared by the replicas, kept
// until the end) take it first.
func (ke *keyEvents) expiring(ctx context.Context, e *auth.Entry, ends, now time.Time) {
	if !ke.nt.wants.Wants(config.EventKeyExpiring, "") {
		return
	}
	at := ends.UTC().Format(time.RFC3339Nano)
	id := notify.StableID(config.EventKeyExpiring, e.Digest, at)
	if _, ok := ke.announced[id]; ok {
		return
	}
	first, err := ke.nt.marks.Mark(ctx, id, ends.Add(revokedWithin))
	if err != nil {
		ke.nt.log.Warn("key.expiring not announced yet: its mark could not be written", zap.Error(err))
		return // the next read tries again
	}
	ke.announced[id] = ends // kept until revokedWithin past the end
	if !first {
		return // another replica (or this one, before a restart) announced it
	}
	data := keyData(e)
	data["ends_at"] = ends.UTC().Format(time.RFC3339)
	data["reason"] = "expires"
	if e.Revoked != nil && !e.Revoked.After(ends) {
		data["reason"] = "revoked" // a revocation scheduled, as a rotation's overlap ends
	}
	if e.RotatedTo != "" {
		data["rotated_to"] = e.RotatedTo
	}
	ke.nt.submit(ctx, notify.Event{Type: config.EventKeyExpiring, ID: id, Time: now, Once: true, Data: data})
}

// announce submits ev unless this replica did already.
func (ke *keyEvents) announce(ctx context.Context, ev notify.Event) {
	if _, ok := ke.announced[ev.ID]; ok {
		return
	}
	ke.announced[ev.ID] = ev.Time
	ke.nt.submit(ctx, ev)
}

// keyData is what every key event tells of the key: never the key, its digest.
func keyData(e *auth.Entry) map[string]any {
	data := map[string]any{"key": e.Digest, "tenant": e.Tenant(), "by": "key", "kind": e.Kind, "org": e.Org}
	if e.Label != "" {
		data["label"] = e.Label
	}
	return data
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
