package limits

import (
	"context"
	"slices"
	"testing"
	"time"
)

// FuzzHoldsInvariant drives the in-process store with random sequences of admissions,
// settlements (refunds, charges up to the reserve, releases), refreshes carrying what their
// answer passed, clock moves that expire holds, and reads, beside a model of what they must
// do. Whatever the sequence: the store admits exactly when the model does (a tokens limit with
// a reserve and a streams limit, all or nothing), reads back the model's used and reserved,
// names the holds a settle or refresh finds expired, and used + live holds never pass the limit
// nor the slots in use the streams limit, unless a hold was charged or taken again after it
// expired (then the answer is charged all the same, and the store must say so). A hold that
// expires unsettled is charged, once, what it carried by the next admission or refresh
// (reaping), and its settle then charges only the rest.
func FuzzHoldsInvariant(f *testing.F) {
	f.Add(uint16(1000), uint8(100), uint8(5), []byte{0, 0, 0, 1, 5, 50, 0, 2, 30, 0, 1, 0, 200, 4})
	f.Add(uint16(300), uint8(100), uint8(2), []byte{0, 0, 0, 0, 2, 59, 2, 59, 1, 0, 99, 0, 0, 1, 1, 0x80})
	f.Add(uint16(50), uint8(7), uint8(1), []byte{0, 1, 0, 7, 0, 1, 0, 3, 0, 0})
	// Admit two, refresh one carrying 40, let both expire, admit (reaps 40), refresh the
	// reaped one (taken again), settle it with 70 (30 more), let the other's ttl pass twice.
	f.Add(uint16(1000), uint8(100), uint8(5), []byte{0, 0, 3, 0, 40, 2, 59, 2, 59, 0, 3, 0, 60, 1, 0, 70, 2, 59, 2, 59, 2, 59, 2, 59, 0})
	f.Fuzz(func(t *testing.T, limit uint16, reserve, slots uint8, ops []byte) {
		L := int64(limit%2000) + 1
		R := int64(reserve)%L + 1
		S := int64(slots%10) + 1
		const ttl = 10 * time.Second
		now := time.Date(2026, 1, 1, 0, 0, 1, 0, time.UTC)
		m := NewMemory(WithClock(func() time.Time { return now }))
		tok := &Rule{Name: "tok", Limit: L, Window: mustWindow(t, "day"), Unit: Tokens, Reserve: R, ReserveTTL: ttl}
		st := &Rule{Name: "st", Limit: S, Unit: Streams, ReserveTTL: ttl}
		hits := []Hit{{Rule: tok, ID: "acme"}, {Rule: st, ID: "acme"}}
		ctx := context.Background()

		// hold is the model of one admitted answer not yet settled: its tokens hold (amount R,
		// or 0 once reaped; gone once dropped after it expired) and its slot.
		type hold struct {
			id              string
			tokExp, stExp   time.Time
			amount          int64
			gone            bool
			passed, charged int64
		}
		var out []*hold
		var used int64
		late, over := false, false // used + holds past the limit / slots past the cap allowed
		liveTok := func() (n int64) {
			for _, h := range out {
				if !h.gone && h.amount > 0 && h.tokExp.After(now) {
					n += h.amount
				}
			}
			return n
		}
		liveSt := func() (n int64) {
			for _, h := range out {
				if h.stExp.After(now) {
					n++
				}
			}
			return n
		}
		// reap is what any admission or refresh does first: expired holds that carry tokens not
		// charged yet are charged them and stay as holds of 0 for another ttl.
		reap := func() {
			for _, h := range out {
				if !h.gone && h.amount > 0 && !h.tokExp.After(now) && h.passed > h.charged {
					used += h.passed - h.charged
					late = true
					h.charged, h.amount, h.tokExp = h.passed, 0, now.Add(ttl)
				}
			}
		}
		next := func(i *int) byte {
			if *i >= len(ops) {
				return 0
			}
			b := ops[*i]
			*i++
			return b
		}
		for i := 0; i < len(ops) && i < 600; {
			switch next(&i) % 5 {
			case 0: // admit
				reap()
				for _, h := range out { // the decision drops the expired holds
					if !h.gone && !h.tokExp.After(now) {
						*h = hold{id: h.id, stExp: h.stExp, gone: true}
					}
				}
				want := L-used-liveTok() >= R && liveSt() < S
				var d Decision
				if err := m.Take(ctx, hits, &d); err != nil {
					t.Fatal(err)
				}
				if d.Allowed != want {
					t.Fatalf("take: allowed %v, model %v (used %d, held %d, slots %d, limit %d, reserve %d, slots %d)", d.Allowed, want, used, liveTok(), liveSt(), L, R, S)
				}
				if d.Allowed {
					if len(d.Held(hits, nil)) != 2 {
						t.Fatalf("admitted without both holds: %+v", d)
					}
					out = append(out, &hold{id: d.Hold, tokExp: now.Add(ttl), stExp: now.Add(ttl), amount: R})
				} else if d.Hold != "" {
					t.Fatalf("a denial named a hold: %+v", d)
				}
			case 1: // settle one outstanding hold
				if len(out) == 0 {
					continue
				}
				k := int(next(&i)) % len(out)
				b := next(&i)
				n := int64(b&0x7f) % (R + 1) // never more than the reserve
				if b&0x80 != 0 {
					n = -1 // the upstream failed: released
				}
				h := out[k]
				out = slices.Delete(out, k, k+1)
				expired, err := m.Settle(ctx, h.id, hits, n)
				if err != nil {
					t.Fatal(err)
				}
				live := !h.gone && h.amount > 0 && h.tokExp.After(now)
				if wantExp := !live && n >= 0; (len(expired) == 1) != wantExp || len(expired) > 1 {
					t.Fatalf("settle of a hold live=%v with %d: reported %v", live, n, expired)
				}
				if n > h.charged { // what reaping charged is not charged again
					used += n - h.charged
					late = late || !live
				}
			case 2: // time passes
				now = now.Add(time.Duration(next(&i)%60) * 100 * time.Millisecond)
			case 3: // refresh one outstanding hold, carrying what its answer passed
				if len(out) == 0 {
					continue
				}
				h := out[int(next(&i))%len(out)]
				p := int64(next(&i)) % (R + 1)
				reap()
				var want []string
				if h.gone || h.amount == 0 || !h.tokExp.After(now) {
					want = append(want, "tok")
					late = true
				}
				if !h.stExp.After(now) {
					want = append(want, "st")
					over = true
				}
				lapsed, err := m.Refresh(ctx, h.id, hits, func(*Rule) int64 { return p })
				if err != nil || !slices.Equal(lapsed, want) {
					t.Fatalf("refresh: lapsed %v %v, model %v", lapsed, err, want)
				}
				if h.gone || h.amount == 0 {
					h.gone, h.amount = false, R // taken again, without a check
				}
				h.tokExp, h.stExp = now.Add(ttl), now.Add(ttl)
				if p > 0 || h.charged > 0 {
					h.passed = max(p, h.charged)
				}
			}
			u, err := m.Usage(ctx, tok, "acme")
			if err != nil {
				t.Fatal(err)
			}
			if u.Used != used || u.Reserved != liveTok() || u.Remaining != max(L-used-liveTok(), 0) {
				t.Fatalf("usage %+v, model used %d reserved %d", u, used, liveTok())
			}
			if !late && u.Used+u.Reserved > L {
				t.Fatalf("invariant broken: used %d + held %d > limit %d", u.Used, u.Reserved, L)
			}
			s, err := m.Usage(ctx, st, "acme")
			if err != nil {
				t.Fatal(err)
			}
			// A read-back shows streams past the cap as the cap (capUsed).
			if s.Used != min(liveSt(), S) || (!over && liveSt() > S) {
				t.Fatalf("slots in use %d, model %d, limit %d", s.Used, liveSt(), S)
			}
		}
	})
}
