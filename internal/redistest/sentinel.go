package redistest

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// StartSentinel starts one Sentinel monitoring master under name, and waits until it knows
// the master's address.
func StartSentinel(t testing.TB, name string, master *Server) *Server {
	t.Helper()
	host, port, err := net.SplitHostPort(master.Addr)
	if err != nil {
		t.Fatal(err)
	}
	return startSentinel(t, name, fmt.Sprintf("sentinel monitor %s %s %s 1\nsentinel down-after-milliseconds %s 5000\n", name, host, port, name))
}

func waitMaster(t testing.TB, addr, name string) {
	t.Helper()
	c := redis.NewSentinelClient(&redis.Options{Addr: addr})
	defer c.Close()
	deadline := time.Now().Add(readyTimeout)
	for {
		got, err := c.GetMasterAddrByName(context.Background(), name).Result()
		if err == nil && len(got) == 2 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: sentinel on %s does not know master %s: %v", addr, name, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
