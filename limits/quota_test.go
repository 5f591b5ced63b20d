package limits

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/docsgate/gateway/internal/redistest"
)

// TestQuotas runs the run-time quota suite against the memory store, a standalone
// redis-server and a 3-master Redis Cluster: two store instances stand for two replicas.
func TestQuotas(t *testing.T) {
	t.Parallel() // servers of its own, and no latency bound
	for _, b := range backends(t, true) {
		t.Run(b.name, func(t *testing.T) {
			t.Run("Grant", func(t *testing.T) { testGrant(t, b) })
			t.Run("GrantStreams", func(t *testing.T) { testGrantStreams(t, b) })
			t.Run("Override", func(t *testing.T) { testOverride(t, b) })
			t.Run("OverrideZero", func(t *testing.T) { testOverrideZero(t, b) })
			t.Run("Reset", func(t *testing.T) { testReset(t, b) })
			t.Run("GCRA", func(t *testing.T) { testQuotaGCRA(t, b) })
			t.Run("AllOrNothing", func(t *testing.T) { testQuotaAllOrNothing(t, b) })
			t.Run("ReadBack", func(t *testing.T) { testQuotaReadBack(t, b) })
			t.Run("Refund", func(t *testing.T) { testQuotaRefund(t, b) })
			t.Run("ByUnit", func(t *testing.T) { testQuotaByUnit(t, b) })
		})
	}
}

var who = Who{Actor: "ops", Reason: "support ticket 42"}

// quotaStores returns two store instances on one state, as two replicas see it, and the
// first one's quota actions.
func quotaStores(t *testing.T, b backend) (Store, Store, QuotaStore) {
	s := b.stores(t, 2)
	return s[0], s[1], s[0].(QuotaStore)
}

// takeN takes one hit n times and counts the admissions; last is the last decision.
func takeN(t *testing.T, s Store, n int, hits ...Hit) (admitted int, last Decision) {
	t.Helper()
	for range n {
		last = Decision{}
		if err := s.Take(context.Background(), hits, &last); err != nil {
			t.Fatal(err)
		}
		if last.Allowed {
			admitted++
		}
	}
	return admitted, last
}

func testGrant(t *testing.T, b backend) {
	a, other, q := quotaStores(t, b)
	r := rule(t, "grants", 3, "hour", Fixed)
	hit := Hit{Rule: r, ID: "acme"}
	if n, _ := takeN(t, a, 4, hit); n != 3 {
		t.Fatalf("before the grant: %d admitted, want 3", n)
	}
	// Let the other replica read that no limit has quotas: the grant must reach it by the
	// next read.
	time.Sleep(2 * quotaPoll)
	g, e, err := q.Grant(context.Background(), r, "acme", 2, who)
	if err != nil {
		t.Fatal(err)
	}
	_, we := r.Window.Bounds(time.Now())
	if g.Granted != 2 || !g.WindowEnd.Equal(we) {
		t.Fatalf("grant: %+v, want 2 granted until %v", g, we)
	}
	if e.Action != ActionGrant || e.Amount != 2 || e.Before != (QuotaState{3, 3, 0}) || e.After != (QuotaState{5, 3, 2}) || e.Actor != "ops" || e.Reason != who.Reason {
		t.Fatalf("audit entry %+v", e)
	}
	// The other replica admits the granted units within a second (quotaPoll; the bound adds
	// this machine's scheduling margin), and no more.
	start := time.Now()
	n := 0
	for n == 0 {
		if bound := time.Second + margin(); time.Since(start) > bound {
			t.Fatalf("the other replica did not apply the grant within %v", bound)
		}
		n, _ = takeN(t, other, 1, hit)
	}
	t.Logf("the other replica applied the grant after %v", time.Since(start))
	n, last := takeN(t, a, 2, hit)
	if n != 1 || last.Results[0].Limit != 5 {
		t.Fatalf("after granting 2: %d more admitted (limit %d), want 1 of 5", n, last.Results[0].Limit)
	}
	// Grants add up.
	if g, _, err = q.Grant(context.Background(), r, "acme", 1, who); err != nil || g.Granted != 3 {
		t.Fatalf("second grant: %+v %v", g, err)
	}
	if n, _ := takeN(t, other, 2, hit); n != 1 {
		t.Fatalf("after granting 1 more: %d admitted, want 1", n)
	}
	// Another tenant of the same limit is untouched.
	if n, _ := takeN(t, a, 4, Hit{Rule: r, ID: "other"}); n != 3 {
		t.Fatalf("another tenant: %d admitted, want 3", n)
	}
	if _, _, err := q.Grant(context.Background(), r, "acme", MaxLimit, who); !isInvalid(err, "amount") {
		t.Fatalf("a grant past 2^53-1: %v, want an invalid amount", err)
	}
	if _, _, err := q.Grant(context.Background(), r, "acme", 0, who); !isInvalid(err, "amount") {
		t.Fatalf("a grant of 0: %v, want an invalid amount", err)
	}
}

// A streams limit has no window for a grant to last until: a grant is refused naming the
// limit, leaves no audit entry and changes nothing; the override it points to raises the cap.
func testGrantStreams(t *testing.T, b backend) {
	ctx := context.Background()
	a, _, q := quotaStores(t, b)
	st := streamsRule("grant_streams", 1, 0)
	hit := Hit{Rule: st, ID: "acme"}
	if n, _ := takeN(t, a, 2, hit); n != 1 {
		t.Fatalf("before: %d admitted, want 1", n)
	}
	_, _, err := q.Grant(ctx, st, "acme", 5, who)
	var ie *InvalidError
	if !errors.As(err, &ie) || ie.Field != "limit" || !strings.Contains(ie.Reason, "override") {
		t.Fatalf("a grant on a streams limit: %v, want an invalid limit pointing to an override", err)
	}
	if entries, err := q.Audit(ctx, 10); err != nil || len(entries) != 0 {
		t.Fatalf("a refused grant left audit entries: %+v %v", entries, err)
	}
	if n, _ := takeN(t, a, 1, hit); n != 0 {
		t.Fatal("a refused grant opened a slot")
	}
	if _, _, err := q.SetOverride(ctx, st, "acme", 3, time.Now().Add(time.Hour), who); err != nil {
		t.Fatal(err)
	}
	if n, _ := takeN(t, a, 3, hit); n != 2 {
		t.Fatalf("under an override of 3 with 1 slot taken: %d admitted, want 2", n)
	}
}

func isInvalid(err error, field string) bool {
	var ie *InvalidError
	return errors.As(err, &ie) && ie.Field == field
}

func testOverride(t *testing.T, b backend) {
	a, _, q := quotaStores(t, b)
	r := rule(t, "overrides", 10, "hour", Fixed)
	hit := Hit{Rule: r, ID: "acme"}
	if n, _ := takeN(t, a, 1, hit); n != 1 {
		t.Fatal("first request refused")
	}
	expires := time.Now().Add(1500 * time.Millisecond)
	o, e, err := q.SetOverride(context.Background(), r, "acme", 3, expires, who)
	if err != nil {
		t.Fatal(err)
	}
	if o.Value != 3 || o.Limit != "overrides" || o.ID != "acme" || o.Actor != "ops" || o.Expires.UnixMicro() != expires.UnixMicro() || time.Since(o.Created) > 5*time.Second {
		t.Fatalf("override %+v", o)
	}
	if e.Before != (QuotaState{10, 1, 0}) || e.After != (QuotaState{3, 1, 0}) || e.Override == nil || e.Override.Value != 3 {
		t.Fatalf("audit entry %+v", e)
	}
	left := time.Until(expires) // at most what is left at the decisions
	n, last := takeN(t, a, 3, hit)
	if n != 2 {
		t.Fatalf("under an override of 3 with 1 used: %d admitted, want 2", n)
	}
	res := last.Results[0]
	if res.Allowed || res.Limit != 3 || res.RetryAfter > left || res.RetryAfter <= 0 {
		t.Fatalf("denial under the override: %+v, want retry within the %v left", res, time.Until(expires))
	}
	list, err := q.Overrides(context.Background())
	if err != nil || len(list) != 1 || list[0] != o {
		t.Fatalf("overrides: %+v %v, want [%+v]", list, err, o)
	}
	// It lapses by itself: the limit applies again (3 used of 10).
	time.Sleep(time.Until(expires) + 50*time.Millisecond)
	if n, last := takeN(t, a, 8, hit); n != 7 || last.Results[0].Limit != 10 {
		t.Fatalf("after the override lapsed: %d admitted, want 7", n)
	}
	if list, err := q.Overrides(context.Background()); err != nil || len(list) != 0 {
		t.Fatalf("overrides after the lapse: %+v %v", list, err)
	}
	if _, err := q.EndOverride(context.Background(), r, "acme", who); !errors.Is(err, ErrNoOverride) {
		t.Fatalf("ending a lapsed override: %v, want ErrNoOverride", err)
	}
	// Ended early.
	if _, _, err := q.SetOverride(context.Background(), r, "acme", 20, time.Now().Add(time.Hour), who); err != nil {
		t.Fatal(err)
	}
	if n, _ := takeN(t, a, 1, hit); n != 1 {
		t.Fatal("under an override of 20 with 10 used: refused")
	}
	e, err = q.EndOverride(context.Background(), r, "acme", who)
	if err != nil || e.Before != (QuotaState{20, 11, 0}) || e.After != (QuotaState{10, 10, 0}) || e.Action != ActionOverrideEnd || e.Override == nil || e.Override.Value != 20 {
		t.Fatalf("end: %+v %v", e, err)
	}
	if n, _ := takeN(t, a, 1, hit); n != 0 {
		t.Fatal("after the override ended: admitted past the limit")
	}
	if _, _, err := q.SetOverride(context.Background(), r, "acme", 5, time.Now().Add(-time.Second), who); !isInvalid(err, "expires") {
		t.Fatalf("an override ending in the past: %v", err)
	}
	if _, _, err := q.SetOverride(context.Background(), r, "acme", MaxLimit+1, time.Now().Add(time.Hour), who); !isInvalid(err, "limit") {
		t.Fatalf("an override past 2^53-1: %v", err)
	}
}

// An override of 0 refuses every request, grants or not, and says to retry when it ends.
func testOverrideZero(t *testing.T, b backend) {
	a, _, q := quotaStores(t, b)
	r := rule(t, "zero", 100, "hour", Fixed)
	hit := Hit{Rule: r, ID: "abuser"}
	if _, _, err := q.Grant(context.Background(), r, "abuser", 50, who); err != nil {
		t.Fatal(err)
	}
	expires := time.Now().Add(time.Hour + 30*time.Minute) // past the window's end
	if _, _, err := q.SetOverride(context.Background(), r, "abuser", 0, expires, who); err != nil {
		t.Fatal(err)
	}
	left := time.Until(expires) // at most what is left at the decision
	n, last := takeN(t, a, 3, hit)
	res := last.Results[0]
	if n != 0 || res.Limit != 0 || res.Remaining != 0 {
		t.Fatalf("override 0: %d admitted, last %+v", n, res)
	}
	if res.RetryAfter > left || res.RetryAfter < left-5*time.Second {
		t.Fatalf("override 0: retry after %v, want the %v until it ends", res.RetryAfter, left)
	}
	u, err := a.Usage(context.Background(), r, "abuser")
	if err != nil || u.Limit != 0 || u.Granted != 50 || u.Override == nil || u.Override.Value != 0 {
		t.Fatalf("usage under override 0: %+v %v", u, err)
	}
}

func testReset(t *testing.T, b backend) {
	a, _, q := quotaStores(t, b)
	r := rule(t, "resets", 3, "hour", Fixed)
	hit := Hit{Rule: r, ID: "locked"}
	takeN(t, a, 5, hit)
	e, err := q.Reset(context.Background(), r, "locked", who)
	if err != nil || e.Before != (QuotaState{3, 3, 0}) || e.After != (QuotaState{3, 0, 0}) || e.Action != ActionReset {
		t.Fatalf("reset: %+v %v", e, err)
	}
	if n, _ := takeN(t, a, 4, hit); n != 3 {
		t.Fatalf("after the reset: %d admitted, want 3", n)
	}
}

// GCRA: a grant raises what the bucket holds for the window, an override its rate and size,
// a reset fills it.
func testQuotaGCRA(t *testing.T, b backend) {
	a, _, q := quotaStores(t, b)
	r := rule(t, "smooth", 5, "hour", GCRA)
	hit := Hit{Rule: r, ID: "acme"}
	if n, _ := takeN(t, a, 6, hit); n != 5 {
		t.Fatalf("burst: %d, want 5", n)
	}
	if _, _, err := q.Grant(context.Background(), r, "acme", 2, who); err != nil {
		t.Fatal(err)
	}
	if n, last := takeN(t, a, 3, hit); n != 2 || last.Results[0].Limit != 7 {
		t.Fatalf("after granting 2: %d admitted, want 2 of 7", n)
	}
	e, err := q.Reset(context.Background(), r, "acme", who)
	if err != nil || e.Before.Used != 7 || e.After.Used != 0 {
		t.Fatalf("reset: %+v %v", e, err)
	}
	if _, _, err := q.SetOverride(context.Background(), r, "acme", 1, time.Now().Add(time.Hour), who); err != nil {
		t.Fatal(err)
	}
	// An override of 1 an hour, plus the 2 granted: a bucket of 3.
	if n, last := takeN(t, a, 4, hit); n != 3 || last.Results[0].RetryAfter <= 0 {
		t.Fatalf("override 1 + 2 granted: %d admitted (%+v), want 3", n, last.Results[0])
	}
}

// A tenant blocked on one limit is charged on none of the request's others.
func testQuotaAllOrNothing(t *testing.T, b backend) {
	a, _, q := quotaStores(t, b)
	org := rule(t, "per_org", 10, "hour", Fixed)
	ip := rule(t, "per_ip", 10, "hour", GCRA)
	ids := []string{"org1", "ip1"}
	if b.cluster {
		ids = idsOnDistinctNodes(2)
	}
	hits := []Hit{{Rule: org, ID: ids[0]}, {Rule: ip, ID: ids[1]}}
	if _, _, err := q.SetOverride(context.Background(), ip, ids[1], 0, time.Now().Add(time.Minute), who); err != nil {
		t.Fatal(err)
	}
	if n, last := takeN(t, a, 3, hits...); n != 0 || !last.Results[0].Allowed || last.Results[1].Allowed {
		t.Fatalf("blocked on one limit: %d admitted, %+v", n, last.Results)
	}
	for _, h := range hits {
		if u, err := a.Usage(context.Background(), h.Rule, h.ID); err != nil || u.Used != 0 {
			t.Fatalf("%s after denials: %+v %v, want nothing used", h.Rule.Name, u, err)
		}
	}
}

func testQuotaReadBack(t *testing.T, b backend) {
	a, _, q := quotaStores(t, b)
	r := rule(t, "readback", 10, "hour", Fixed)
	takeN(t, a, 4, Hit{Rule: r, ID: "t1"})
	if _, _, err := q.Grant(context.Background(), r, "t1", 5, who); err != nil {
		t.Fatal(err)
	}
	exp := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	if _, _, err := q.SetOverride(context.Background(), r, "t1", 20, exp, Who{Actor: "token", Reason: "incident 7"}); err != nil {
		t.Fatal(err)
	}
	u, err := a.Usage(context.Background(), r, "t1")
	if err != nil || u.Limit != 25 || u.Used != 4 || u.Remaining != 21 || u.Granted != 5 || u.Override == nil || u.Override.Value != 20 || !u.Override.Expires.Equal(exp) {
		t.Fatalf("usage: %+v %v", u, err)
	}
	var scanned []Usage
	err = a.Scan(context.Background(), r, func(string) *Rule { return r }, func(id string, u Usage) { scanned = append(scanned, u) })
	if err != nil || len(scanned) != 1 || scanned[0].Limit != 25 || scanned[0].Granted != 5 || scanned[0].Override == nil {
		t.Fatalf("scan: %+v %v", scanned, err)
	}
	entries, err := q.Audit(context.Background(), 10)
	if err != nil || len(entries) != 2 || entries[0].Action != ActionOverride || entries[1].Action != ActionGrant || entries[0].Actor != "token" {
		t.Fatalf("audit, newest first: %+v %v", entries, err)
	}
	if entries[0].Time.Before(entries[1].Time) {
		t.Fatalf("audit times out of order: %v before %v", entries[0].Time, entries[1].Time)
	}
}

// A refund under an override gives back one unit of the override's rate, no more.
func testQuotaRefund(t *testing.T, b backend) {
	a, _, q := quotaStores(t, b)
	r := rule(t, "refunds", 100, "hour", GCRA)
	if _, _, err := q.SetOverride(context.Background(), r, "t", 4, time.Now().Add(time.Hour), who); err != nil {
		t.Fatal(err)
	}
	var taken []Taken
	for range 4 {
		var d Decision
		hits := []Hit{{Rule: r, ID: "t"}}
		if err := a.Take(context.Background(), hits, &d); err != nil || !d.Allowed {
			t.Fatalf("take: %v %+v", err, d)
		}
		taken = d.Taken(hits, taken[:0])
	}
	if err := a.(Refunder).Refund(context.Background(), taken); err != nil {
		t.Fatal(err)
	}
	if n, _ := takeN(t, a, 2, Hit{Rule: r, ID: "t"}); n != 1 {
		t.Fatalf("after one refund under override 4: %d admitted, want 1", n)
	}
}

// The audit trail keeps the newest audit_max entries, newest first.
func TestAuditTrailCapped(t *testing.T) {
	srv := redistest.Start(t)
	for name, q := range map[string]QuotaStore{
		"memory": NewMemory(WithAuditMax(3)),
		"redis":  newRedisT(t, srv.Client(t), uniquePrefix(), WithRedisAuditMax(3)),
	} {
		t.Run(name, func(t *testing.T) {
			r := rule(t, "capped", 10, "hour", Fixed)
			for i := range 5 {
				if _, _, err := q.Grant(context.Background(), r, "t", int64(i+1), who); err != nil {
					t.Fatal(err)
				}
			}
			entries, err := q.Audit(context.Background(), 100)
			if err != nil || len(entries) != 3 {
				t.Fatalf("audit: %d entries %v, want 3", len(entries), err)
			}
			for i, want := range []int64{5, 4, 3} {
				if entries[i].Amount != want {
					t.Fatalf("entry %d: amount %d, want %d (newest first)", i, entries[i].Amount, want)
				}
			}
			if entries, _ := q.Audit(context.Background(), 2); len(entries) != 2 || entries[0].Amount != 5 {
				t.Fatalf("audit n=2: %+v", entries)
			}
		})
	}
}

// A decision is still one script call when tenants have quotas.
func TestQuotaOneScriptCall(t *testing.T) {
	srv := redistest.Start(t)
	client := srv.Client(t)
	s := newRedisT(t, client, uniquePrefix())
	r1, r2 := rule(t, "one_a", 10, "hour", Fixed), rule(t, "one_b", 10, "hour", GCRA)
	hits := []Hit{{Rule: r1, ID: "x"}, {Rule: r2, ID: "y"}}
	if _, _, err := s.Grant(context.Background(), r1, "x", 3, who); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.SetOverride(context.Background(), r2, "y", 2, time.Now().Add(time.Hour), who); err != nil {
		t.Fatal(err)
	}
	if err := s.Preload(context.Background()); err != nil {
		t.Fatal(err)
	}
	before := redistest.ScriptCalls(t, client)
	n, _ := takeN(t, s, 5, hits...)
	if calls := redistest.ScriptCalls(t, client) - before; calls != 5 || n != 2 {
		t.Fatalf("%d script calls for 5 decisions (%d admitted), want 5 (2)", calls, n)
	}
}

// BenchmarkDecisionCostWithQuota is BenchmarkDecisionCost for tenants that have a run-time
// quota: an override in force and grants in the window, on every limit of the decision.
//
//	go test -run '^$' -bench BenchmarkDecisionCostWithQuota -benchtime 20000x -count 6 ./limits/
func BenchmarkDecisionCostWithQuota(b *testing.B) {
	srv := redistest.Start(b)
	for _, n := range []int{1, 4} {
		b.Run(map[int]string{1: "agent_job", 4: "four_limits"}[n], func(b *testing.B) {
			hits := benchHits(b, []string{"proj", "keyhash", "org", "1.2.3.4"})[:n]
			decisionCost(b, srv, hits, func(s *Redis) {
				for _, h := range hits {
					if _, _, err := s.Grant(context.Background(), h.Rule, h.ID, 5, who); err != nil {
						b.Fatal(err)
					}
					if _, _, err := s.SetOverride(context.Background(), h.Rule, h.ID, h.Rule.Limit, time.Now().Add(time.Hour), who); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// On a Cluster, a decision whose tenants are on one master but in different slots is one
// node script touching several slots: its quota keys are checked and read there too.
func TestQuotaClusterSlotsOfOneNode(t *testing.T) {
	t.Parallel() // servers of its own, and no latency bound
	cl := redistest.StartCluster(t, 3)
	s := newRedisT(t, cl.Client(t), uniquePrefix())
	// Slots 0-5460 are the first master's (redis-cli's layout): two ids there, apart.
	var ids []string
	for i := 0; len(ids) < 2; i++ {
		id := fmt.Sprintf("id%d", i)
		if slot := keySlot(id); slot < 5000 && (len(ids) == 0 || keySlot(ids[0]) != slot) {
			ids = append(ids, id)
		}
	}
	a, b := rule(t, "node_a", 10, "hour", Fixed), rule(t, "node_b", 10, "hour", GCRA)
	hits := []Hit{{Rule: a, ID: ids[0]}, {Rule: b, ID: ids[1]}}
	if _, _, err := s.SetOverride(context.Background(), b, ids[1], 2, time.Now().Add(time.Hour), who); err != nil {
		t.Fatal(err)
	}
	if n, last := takeN(t, s, 3, hits...); n != 2 || last.Results[1].Limit != 2 || last.Results[0].Limit != 10 {
		t.Fatalf("two slots of one node, one overridden to 2: %d admitted, %+v", n, last.Results)
	}
	if u, err := s.Usage(context.Background(), a, ids[0]); err != nil || u.Used != 2 {
		t.Fatalf("the other limit after the denial: %+v %v, want 2 used", u, err)
	}
}

// A store's own flag survives a read of the set that began before the flag reached Redis
// (it once lost it for one read: the store's own action then did not apply for 250 ms).
func TestQuotaFlagsKeepOwn(t *testing.T) {
	var f quotaFlags
	if !f.on("x") {
		t.Fatal("before any read every limit must be on")
	}
	f.read(nil)
	if f.on("x") {
		t.Fatal("after reading none, x is on")
	}
	f.add("x", time.Now().Unix()+3600)
	f.read(nil) // began before the flag reached Redis
	if !f.on("x") || f.on("y") {
		t.Fatal("a stale read turned this store's own flag off")
	}
	f.add("old", time.Now().Unix()-quotaSkew-1)
	f.read(nil)
	if f.on("old") {
		t.Fatal("an own flag past its end stays on")
	}
}

// A tenant's run-time quota belongs to its limit's unit: overrides of tokens and streams limits
// are listed (their hashes are named by unit), and after a change of unit under the same name
// the other unit's grant and override do not apply.
func testQuotaByUnit(t *testing.T, b backend) {
	_, s, q := quotaStores(t, b)
	ctx := context.Background()
	tok := &Rule{Name: "by_unit", Limit: 1000, Window: mustWindow(t, "hour"), Unit: Tokens}
	st := &Rule{Name: "by_unit_streams", Limit: 5, Unit: Streams}
	req := &Rule{Name: "by_unit", Limit: 20, Window: tok.Window}
	expires := time.Now().Add(time.Hour)
	if _, _, err := q.Grant(ctx, tok, "acme", 500, who); err != nil {
		t.Fatal(err)
	}
	o1, _, err := q.SetOverride(ctx, tok, "acme", 2000, expires, who)
	if err != nil {
		t.Fatal(err)
	}
	o2, _, err := q.SetOverride(ctx, st, "acme", 9, expires, who)
	if err != nil {
		t.Fatal(err)
	}
	list, err := q.Overrides(ctx)
	if err != nil || len(list) != 2 || !slices.Contains(list, o1) || !slices.Contains(list, o2) {
		t.Fatalf("overrides: %+v %v, want the tokens and the streams override", list, err)
	}
	if u, err := s.Usage(ctx, tok, "acme"); err != nil || u.Limit != 2500 || u.Granted != 500 {
		t.Fatalf("tokens: %+v %v, want the override of 2000 and the grant of 500", u, err)
	}
	if u, err := s.Usage(ctx, req, "acme"); err != nil || u.Limit != 20 || u.Granted != 0 || u.Override != nil {
		t.Fatalf("the same limit counting requests: %+v %v, want its own 20 (no tokens grant or override)", u, err)
	}
	if _, err := q.EndOverride(ctx, tok, "acme", who); err != nil {
		t.Fatal(err)
	}
	if list, err := q.Overrides(ctx); err != nil || len(list) != 1 || list[0] != o2 {
		t.Fatalf("overrides after ending the tokens one: %+v %v", list, err)
	}
}
