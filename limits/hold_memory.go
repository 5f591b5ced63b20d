package limits

import (
	"context"
	"time"
)

// memHold is one hold or slot of the in-process store (see hold.go).
type memHold struct {
	amount  int64
	expires int64 // Unix µs
	// passed is what the hold's answer had passed at its last refresh, charged what reaping
	// charged of it (the Redis hold's p:).
	passed, charged int64
}

// liveHolds sums the holds of e live at nowUS and drops the expired ones (the caller holds
// the shard lock, and has reaped e's holds for a tokens limit: reapHolds; e may be nil).
func (e *memEntry) liveHolds(nowUS int64) (sum, n int64) {
	if e == nil {
		return 0, 0
	}
	for id, h := range e.holds {
		if h.expires <= nowUS {
			delete(e.holds, id)
			continue
		}
		sum += h.amount
		n++
	}
	return sum, n
}

// reapHolds charges to h's counter, in the current window, what its expired holds' answers
// had passed and was not charged yet, and leaves each such hold as a hold of 0 for another
// ReserveTTL (reapLua); the caller holds the shard lock.
func (m *Memory) reapHolds(h *memHit, now memTime) {
	e := h.e
	if e == nil {
		return
	}
	r := &h.cr.snap
	var owed int64
	for id, hd := range e.holds {
		if hd.expires <= now.us && hd.amount > 0 && hd.passed > hd.charged {
			owed += hd.passed - hd.charged
			exp := now.us + reserveTTL(r).Microseconds()
			e.holds[id] = memHold{expires: exp, passed: hd.passed, charged: hd.passed}
			e.expires = max(e.expires, exp)
		}
	}
	if owed > 0 {
		ws, we := r.Window.boundsUnix(now.sec)
		e.roll(r, ws, we)
		e.n += owed
	}
}

// held sums the holds of e live at nowUS, leaving the expired ones (the caller holds the
// shard lock; e may be nil).
func (e *memEntry) held(nowUS int64) int64 {
	var sum int64
	if e != nil {
		for _, h := range e.holds {
			if h.expires > nowUS {
				sum += h.amount
			}
		}
	}
	return sum
}

// addHold records hold hid of amount for h, until its rule's ReserveTTL from now; a tokens
// limit's counter moves to the current window first (the caller holds the shard lock).
func (m *Memory) addHold(h *memHit, hid string, amount int64, now memTime) {
	e := m.entry(h)
	if h.cr.snap.Unit == Tokens {
		e.roll(&h.cr.snap, h.ws, h.we) // an ended window is kept for history first
	}
	if e.holds == nil {
		e.holds = map[string]memHold{}
	}
	exp := now.us + reserveTTL(&h.cr.snap).Microseconds()
	e.holds[hid] = memHold{amount: amount, expires: exp}
	e.expires = max(e.expires, exp)
}

// checkHolds is check for the limits with holds: a streams limit has room while fewer slots
// than its allowance are taken; a tokens limit with a reserve while at least the reserve
// remains net of the live holds (h.cnt is already its window's count).
func (m *Memory) checkHolds(h *memHit, now memTime) bool {
	if h.cr.snap.Unit == Tokens && h.e != nil {
		m.reapHolds(h, now) // whatever this decision, as takeLua
		h.cnt, h.same = h.e.current(h.cr.snap.Window, h.ws)
	}
	sum, n := h.e.liveHolds(now.us)
	if h.cr.snap.Unit == Streams {
		h.terms(h.cr.snap.Limit, now)
		h.cnt = n
		h.ok = n < h.allow
		return h.ok
	}
	h.held = sum
	h.ok = h.allow-h.cnt-sum >= h.cr.snap.Reserve
	return h.ok
}

// settleHolds fills the result of a limit with holds and takes the hold when the decision
// admitted and the limit had room (the caller holds the lock).
func (m *Memory) settleHolds(h *memHit, r *Result, charge bool, hid string, now memTime) {
	if h.cr.snap.Unit == Streams {
		r.Remaining = max(h.allow-h.cnt, 0)
		if charge {
			m.addHold(h, hid, 1, now)
			r.Remaining = max(r.Remaining-1, 0)
		}
		if !h.ok {
			r.RetryAfter = time.Second // slots come back as answers end
		}
		return
	}
	r.Reset = time.Duration(h.we*1e6-now.us) * time.Microsecond
	r.WindowStart = h.ws
	r.Remaining = max(h.allow-h.cnt-h.held, 0)
	if charge {
		m.addHold(h, hid, h.cr.snap.Reserve, now)
		r.Remaining = max(r.Remaining-h.cr.snap.Reserve, 0)
	}
	if !h.ok {
		r.RetryAfter = r.Reset
		if h.cnt+h.cr.snap.Reserve <= h.allow {
			r.RetryAfter = time.Second // held tokens come back as answers end
		}
		h.exhaust(r)
	}
}

// Settle implements Store.
func (m *Memory) Settle(ctx context.Context, hold string, hits []Hit, n int64) ([]string, error) {
	now := m.clock()
	var expired []string
	var crossed []Crossed
	err := m.eachHeld(ctx, "settle", hold, hits, func(h *memHit) {
		cr := h.cr
		live, charged := false, int64(0)
		if h.e != nil {
			if hd, ok := h.e.holds[hold]; ok {
				live, charged = hd.expires > now.us && hd.amount > 0, hd.charged
				delete(h.e.holds, hold)
			}
		}
		if cr.snap.Unit == Tokens && n >= 0 {
			if !live {
				expired = append(expired, cr.snap.Name)
			}
			if n > charged { // reaping charged the rest already
				crossed = m.charge(h, n-charged, now, crossed)
			}
		}
	})
	report(m.onCrossed, crossed)
	return expired, err
}
