package limits

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/docsgate/gateway/internal/redistest"
)

func TestNewThresholds(t *testing.T) {
	th, err := NewThresholds(0.5, 0.8, 1)
	if err != nil || th.Len() != 3 || th.At(1) != 0.8 {
		t.Fatalf("%+v %v", th, err)
	}
	for _, bad := range [][]float64{{0}, {1.1}, {0.8, 0.8}, {0.9, 0.8}, {-1}, {0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9}, {0.0000001}} {
		if _, err := NewThresholds(bad...); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
	r := &Rule{Name: "r", Limit: 10, Window: mustWindow(t, "hour"), Thresholds: th, Exhausted: true}
	if got := marksSpec(r); got != " x10:500000,800000,1000000" {
		t.Fatalf("spec %q", got)
	}
	r.Shadow = true // a shadow limit never refuses: no exhaustion to report
	if got := marksSpec(r); got != " x00:500000,800000,1000000" {
		t.Fatalf("spec %q", got)
	}
	for _, r := range []*Rule{
		{Name: "g", Limit: 10, Window: mustWindow(t, "hour"), Algorithm: GCRA, Thresholds: th},
		{Name: "c", Limit: 10, Window: mustWindow(t, "hour"), Unit: Streams, Thresholds: th},
		{Name: "s", Limit: 10, Window: mustWindow(t, "hour"), Shadow: true, Exhausted: true},
		{Name: "n", Limit: 10, Window: mustWindow(t, "hour")},
	} {
		if marksSpec(r) != "" {
			t.Errorf("%s marks", r.Name)
		}
	}
	r = &Rule{Name: "t", Limit: 10, Window: mustWindow(t, "hour"), Unit: Tokens, Forecast: true}
	if got := marksSpec(r); got != " x01:" {
		t.Fatalf("tokens spec %q", got)
	}
	if th.reached(7, 0) != 0 || th.reached(4, 10) != 0 || th.reached(5, 10) != 1 || th.reached(8, 10) != 2 || th.reached(12, 10) != 3 {
		t.Fatal("reached")
	}
}

// thresholdStores runs f on the in-process store and on Redis.
func thresholdStores(t *testing.T, f func(t *testing.T, s Store)) {
	t.Run("memory", func(t *testing.T) { f(t, NewMemory()) })
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Start(t)
		f(t, newRedisT(t, srv.Client(t), "gw"))
	})
}

func takeCrossed(t *testing.T, s Store, r *Rule, id string) (bool, uint16) {
	t.Helper()
	var d Decision
	if err := s.Take(context.Background(), []Hit{{Rule: r, ID: id}}, &d); err != nil {
		t.Fatal(err)
	}
	return d.Allowed, d.Results[0].Crossed
}

// Each threshold is reported by the decision that reaches it, once per tenant and window,
// against the allowance in force (an override that lowers it mid-window reports what the
// count already passes at the next admission); the first refusal is reported once.
func TestCrossingsReportedOnce(t *testing.T) {
	thresholdStores(t, func(t *testing.T, s Store) {
		th, _ := NewThresholds(0.5, 0.8, 1)
		r := &Rule{Name: "r", Limit: 10, Window: mustWindow(t, "hour"), Thresholds: th, Exhausted: true}
		want := map[int]uint16{5: 1, 8: 2, 10: 4, 11: CrossedExhausted}
		for i := 1; i <= 14; i++ {
			ok, c := takeCrossed(t, s, r, "acme")
			if ok != (i <= 10) || c != want[i] {
				t.Fatalf("take %d: admitted %v, crossed %b; want %b", i, ok, c, want[i])
			}
		}
		// More allowance: nothing already reported is reported again, refusals included.
		q := s.(QuotaStore)
		if _, _, err := q.Grant(context.Background(), r, "acme", 5, Who{Actor: "t"}); err != nil {
			t.Fatal(err)
		}
		for i := 11; i <= 17; i++ {
			if ok, c := takeCrossed(t, s, r, "acme"); ok != (i <= 15) || c != 0 {
				t.Fatalf("after the grant, take %d: admitted %v, crossed %b", i, ok, c)
			}
		}
		// An override lowers the allowance below the count's thresholds: the next admission
		// reports both at once.
		for i := 1; i <= 5; i++ {
			if _, c := takeCrossed(t, s, r, "globex"); c != map[int]uint16{5: 1}[i] {
				t.Fatalf("globex take %d: crossed %b", i, c)
			}
		}
		if _, _, err := q.SetOverride(context.Background(), r, "globex", 7, time.Now().Add(time.Hour), Who{Actor: "t"}); err != nil {
			t.Fatal(err)
		}
		for i, want := range []uint16{2, 4} { // 6 of 7 reaches 0.8, 7 of 7 reaches 1
			if ok, c := takeCrossed(t, s, r, "globex"); !ok || c != want {
				t.Fatalf("globex under the override, take %d: admitted %v, crossed %b", 6+i, ok, c)
			}
		}
		if ok, c := takeCrossed(t, s, r, "globex"); ok || c != CrossedExhausted {
			t.Fatalf("globex refused: admitted %v, crossed %b", ok, c)
		}
		// A reset forgets the window's use: its thresholds are crossed anew.
		if _, err := q.Reset(context.Background(), r, "acme", Who{Actor: "t"}); err != nil {
			t.Fatal(err)
		}
		for i := 1; i <= 8; i++ {
			if _, c := takeCrossed(t, s, r, "acme"); c != map[int]uint16{8: 1}[i] {
				t.Fatalf("after the reset, take %d: crossed %b", i, c)
			}
		}
	})
}

// A new window starts without marks.
func TestCrossingsPerWindow(t *testing.T) {
	thresholdStores(t, func(t *testing.T, s Store) {
		th, _ := NewThresholds(1)
		r := &Rule{Name: "w", Limit: 2, Window: mustWindow(t, "1s"), Thresholds: th, Exhausted: true}
		for round := range 2 {
			// Well inside a second: both takes and the refusal count in one window.
			if ms := time.Now().Nanosecond() / 1e6; ms > 700 {
				time.Sleep(time.Duration(1010-ms) * time.Millisecond)
			}
			var got []uint16
			for range 3 {
				_, c := takeCrossed(t, s, r, "acme")
				got = append(got, c)
			}
			if got[0] != 0 || got[1] != 1 || got[2] != CrossedExhausted {
				t.Fatalf("window %d: %v", round, got)
			}
			time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 20*time.Millisecond)))
		}
	})
}

// Two replicas deciding at once for one tenant report each crossing once, and a request that
// crosses nothing costs one script call as before.
func TestCrossingsConcurrentReplicas(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	replicas := []Store{newRedisT(t, srv.Client(t), "gw"), newRedisT(t, srv.Client(t), "gw")}
	th, _ := NewThresholds(0.8)
	r := &Rule{Name: "org", Limit: 40, Window: mustWindow(t, "hour"), Thresholds: th, Exhausted: true}
	for _, s := range replicas {
		if err := s.(*Redis).Preload(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	before := redistest.ScriptCalls(t, client)
	var mu sync.Mutex
	counts := map[uint16]int{}
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var d Decision
			if err := replicas[i%2].Take(context.Background(), []Hit{{Rule: r, ID: "acme"}}, &d); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			counts[d.Results[0].Crossed]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	if counts[1] != 1 || counts[CrossedExhausted] != 1 || counts[0] != 48 {
		t.Fatalf("crossings: %v", counts)
	}
	if calls := redistest.ScriptCalls(t, client) - before; calls != 50 {
		t.Fatalf("%d script calls for 50 decisions", calls)
	}
}

// takeHit decides one hit of r for id, and returns the decision and the hit with the
// allowance it applied (what a charge of its answer measures crossings against).
func takeHit(t *testing.T, s Store, r *Rule, id string) (Decision, Hit) {
	t.Helper()
	var d Decision
	h := Hit{Rule: r, ID: id}
	if err := s.Take(context.Background(), []Hit{h}, &d); err != nil {
		t.Fatal(err)
	}
	h.Allow = d.Results[0].Limit
	return d, h
}

// chargeStores runs f on the in-process store and on Redis, each reporting the crossings of
// its charges of tokens to the function f reads them from.
func chargeStores(t *testing.T, f func(t *testing.T, s Store, crossed func() []Crossed)) {
	var mu sync.Mutex
	var got []Crossed
	note := func(c Crossed) { mu.Lock(); got = append(got, c); mu.Unlock() }
	read := func() []Crossed { mu.Lock(); defer mu.Unlock(); c := got; got = nil; return c }
	t.Run("memory", func(t *testing.T) { read(); f(t, NewMemory(WithMemoryCrossings(note)), read) })
	t.Run("redis", func(t *testing.T) {
		srv := redistest.Start(t)
		read()
		f(t, newRedisT(t, srv.Client(t), "gw", WithCrossings(note)), read)
	})
}

// A tokens limit's thresholds are crossed by the charges that count the answers' tokens (a
// debit, or a settle of a reserve), against the allowance the admission applied, once per
// tenant and window; its first refusal is reported by the take.
func TestTokensCrossings(t *testing.T) {
	chargeStores(t, func(t *testing.T, s Store, crossed func() []Crossed) {
		ctx := context.Background()
		th, _ := NewThresholds(0.5, 0.8)
		plain := &Rule{Name: "plain", Limit: 100, Window: mustWindow(t, "hour"), Unit: Tokens, Thresholds: th, Exhausted: true}
		held := &Rule{Name: "held", Limit: 100, Window: mustWindow(t, "hour"), Unit: Tokens, Reserve: 10, ReserveTTL: time.Minute, Thresholds: th, Exhausted: true}
		take := func(r *Rule) (Decision, Hit) { t.Helper(); return takeHit(t, s, r, "acme") }
		// Debits: 40 crosses nothing, 25 crosses 0.5, 20 crosses 0.8, 30 nothing again.
		for i, step := range []struct {
			n    int64
			bits uint16
		}{{40, 0}, {25, 1}, {20, 2}, {30, 0}} {
			d, h := take(plain)
			if !d.Allowed || d.Results[0].Crossed != 0 {
				t.Fatalf("plain take %d: %+v", i, d.Results[0])
			}
			if err := s.Debit(ctx, []Hit{h}, step.n); err != nil {
				t.Fatal(err)
			}
			got := crossed()
			if step.bits == 0 && len(got) != 0 || step.bits != 0 && (len(got) != 1 || got[0].Bits != step.bits || got[0].Rule != plain || got[0].ID != "acme" || got[0].Allow != 100) {
				t.Fatalf("debit %d of %d: crossed %+v, want bits %b", i, step.n, got, step.bits)
			}
		}
		// 115 of 100 used: the first refusal is reported once.
		for i, want := range []uint16{CrossedExhausted, 0} {
			if d, _ := take(plain); d.Allowed || d.Results[0].Crossed != want {
				t.Fatalf("refusal %d: %+v", i, d.Results[0])
			}
		}
		// A debit without the admission's allowance reports nothing (Hit.Allow 0).
		if err := s.Debit(ctx, []Hit{{Rule: held, ID: "acme"}}, 60); err != nil {
			t.Fatal(err)
		}
		if got := crossed(); len(got) != 0 {
			t.Fatalf("debit without allowance crossed %+v", got)
		}
		// Settles of holds: 60 used; an answer of 25 takes it past 0.8 (0.5 was passed by a
		// debit that reported nothing, so both are reported now).
		d, h := take(held)
		if !d.Allowed {
			t.Fatalf("held take: %+v", d.Results[0])
		}
		if _, err := s.Settle(ctx, d.Hold, []Hit{h}, 25); err != nil {
			t.Fatal(err)
		}
		got := crossed()
		if len(got) != 1 || got[0].Bits != 3 || got[0].Used != 85 || got[0].WindowStart != d.Results[0].WindowStart {
			t.Fatalf("settle crossed %+v", got)
		}
	})
}

// A forecast is reported once per tenant and window, by the first decision after which the
// tenant runs out before the window ends at its rate so far, and never by a window's first
// requests.
func TestForecastReportedOnce(t *testing.T) {
	thresholdStores(t, func(t *testing.T, s Store) {
		r := &Rule{Name: "f", Limit: 100, Window: mustWindow(t, "20s"), Forecast: true}
		// Well inside a window: past its first twentieth (1 s), before its tenth second.
		for {
			in := time.Now().UnixMilli() % 20000
			if in > 1200 && in < 6000 {
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		var at []int
		for i := 1; i <= 60; i++ {
			if _, c := takeCrossed(t, s, r, "acme"); c != 0 {
				if c != CrossedForecast {
					t.Fatalf("take %d crossed %b", i, c)
				}
				at = append(at, i)
			}
		}
		// 60 in under 10 s of a 20 s window of 100 runs out; the trend needs 5 used.
		if len(at) != 1 || at[0] < 5 {
			t.Fatalf("forecast at takes %v", at)
		}
	})
	if forecasts(5, 100, 0, 20, 500_000) || !forecasts(50, 100, 0, 20, 2_000_000) || forecasts(50, 100, 0, 20, 11_000_000) || forecasts(100, 100, 0, 20, 2_000_000) {
		t.Fatal("forecasts")
	}
}

// What a crossing reports is the counter as Usage reads it: a tokens limit's count past its
// allowance (not the allowance), a requests count after an override lowered the allowance,
// and, for a tokens limit with a reserve, the live holds apart from the count (never added
// to it), from a refusal and from a settle's charge alike.
func TestCrossingsSayTheCounter(t *testing.T) {
	chargeStores(t, func(t *testing.T, s Store, crossed func() []Crossed) {
		ctx := context.Background()
		th, _ := NewThresholds(0.5, 1)
		usage := func(r *Rule) Usage {
			t.Helper()
			u, err := s.Usage(ctx, r, "acme")
			if err != nil {
				t.Fatal(err)
			}
			return u
		}
		take := func(r *Rule) (Decision, Hit) { t.Helper(); return takeHit(t, s, r, "acme") }
		// Tokens without a reserve: 131 of 100 crosses both thresholds; the refusal after it
		// says 131 used.
		plain := &Rule{Name: "plain", Limit: 100, Window: mustWindow(t, "hour"), Unit: Tokens, Thresholds: th, Exhausted: true}
		_, h := take(plain)
		if err := s.Debit(ctx, []Hit{h}, 131); err != nil {
			t.Fatal(err)
		}
		if got := crossed(); len(got) != 1 || got[0].Bits != 3 || got[0].Used != 131 || got[0].Held != 0 {
			t.Fatalf("debit crossed %+v", got)
		}
		if d, _ := take(plain); d.Allowed || d.Results[0].Crossed != CrossedExhausted || d.Results[0].Used != 131 || d.Results[0].Held != 0 || usage(plain).Used != 131 {
			t.Fatalf("refusal past the limit: %+v, usage %+v", d.Results[0], usage(plain))
		}
		// Tokens with a reserve: 30 used, 7 answers hold 70, the 8th is refused: 30 used and
		// 70 held, as Usage says. An answer of 25 then crosses 0.5 with 6 others holding 60.
		held := &Rule{Name: "held", Limit: 100, Window: mustWindow(t, "hour"), Unit: Tokens, Reserve: 10, ReserveTTL: time.Minute, Thresholds: th, Exhausted: true}
		if err := s.Debit(ctx, []Hit{{Rule: held, ID: "acme"}}, 30); err != nil {
			t.Fatal(err)
		}
		var first Decision
		var firstHit Hit
		for i := range 7 {
			d, h := take(held)
			if !d.Allowed {
				t.Fatalf("answer %d refused: %+v", i, d.Results[0])
			}
			if i == 0 {
				first, firstHit = d, h
			}
		}
		d, _ := take(held)
		if u := usage(held); d.Allowed || d.Results[0].Crossed != CrossedExhausted || d.Results[0].Used != 30 || d.Results[0].Held != 70 || u.Used != 30 || u.Reserved != 70 {
			t.Fatalf("refusal for the holds: %+v, usage %+v; want 30 used and 70 held", d.Results[0], u)
		}
		if _, err := s.Settle(ctx, first.Hold, []Hit{firstHit}, 25); err != nil {
			t.Fatal(err)
		}
		if got := crossed(); len(got) != 1 || got[0].Bits != 1 || got[0].Used != 55 || got[0].Held != 60 {
			t.Fatalf("settle crossed %+v; want 0.5 with 55 used and 60 held", got)
		}
		// Requests: an override lowers the allowance below the count; the refusal says the
		// count, as Usage does.
		req := &Rule{Name: "req", Limit: 10, Window: mustWindow(t, "hour"), Thresholds: th, Exhausted: true}
		for i := range 6 {
			if d, _ := take(req); !d.Allowed || i == 4 && (d.Results[0].Crossed != 1 || d.Results[0].Used != 5) {
				t.Fatalf("request %d: %+v", i, d.Results[0])
			}
		}
		if _, _, err := s.(QuotaStore).SetOverride(ctx, req, "acme", 4, time.Now().Add(time.Hour), Who{Actor: "t"}); err != nil {
			t.Fatal(err)
		}
		if d, _ := take(req); d.Allowed || d.Results[0].Crossed != CrossedExhausted || d.Results[0].Used != 6 || usage(req).Used != 6 {
			t.Fatalf("refusal under the override: %+v, usage %+v", d.Results[0], usage(req))
		}
	})
}
