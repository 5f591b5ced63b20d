package limits

import (
	"context"
	"crypto/rand"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/docsgate/gateway/internal/redistest"
)

// FuzzStoresAgree drives the in-process store and Redis with the same random sequence of
// admissions (and the thresholds and exhaustion they report crossed), settlements (charges up to the reserve, releases), refunds, run-time grants,
// overrides and resets, reloads that change a limit's window, unit or algorithm (an answer in
// flight ends under the rule in force where it counts in the same counter, else under the one
// it was admitted under, as the gateway's do) and window ends. After
// every step both stores read back the same use, holds and history; used + live holds never
// pass a tokens limit; and each counter's history plus its current window holds exactly the
// units admitted into it, less refunds and what resets forgot: nothing lost, nothing counted
// twice, nothing read in another unit.
//
// Both stores read this machine's clock (Redis' TIME and time.Now), so steps keep away from
// the ends of seconds, where the two could see different windows; "window end" sleeps past
// one. A sequence lasts well under the 30 windows the limits keep.
func FuzzStoresAgree(f *testing.F) {
	// Seeds that reach each change at once: a window made longer with units counted (carried
	// over), a tokens limit's window changed with answers in flight, the unit changed both ways.
	f.Add([]byte{0, 0, 5, 16, 0, 0, 6, 0, 5, 0, 0})
	f.Add([]byte{0, 0, 0, 5, 22, 2, 3, 0, 0, 6, 2, 1, 4, 0, 5, 2, 7, 0, 0})
	f.Add([]byte{0, 0, 2, 0, 3, 5, 3, 0, 2, 1, 4, 0, 5, 3, 0, 3, 0, 6, 0})
	f.Add([]byte{0, 0, 1, 2, 5, 0, 0, 6, 0, 2, 3, 4, 1, 5, 2, 0, 0, 6, 2, 0, 1, 3})
	f.Add([]byte{1, 0, 0, 5, 1, 0, 0, 5, 3, 1, 6, 0, 2, 7, 4, 0, 5, 0, 0, 0, 6, 4, 3, 2, 1})
	f.Add([]byte{0, 1, 5, 2, 0, 0, 6, 5, 5, 0, 1, 4, 2, 6, 3, 0, 0, 2, 9, 5, 4, 0, 6, 1, 1})
	srv := redistest.Start(f)
	client := srv.Client(f)
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 120 {
			ops = ops[:120]
		}
		var crossed [2][]Crossed // what each store's charges of tokens crossed
		m := NewMemory(WithMemoryCrossings(func(c Crossed) { crossed[0] = append(crossed[0], c) }))
		rs := newRedisT(t, client, "agree"+rand.Text()[:8], WithCrossings(func(c Crossed) { crossed[1] = append(crossed[1], c) }))
		stores := []Store{m, rs}
		a := newAgreement(t, stores)
		a.crossed = &crossed
		i := 0
		next := func() byte {
			if i >= len(ops) {
				return 0
			}
			i++
			return ops[i-1]
		}
		ends := 0
		for i < len(ops) {
			a.awayFromEdge()
			switch op := next() % 8; op {
			case 0, 1:
				a.take()
			case 2:
				a.settle(int(next()), int64(next()))
			case 3:
				a.refund(int(next()))
			case 4:
				a.quota(next(), int64(next()%7))
			case 5:
				a.reload(next())
			case 6:
				if ends < 12 {
					ends++
					time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 30*time.Millisecond)))
				}
			case 7:
				a.settle(int(next()), -1)
			}
			a.awayFromEdge()
			a.check(fmt.Sprintf("after step %d", i))
		}
	})
}

// agreement is the state of one FuzzStoresAgree sequence: the rules in force, the answers in
// flight per store, and the model of what each counter holds.
type agreement struct {
	t      *testing.T
	stores []Store
	ctx    context.Context
	// r counts requests or tokens, in fixed windows or GCRA; tok counts tokens with a reserve.
	r, tok *Rule
	// per store: answers in flight and admitted units a refund may give back
	held  [][]flight
	taken [][]Taken
	// counted is what each fixed counter must hold over its kept windows: by unit, then name.
	counted map[Unit]map[string]int64
	seen    map[Unit]map[string]*Rule // a rule that reads each counter (its latest window)
	allow   map[string]int64          // the largest allowance seen per limit
	crossed *[2][]Crossed             // what each store's charges reported, until compared
}

// flight is an answer in flight: its holds, and the tokens limits without a reserve that its
// tokens are debited to when it ends (as the gateway does).
type flight struct {
	hold  string
	held  []Hit
	debit []Hit
}

const agreeReserve = 5

func newAgreement(t *testing.T, stores []Store) *agreement {
	a := &agreement{t: t, stores: stores, ctx: context.Background(),
		held: make([][]flight, len(stores)), taken: make([][]Taken, len(stores)),
		counted: map[Unit]map[string]int64{Requests: {}, Tokens: {}},
		seen:    map[Unit]map[string]*Rule{Requests: {}, Tokens: {}},
		allow:   map[string]int64{},
	}
	th, err := NewThresholds(0.25, 0.5, 1)
	if err != nil {
		t.Fatal(err)
	}
	a.r = &Rule{Name: "r", Limit: 12, Window: mustWindow(t, "2s"), History: 30, Thresholds: th, Exhausted: true}
	thTok, err := NewThresholds(0.5, 0.9)
	if err != nil {
		t.Fatal(err)
	}
	a.tok = &Rule{Name: "tok", Limit: 40, Window: mustWindow(t, "1s"), Unit: Tokens, Reserve: agreeReserve, ReserveTTL: time.Hour, History: 30,
		Thresholds: thTok, Exhausted: true}
	a.note()
	return a
}

// note records the rules in force as the readers of their counters.
func (a *agreement) note() {
	for _, r := range []*Rule{a.r, a.tok} {
		if r.Algorithm == Fixed {
			a.seen[r.Unit][r.Name] = r
		}
	}
}

// awayFromEdge waits while the clock is near the end of a second (every window here is whole
// seconds), where the stores could read different windows.
func (a *agreement) awayFromEdge() {
	if ms := time.Now().Nanosecond() / 1e6; ms > 750 {
		time.Sleep(time.Duration(1030-ms) * time.Millisecond)
	}
}

func (a *agreement) hits() []Hit { return []Hit{{Rule: a.r, ID: "acme"}, {Rule: a.tok, ID: "acme"}} }

func (a *agreement) take() {
	hits := a.hits()
	var got []bool
	var crossed []uint16
	for k, s := range a.stores {
		var d Decision
		if err := s.Take(a.ctx, hits, &d); err != nil {
			a.t.Fatal(err)
		}
		got = append(got, d.Allowed)
		crossed = append(crossed, d.Results[0].Crossed, d.Results[1].Crossed)
		if !d.Allowed {
			continue
		}
		// A tokens limit's charges measure thresholds against the admission's allowance.
		hits := slices.Clone(hits)
		for i := range hits {
			if hits[i].Rule.Unit == Tokens {
				hits[i].Allow = d.Results[i].Limit
			}
		}
		f := flight{hold: d.Hold, held: d.Held(hits, nil)}
		for _, h := range hits {
			if h.Rule.Unit == Tokens && !holds(h.Rule) {
				f.debit = append(f.debit, h)
			}
		}
		a.held[k] = append(a.held[k], f)
		a.taken[k] = append(a.taken[k], d.Taken(hits[:1], nil)...)
	}
	if got[0] != got[1] {
		a.t.Fatalf("take: memory admitted %v, redis %v", got[0], got[1])
	}
	if crossed[0] != crossed[2] || crossed[1] != crossed[3] {
		a.t.Fatalf("take: memory crossed %b, redis %b", crossed[:2], crossed[2:])
	}
	if got[0] && a.r.Algorithm == Fixed && a.r.Unit == Requests {
		a.counted[Requests][a.r.Name]++ // tokens are counted when the answer ends
	}
}

func (a *agreement) settle(k int, n int64) {
	if len(a.held[0]) == 0 {
		return
	}
	k %= len(a.held[0])
	n = min(n, agreeReserve)
	for s, st := range a.stores {
		f := a.held[s][k]
		a.held[s] = append(a.held[s][:k], a.held[s][k+1:]...)
		if _, err := st.Settle(a.ctx, f.hold, a.inForce(f.held), n); err != nil {
			a.t.Fatal(err)
		}
		if err := st.Debit(a.ctx, a.inForce(f.debit), n); err != nil {
			a.t.Fatal(err)
		}
		if s == 0 && n > 0 {
			// Charged to every tokens limit the answer was admitted under, in its unit.
			for _, h := range append(f.held, f.debit...) {
				if h.Rule.Unit == Tokens {
					a.counted[Tokens][h.Rule.Name] += n
				}
			}
		}
	}
	// Both stores' charges crossed the same thresholds, at the same counts.
	key := func(cs []Crossed) string {
		var b strings.Builder
		for _, c := range cs {
			fmt.Fprintf(&b, "%s:%b@%d/%d ", c.Rule.Name, c.Bits, c.Used, c.Allow)
		}
		return b.String()
	}
	if m, r := key(a.crossed[0]), key(a.crossed[1]); m != r {
		a.t.Fatalf("settle: memory crossed %s, redis %s", m, r)
	}
	a.crossed[0], a.crossed[1] = nil, nil
}

// inForce maps hits to the rules in force that count in the same counter (same name, unit
// and algorithm), as the gateway does when an answer ends after a reload.
func (a *agreement) inForce(hits []Hit) []Hit {
	out := slices.Clone(hits)
	for i, h := range out {
		for _, r := range []*Rule{a.r, a.tok} {
			if r.Name == h.Rule.Name && r.Unit == h.Rule.Unit && r.Algorithm == h.Rule.Algorithm {
				out[i].Rule = r
			}
		}
	}
	return out
}

func (a *agreement) refund(k int) {
	if len(a.taken[0]) == 0 {
		return
	}
	k %= len(a.taken[0])
	tk := a.taken[0][k]
	before := a.usedIn(tk.Rule)
	for s, st := range a.stores {
		t := a.taken[s][k]
		a.taken[s] = append(a.taken[s][:k], a.taken[s][k+1:]...)
		if err := st.(interface {
			Refund(context.Context, []Taken) error
		}).Refund(a.ctx, []Taken{t}); err != nil {
			a.t.Fatal(err)
		}
	}
	if tk.Rule.Unit == Requests && tk.Rule.Algorithm == Fixed {
		// One unit back where it was counted, or none where that window is no longer kept
		// (or already empty): the model follows the store, which must agree with Redis.
		back := before - a.usedIn(tk.Rule)
		if back != 0 && back != 1 {
			a.t.Fatalf("a refund gave back %d units", back)
		}
		a.counted[Requests][tk.Rule.Name] -= back
	}
}

// usedIn is the in-process store's sum over the kept windows of r's unit's counter.
func (a *agreement) usedIn(r *Rule) int64 {
	reader := a.seen[r.Unit][r.Name]
	if reader == nil {
		return 0
	}
	ws, err := a.stores[0].(HistoryStore).History(a.ctx, reader, "acme")
	if err != nil {
		a.t.Fatal(err)
	}
	var n int64
	for _, w := range ws {
		n += w.Used
	}
	return n
}

func (a *agreement) quota(b byte, amount int64) {
	r := a.r
	if b&1 == 1 {
		r = a.tok
	}
	who := Who{Actor: "fuzz"}
	forgot := int64(0)
	until := time.Now().Add(time.Hour).Truncate(time.Microsecond) // one override in both stores
	for k, s := range a.stores {
		q := s.(QuotaStore)
		var err error
		switch b >> 1 % 3 {
		case 0:
			_, _, err = q.Grant(a.ctx, r, "acme", amount+1, who)
		case 1:
			_, _, err = q.SetOverride(a.ctx, r, "acme", r.Limit+amount, until, who)
		case 2:
			if r != a.r {
				return // holds of answers in flight are not the reset's to forget
			}
			if k == 0 && r.Algorithm == Fixed {
				u, uerr := s.Usage(a.ctx, r, "acme")
				if uerr != nil {
					a.t.Fatal(uerr)
				}
				forgot = u.Used
			}
			_, err = q.Reset(a.ctx, r, "acme", who)
		}
		if err != nil {
			a.t.Fatalf("quota %d on %s: %v", b>>1%3, r.Name, err)
		}
	}
	if forgot > 0 {
		a.counted[r.Unit][r.Name] -= forgot
	}
}

// reload changes one thing of one limit, as a reload or a plan change would; answers in
// flight keep their rules.
func (a *agreement) reload(b byte) {
	wins := []string{"1s", "2s", "4s"}
	switch b % 5 {
	case 0, 1:
		c := *a.r
		c.Window = mustWindow(a.t, wins[int(b>>3)%3])
		a.r = &c
	case 2:
		c := *a.tok
		c.Window = mustWindow(a.t, wins[int(b>>3)%3])
		a.tok = &c
	case 3:
		c := *a.r
		if c.Unit == Requests {
			c.Unit, c.Algorithm = Tokens, Fixed
		} else {
			c.Unit = Requests
		}
		a.r = &c
	case 4:
		c := *a.r
		if c.Unit == Requests {
			c.Algorithm = 1 - c.Algorithm // Fixed <-> GCRA
		}
		a.r = &c
	}
	a.note()
}

// check compares the stores and the model.
func (a *agreement) check(when string) {
	for _, r := range []*Rule{a.r, a.tok} {
		var us []Usage
		for _, s := range a.stores {
			u, err := s.Usage(a.ctx, r, "acme")
			if err != nil {
				a.t.Fatal(err)
			}
			us = append(us, u)
		}
		m, rd := us[0], us[1]
		if m.Used != rd.Used || m.Remaining != rd.Remaining || m.Reserved != rd.Reserved || m.Limit != rd.Limit || m.Granted != rd.Granted {
			a.t.Fatalf("%s: %s (%s %s): memory %+v, redis %+v", when, r.Name, r.Unit, r.Window, m, rd)
		}
		a.allow[r.Name] = max(a.allow[r.Name], m.Limit)
		if r.Unit == Tokens && r.Reserve > 0 && m.Reserved > 0 && m.Used+m.Reserved > a.allow[r.Name] {
			// Settles charge at most the reserve they held, so live holds keep it within the
			// largest allowance granted (a grant ends with its window).
			a.t.Fatalf("%s: %s used %d + held %d > allowance %d", when, r.Name, m.Used, m.Reserved, a.allow[r.Name])
		}
	}
	for unit, byName := range a.seen {
		for name, r := range byName {
			var hs [][]WindowUse
			for _, s := range a.stores {
				h, err := s.(HistoryStore).History(a.ctx, r, "acme")
				if err != nil {
					a.t.Fatal(err)
				}
				hs = append(hs, h)
			}
			if !reflect.DeepEqual(hs[0], hs[1]) { // the override's terms compared, not their addresses
				a.t.Fatalf("%s: history of %s in %s: memory %v (override %+v), redis %v (override %+v)", when, name, unit, hs[0], hs[0][0].Override, hs[1], hs[1][0].Override)
			}
			var sum int64
			for _, w := range hs[0] {
				sum += w.Used
			}
			if want := a.counted[unit][name]; sum != want {
				a.t.Fatalf("%s: %s in %s: history and current hold %d, %d were counted (%v)", when, name, unit, sum, want, hs[0])
			}
		}
	}
}
