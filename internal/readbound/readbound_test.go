package readbound

import (
	"fmt"
	"net/netip"
	"testing"
	"time"
)

// Floods of invented keys and of addresses: each table holds at most its cap, the callers
// that spent their budget stay refused while the flood churns the table, and a real caller
// is still answered (as filed, 65,536 invented keys filled the key table and every real key
// was refused for the rest of the minute).
func TestSelfUsageBoundFloods(t *testing.T) {
	now := time.Date(2026, 11, 27, 13, 0, 10, 0, time.UTC)
	t.Run("keys", func(t *testing.T) {
		c := New().keys
		const limit = 60
		for range limit {
			take(c, "spent", limit, now)
		}
		for i := range 3 * maxKeys {
			if ok, _ := take(c, fmt.Sprintf("invented%d", i), limit, now); !ok {
				t.Fatalf("invented key %d refused: a new key never is", i)
			}
		}
		if n := c.Len(); n > maxKeys {
			t.Fatalf("%d keys tracked, cap %d", n, maxKeys)
		}
		if ok, _ := take(c, "real", limit, now); !ok {
			t.Fatal("a real key was refused after the flood")
		}
		if ok, _ := take(c, "spent", limit, now); ok {
			t.Fatal("a key that spent its budget was answered again during the flood")
		}
	})
	t.Run("addresses", func(t *testing.T) {
		c := New().addrs
		const limit = 120
		spent := netip.MustParseAddr("192.0.2.1")
		for range limit {
			take(c, spent, limit, now)
		}
		for i := range 3 * maxAddrs {
			a := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
			if ok, _ := take(c, a, limit, now); !ok {
				t.Fatalf("address %v refused", a)
			}
		}
		if n := c.Len(); n > maxAddrs {
			t.Fatalf("%d addresses tracked, cap %d", n, maxAddrs)
		}
		if ok, _ := take(c, netip.MustParseAddr("192.0.2.2"), limit, now); !ok {
			t.Fatal("a real address was refused after the flood")
		}
		if ok, _ := take(c, spent, limit, now); ok {
			t.Fatal("an address that spent its budget was answered again during the flood")
		}
	})
}
