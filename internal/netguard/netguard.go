// Package netguard refuses the gateway's own outgoing connections to non-public addresses.
//
// Netguard tells which addresses the gateway's own outgoing requests (webhook
// deliveries) must not reach unless the operator says so: loopback, link-local, private,
// unspecified, cloud metadata and other non-public addresses. A URL's host is only a name:
// the check belongs where a connection is made, after DNS, which Control does for a
// net.Dialer.
package netguard

import (
	"fmt"
	"net/netip"
	"syscall"
)

// Kinds of refused addresses, as Classify names them.
const (
	Metadata    = "cloud metadata"
	Loopback    = "loopback"
	Unspecified = "unspecified"
	LinkLocal   = "link-local"
	Private     = "private"
	Shared      = "shared (carrier-grade NAT)"
	Multicast   = "multicast"
	Reserved    = "reserved"
)

// metadata are the cloud metadata services outside the ranges below (169.254.169.254, the
// AWS, GCP, Azure and OpenStack one, is link-local; fd00:ec2::254, AWS's IPv6 one, is private):
// named first for a clearer message.
var metadata = []netip.Addr{
	netip.MustParseAddr("169.254.169.254"),
	netip.MustParseAddr("fd00:ec2::254"),
	netip.MustParseAddr("100.100.100.200"), // Alibaba Cloud
	netip.MustParseAddr("168.63.129.16"),   // Azure's wire server (a public address)
	netip.MustParseAddr("192.0.0.192"),     // Oracle Cloud
}

// ranges are the refused prefixes the netip predicates do not cover.
var ranges = []struct {
	prefix netip.Prefix
	kind   string
}{
	{netip.MustParsePrefix("0.0.0.0/8"), Unspecified}, // "this network": Linux connects 0.0.0.0 to the host itself
	{netip.MustParsePrefix("100.64.0.0/10"), Shared},
	{netip.MustParsePrefix("192.0.0.0/24"), Reserved},   // IETF protocol assignments
	{netip.MustParsePrefix("198.18.0.0/15"), Reserved},  // benchmarking
	{netip.MustParsePrefix("240.0.0.0/4"), Reserved},    // reserved, and the broadcast address
	{netip.MustParsePrefix("::/96"), Reserved},          // IPv4-compatible (deprecated)
	{netip.MustParsePrefix("100::/64"), Reserved},       // discard-only
	{netip.MustParsePrefix("2001::/23"), Reserved},      // IETF protocol assignments (Teredo included)
	{netip.MustParsePrefix("2001:db8::/32"), Reserved},  // documentation
	{netip.MustParsePrefix("fec0::/10"), LinkLocal},     // site-local (deprecated)
	{netip.MustParsePrefix("64:ff9b:1::/48"), Reserved}, // local-use NAT64
}

// Embedded IPv4: an IPv6 address of these prefixes reaches the IPv4 address it carries.
var (
	nat64  = netip.MustParsePrefix("64:ff9b::/96")
	sixTo4 = netip.MustParsePrefix("2002::/16")
)

// Classify returns the kind of a when the gateway must not connect to it unasked, or "" for
// a public address. An IPv4 address written as IPv6 (::ffff:a.b.c.d, or through NAT64 or
// 6to4) is classified as the IPv4 address it reaches.
func Classify(a netip.Addr) string {
	a = a.Unmap().WithZone("")
	switch {
	case a.Is6() && nat64.Contains(a):
		b := a.As16()
		return Classify(netip.AddrFrom4([4]byte(b[12:16])))
	case a.Is6() && sixTo4.Contains(a):
		b := a.As16()
		return Classify(netip.AddrFrom4([4]byte(b[2:6])))
	}
	for _, m := range metadata {
		if a == m {
			return Metadata
		}
	}
	switch {
	case !a.IsValid():
		return Unspecified
	case a.IsLoopback():
		return Loopback
	case a.IsUnspecified():
		return Unspecified
	case a.IsLinkLocalUnicast():
		return LinkLocal
	case a.IsPrivate():
		return Private
	case a.IsMulticast():
		return Multicast
	}
	for _, r := range ranges {
		if r.prefix.Contains(a) {
			return r.kind
		}
	}
	return ""
}

// RefusedError is a connection Control refused.
type RefusedError struct {
	Addr netip.Addr
	Kind string // what Classify says of Addr
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("refused to connect to %s, %s address", e.Addr, Article(e.Kind))
}

// Article is kind with its indefinite article: "a loopback", "an unspecified".
func Article(kind string) string {
	if kind != "" && (kind[0] == 'u' || kind[0] == 'a' || kind[0] == 'e' || kind[0] == 'i' || kind[0] == 'o') {
		return "an " + kind
	}
	return "a " + kind
}

// Control is a net.Dialer Control function that refuses a connection to an address Classify
// names, with a *RefusedError. It runs for every address a name resolves to, just before
// connecting: a name that resolves to a private address, or whose DNS answer changes after a
// check, is refused all the same.
func Control(network, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("refused to connect to %q on %s: not an IP address and port", address, network)
	}
	if kind := Classify(ap.Addr()); kind != "" {
		return &RefusedError{Addr: ap.Addr(), Kind: kind}
	}
	return nil
}
