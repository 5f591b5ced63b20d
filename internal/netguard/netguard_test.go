package netguard

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"testing"
	"time"
)

func TestClassify(t *testing.T) {
	for addr, want := range map[string]string{
		"169.254.169.254":       Metadata,
		"fd00:ec2::254":         Metadata,
		"100.100.100.200":       Metadata,
		"168.63.129.16":         Metadata,
		"192.0.0.192":           Metadata,
		"127.0.0.1":             Loopback,
		"127.255.0.9":           Loopback,
		"::1":                   Loopback,
		"::ffff:127.0.0.1":      Loopback, // IPv4-mapped
		"64:ff9b::7f00:1":       Loopback, // NAT64 of 127.0.0.1
		"64:ff9b::a9fe:a9fe":    Metadata, // NAT64 of 169.254.169.254
		"2002:a9fe:a9fe::1":     Metadata, // 6to4 of 169.254.169.254
		"2002:0a00:0001::":      Private,  // 6to4 of 10.0.0.1
		"169.254.1.1":           LinkLocal,
		"fe80::1":               LinkLocal,
		"fe80::1%eth0":          LinkLocal,
		"fec0::1":               LinkLocal,
		"10.1.2.3":              Private,
		"172.16.0.1":            Private,
		"172.31.255.255":        Private,
		"192.168.1.1":           Private,
		"fc00::1":               Private,
		"fd12:3456::1":          Private,
		"100.64.0.1":            Shared,
		"0.0.0.0":               Unspecified,
		"0.1.2.3":               Unspecified,
		"::":                    Unspecified,
		"224.0.0.1":             Multicast,
		"ff02::1":               Multicast,
		"255.255.255.255":       Reserved,
		"240.0.0.1":             Reserved,
		"198.18.0.1":            Reserved,
		"::7f00:1":              Reserved, // IPv4-compatible
		"2001:db8::1":           Reserved,
		"2001::1":               Reserved, // Teredo
		"172.32.0.1":            "",
		"100.128.0.1":           "",
		"8.8.8.8":               "",
		"93.184.216.34":         "",
		"2606:4700:4700::1111":  "",
		"2a00:1450:4001:81b::e": "",
	} {
		if got := Classify(netip.MustParseAddr(addr)); got != want {
			t.Errorf("Classify(%s) = %q, want %q", addr, got, want)
		}
	}
	if got := Classify(netip.Addr{}); got == "" {
		t.Error("the zero address is public")
	}
}

// Control refuses before a connection is made, with the address and its kind; a dialer
// without it connects to the same listener.
func TestControlRefusesAtConnect(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan struct{}, 2)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- struct{}{}
			c.Close()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	guarded := &net.Dialer{Control: Control}
	_, err = guarded.DialContext(ctx, "tcp", ln.Addr().String())
	var refused *RefusedError
	if !errors.As(err, &refused) || refused.Kind != Loopback || refused.Addr != netip.MustParseAddr("127.0.0.1") ||
		err.Error() != "dial tcp "+ln.Addr().String()+": refused to connect to 127.0.0.1, a loopback address" {
		t.Fatalf("guarded dial: %v", err)
	}
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	<-accepted
	select {
	case <-accepted:
		t.Fatal("the refused dial reached the listener")
	case <-time.After(100 * time.Millisecond):
	}
	if err := Control("tcp", "8.8.8.8:443", nil); err != nil {
		t.Fatalf("a public address: %v", err)
	}
	if err := Control("tcp6", "[fe80::1%eth0]:80", nil); !errors.As(err, &refused) || refused.Kind != LinkLocal || err.Error() != "refused to connect to fe80::1%eth0, a link-local address" {
		t.Fatalf("a link-local address with a zone: %v", err)
	}
}
