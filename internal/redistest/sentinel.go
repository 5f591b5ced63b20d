package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// StartSentinel starts one Sentinel monitoring master under name, and waits until it knows
// the master's address.
func StartSentinel(t testing.TB, name string, master *Server) *Server {
	t.Helper()
	bin := lookServer(t)
	dir := t.TempDir()
	host, port, err := net.SplitHostPort(master.Addr)
	if err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(dir, "sentinel.conf")
	body := fmt.Sprintf("sentinel monitor %s %s %s 1\nsentinel down-after-milliseconds %s 5000\n", name, host, port, name)
	if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		p, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		s := &Server{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(p)), port: p, dir: dir, conf: conf, extra: []string{"--sentinel"}}
		if lastErr = s.launch(bin); lastErr == nil {
			t.Cleanup(func() { s.Stop(t) })
			waitMaster(t, s.Addr, name)
			return s
		}
	}
	t.Fatalf("redistest: start sentinel: %v", lastErr)
	return nil
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
