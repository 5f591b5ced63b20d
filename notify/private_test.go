package notify

import (
	"context"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"
)

// An endpoint on a loopback address, named by its address or by a name that resolves to
// it, is not delivered to unless it allows private addresses: the attempt fails naming the
// address and the opt-in, and the receiver sees nothing. With the opt-in the same receiver
// gets the delivery. Through the delivery loop as through Send.
func TestPrivateAddressesRefusedUnlessAllowed(t *testing.T) {
	keys := vectorKeys(t)
	recv := newReceiver(t, keys, nil)
	u, _ := url.Parse(recv.srv.URL)
	_, port, _ := net.SplitHostPort(u.Host)
	ctx := context.Background()
	n := New(NewMemory(10), nil, Options{Timeout: 5 * time.Second})
	for _, target := range []string{recv.srv.URL + "/hook", "http://localhost:" + port + "/hook"} {
		a := n.Send(ctx, &Endpoint{Name: "h", URL: target, Keys: keys}, "evt_refused", []byte(`{}`))
		if a.OK() || a.Err == nil || !strings.Contains(a.Err.Error(), "a loopback address") ||
			!strings.Contains(a.Err.Error(), "allow_private_addresses") || strings.Contains(a.Err.Error(), "/hook") {
			t.Fatalf("%s without the opt-in: %+v", target, a)
		}
	}
	if recv.total() != 0 {
		t.Fatalf("the receiver got %d requests", recv.total())
	}
	a := n.Send(ctx, &Endpoint{Name: "h", URL: "http://localhost:" + port + "/hook", Keys: keys, AllowPrivate: true}, "evt_allowed", []byte(`{"type":"ping","id":"evt_allowed","time":"2026-11-27T09:00:00Z","data":{}}`))
	if !a.OK() || recv.count("evt_allowed") != 1 {
		t.Fatalf("with the opt-in: %+v", a)
	}

	// The delivery loop: both endpoints take the event, only the one that opts in gets it.
	var rs results
	other := newReceiver(t, keys, nil)
	loop := New(NewMemory(10), []Endpoint{
		{Name: "open", URL: other.srv.URL, Keys: keys, AllowPrivate: true},
		{Name: "guarded", URL: recv.srv.URL, Keys: keys},
	}, fast(Options{OnResult: rs.on}))
	run(t, loop)
	if _, err := loop.Publish(ctx, Event{Type: "ping", ID: "evt_loop", Data: map[string]any{}}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the delivery to the open endpoint and a failed attempt to the other", func() bool {
		return other.count("evt_loop") == 1 && strings.Contains(rs.of("evt_loop"), "failed")
	})
	if recv.count("evt_loop") != 0 {
		t.Fatal("the guarded endpoint was delivered to")
	}
}
