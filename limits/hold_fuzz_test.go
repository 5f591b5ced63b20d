package limits

import (
	"context"
	"testing"
	"time"
)

// FuzzHoldsInvariant drives the in-process store with random sequences of admissions,
// settlements (refunds, charges up to the reserve, releases), clock moves that expire holds,
// and reads, beside a model of what they must do. Whatever the sequence: the store admits
// exactly when the model does (a tokens limit with a reserve and a streams limit, all or
// nothing), reads back the model's used and reserved, and used + live holds never pass the
// limit nor the slots in use the streams limit, unless a hold was settled after it expired
// (then the answer is charged all the same, and the store must say so).
func FuzzHoldsInvariant(f *testing.F) {
	f.Add(uint16(1000), uint8(100), uint8(5), []byte{0, 0, 0, 1, 5, 50, 0, 2, 30, 0, 1, 0, 200, 3})
	f.Add(uint16(300), uint8(100), uint8(2), []byte{0, 0, 0, 0, 2, 59, 2, 59, 1, 0, 99, 0, 0, 1, 1, 0x80})
	f.Add(uint16(50), uint8(7), uint8(1), []byte{0, 1, 0, 7, 0, 1, 0, 3, 0, 0})
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

		type hold struct {
			id      string
			expires time.Time
		}
		var out []hold // admitted, not yet settled (live or expired)
		var used int64
		late := false
		live := func() (n int64) {
			for _, h := range out {
				if h.expires.After(now) {
					n++
				}
			}
			return n
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
			switch next(&i) % 4 {
			case 0: // admit
				want := L-used-R*live() >= R && live() < S
				var d Decision
				if err := m.Take(ctx, hits, &d); err != nil {
					t.Fatal(err)
				}
				if d.Allowed != want {
					t.Fatalf("take: allowed %v, model %v (used %d, live %d, limit %d, reserve %d, slots %d)", d.Allowed, want, used, live(), L, R, S)
				}
				if d.Allowed {
					if len(d.Held(hits, nil)) != 2 {
						t.Fatalf("admitted without both holds: %+v", d)
					}
					out = append(out, hold{d.Hold, now.Add(ttl)})
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
				out = append(out[:k], out[k+1:]...)
				expired, err := m.Settle(ctx, h.id, hits, n)
				if err != nil {
					t.Fatal(err)
				}
				wasExpired := !h.expires.After(now)
				if wantExp := wasExpired && n >= 0; (len(expired) == 1) != wantExp || len(expired) > 1 {
					t.Fatalf("settle of a hold expired=%v with %d: reported %v", wasExpired, n, expired)
				}
				if n > 0 {
					used += n
					late = late || wasExpired
				}
			case 2: // time passes
				now = now.Add(time.Duration(next(&i)%60) * 100 * time.Millisecond)
			}
			u, err := m.Usage(ctx, tok, "acme")
			if err != nil {
				t.Fatal(err)
			}
			if u.Used != used || u.Reserved != R*live() || u.Remaining != max(L-used-R*live(), 0) {
				t.Fatalf("usage %+v, model used %d reserved %d", u, used, R*live())
			}
			if !late && u.Used+u.Reserved > L {
				t.Fatalf("invariant broken: used %d + held %d > limit %d", u.Used, u.Reserved, L)
			}
			s, err := m.Usage(ctx, st, "acme")
			if err != nil {
				t.Fatal(err)
			}
			if s.Used != live() || s.Used > S {
				t.Fatalf("slots in use %d, model %d, limit %d", s.Used, live(), S)
			}
		}
	})
}
