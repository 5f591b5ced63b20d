package redistest

import (
	"context"
	"regexp"
	"strconv"
	"testing"

	"github.com/redis/go-redis/v9"
)

var scriptStat = regexp.MustCompile(`cmdstat_(?:evalsha|eval):calls=(\d+)`)

// ScriptCalls returns how many EVAL and EVALSHA calls the server has run (INFO commandstats).
func ScriptCalls(t testing.TB, client *redis.Client) int {
	t.Helper()
	info, err := client.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatalf("INFO commandstats: %v", err)
	}
	total := 0
	for _, m := range scriptStat.FindAllStringSubmatch(info, -1) {
		n, _ := strconv.Atoi(m[1])
		total += n
	}
	return total
}

// CommandCalls returns how many times the server has run cmd (lower case, e.g. "get"), from
// INFO commandstats; commands a script runs count too.
func CommandCalls(t testing.TB, client *redis.Client, cmd string) int {
	t.Helper()
	info, err := client.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatalf("INFO commandstats: %v", err)
	}
	m := regexp.MustCompile(`cmdstat_` + regexp.QuoteMeta(cmd) + `:calls=(\d+)`).FindStringSubmatch(info)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// InfoInt returns one integer field of an INFO section (total_reads_processed of "stats", ...).
func InfoInt(t testing.TB, client *redis.Client, section, field string) int64 {
	t.Helper()
	info, err := client.Info(context.Background(), section).Result()
	if err != nil {
		t.Fatalf("INFO %s: %v", section, err)
	}
	if v, ok := infoField(info, field); ok {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			t.Fatalf("INFO %s %s: %v", section, field, err)
		}
		return n
	}
	t.Fatalf("no %s in INFO %s", field, section)
	return 0
}
