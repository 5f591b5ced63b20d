package limits

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/docsgate/gateway/internal/redistest"
)

// windowFlip is a tenant moved between plans whose limits count in windows of 3 s and 2 s and
// back, all within one 3 s window: at base+6.1 s (3 s window [6, 9)), at base+7.6 s (2 s window
// [7, 9), base being odd), at base+8.99 s (3 s window [6, 9) again) and at base+9.01 s. The
// second change back returns to a window whose first part was moved aside as a kept window by
// the first change.
var windowFlip = []struct {
	win   string
	at    float64 // seconds after base
	units int
}{
	{"3s", 1.9, 3}, {"2s", 3.4, 6}, {"3s", 6.1, 7}, {"2s", 7.6, 8}, {"3s", 8.99, 1}, {"3s", 9.01, 1},
}

// base is a multiple of 3 and odd, so 2 s windows start 1 s after 3 s windows every 6 s.
const windowFlipBase = 1795800405

// A change of window and a change back lose no unit: the window that returns counts what it
// had before the first change (the decision sees all 15 units of [6, 9)), and the history by
// 3 s windows adds up to every unit taken. In process, on a clock of its own.
func TestWindowFlipKeepsEveryUnitMemory(t *testing.T) {
	var mu sync.Mutex
	now := time.Unix(windowFlipBase, 0)
	m := NewMemory(WithClock(func() time.Time { mu.Lock(); defer mu.Unlock(); return now }))
	rules := map[string]*Rule{}
	for _, w := range []string{"3s", "2s"} {
		rules[w] = &Rule{Name: "plan_per_org", Limit: 1000, Window: mustWindow(t, w), Algorithm: Fixed, History: 20}
	}
	total := 0
	for i, step := range windowFlip {
		mu.Lock()
		now = time.Unix(windowFlipBase, 0).Add(time.Duration(step.at * float64(time.Second)))
		mu.Unlock()
		r := rules[step.win]
		if i == 4 {
			// Read as /usage/top reads: the 15 units of [6, 9) before the tenant's next unit.
			if used := scanUsed(t, m, rules["3s"], "acme"); used != 15 {
				t.Fatalf("a scan back in the 3 s window: %d used, want 15", used)
			}
			// Back in [6, 9): 7 + 8 units used there; with a limit of 16 one more is admitted.
			tight := *r
			tight.Limit = 16
			rules["3s"] = &tight
			if n, _ := takeN(t, m, 2, Hit{Rule: &tight, ID: "acme"}); n != 1 {
				t.Fatalf("back in the 3 s window: %d of 2 admitted against a limit of 16, want 1 (15 used)", n)
			}
			total++
			continue
		}
		admitN(t, m, r, "acme", step.units)
		total += step.units
	}
	var sum int64
	for _, n := range historyUsed(t, m, rules["3s"], "acme") {
		sum += n
	}
	if sum != int64(total) {
		t.Fatalf("history adds up to %d, %d taken", sum, total)
	}
}

// The same on a real redis-server, through the scripts' own functions (count and keep_past,
// as a take runs them) with each step's window start given, since Redis' clock cannot be set.
func TestWindowFlipKeepsEveryUnitRedis(t *testing.T) {
	srv := redistest.Start(t)
	c := srv.Client(t)
	ctx := context.Background()
	// ARGV: window spec, kept windows, window start, units. Returns the count before them.
	take := redis.NewScript(windowLua + `
local win, keep, ws, k = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local before, same = count(KEYS[1], ws, win)
if same then
  redis.call('HINCRBY', KEYS[1], 'n', k)
else
  local carry = keep_past(KEYS[1], win, keep, ws)
  redis.call('HSET', KEYS[1], 's', ws, 'n', carry + k)
end
return before`)
	key := "gw:plan_per_org:{acme}"
	total := 0
	for i, step := range windowFlip {
		w := mustWindow(t, step.win)
		ws, _ := w.boundsUnix(windowFlipBase + int64(step.at))
		before, err := take.Run(ctx, c, []string{key}, w.luaSpec(), 20, ws, step.units).Int64()
		if err != nil {
			t.Fatal(err)
		}
		if i == 4 && before != 15 {
			t.Fatalf("back in the 3 s window: %d counted, want 15 (7 before the change, 8 after)", before)
		}
		total += step.units
	}
	kv, err := c.HGetAll(ctx, key).Result()
	if err != nil {
		t.Fatal(err)
	}
	flat := make([]any, 0, 2*len(kv))
	for f, v := range kv {
		flat = append(flat, f, v)
	}
	var sum int64
	for ws, n := range byWindow(mustWindow(t, "3s"), usesOf(flat)) {
		if ws >= windowFlipBase {
			sum += n
		}
	}
	if sum != int64(total) {
		t.Fatalf("the kept windows and the current one add up to %d, %d taken: %v", sum, total, kv)
	}

	// A scan reads the same count as the decision: the hash as it was before the change back
	// (2 s window, 8 units; 7 kept under the 3 s window's start), placed in the current 3 s
	// window of Redis' clock.
	alignWindow(t, 3*time.Second, time.Second)
	w3 := mustWindow(t, "3s")
	cur, _ := w3.boundsUnix(time.Now().Unix())
	two := cur + cur%2 // a 2 s window's start inside [cur, cur+3)
	r3 := &Rule{Name: "plan_per_org", Limit: 1000, Window: w3, Algorithm: Fixed, History: 20}
	store := newRedisT(t, c, "flip:")
	k, err := store.Key(r3, "acme")
	if err != nil {
		t.Fatal(err)
	}
	c.HSet(ctx, k, "s", two, "n", 8, "w", "2", "m", 1, strconv.FormatInt(cur, 10), 7)
	c.Expire(ctx, k, time.Minute)
	if used := scanUsed(t, store, r3, "acme"); used != 15 {
		t.Fatalf("a scan back in the 3 s window: %d used, want 15", used)
	}
}

// scanUsed is what a scan of r (as /usage/top reads) says id uses.
func scanUsed(t *testing.T, s Store, r *Rule, id string) int64 {
	t.Helper()
	var used int64
	err := s.Scan(context.Background(), r, func(string) *Rule { return r }, func(got string, u Usage) {
		if got == id {
			used = u.Used
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return used
}

// An hourly limit made daily counts the day's earlier hours, not only the current one: they
// were used inside the new window.
func TestLongerWindowCountsItsEarlierWindows(t *testing.T) {
	var mu sync.Mutex
	now := time.Date(2026, 11, 27, 9, 10, 0, 0, time.UTC)
	m := NewMemory(WithClock(func() time.Time { mu.Lock(); defer mu.Unlock(); return now }))
	at := func(h, min int) { mu.Lock(); now = time.Date(2026, 11, 27, h, min, 0, 0, time.UTC); mu.Unlock() }
	hourly := &Rule{Name: "per_org", Limit: 1000, Window: mustWindow(t, "hour"), Algorithm: Fixed, History: 48}
	daily := &Rule{Name: "per_org", Limit: 60, Window: mustWindow(t, "day"), Algorithm: Fixed, History: 35}
	admitN(t, m, hourly, "acme", 30)
	at(10, 10)
	admitN(t, m, hourly, "acme", 20)
	at(10, 30)
	if n, _ := takeN(t, m, 20, Hit{Rule: daily, ID: "acme"}); n != 10 {
		t.Fatalf("made daily at 10:30: %d of 20 admitted against 60 a day, want 10 (50 used today)", n)
	}
	if got := historyUsed(t, m, daily, "acme"); got[0] != 60 {
		t.Fatalf("today's window in history: %d, want 60", got[0])
	}
}
