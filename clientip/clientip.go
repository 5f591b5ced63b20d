// Package clientip finds a request's client address: the TCP peer, or the client a trusted proxy's X-Forwarded-For names.
package clientip

import (
	"net/http"
	"net/netip"
	"strings"
)

// Resolver derives the client address: the TCP peer, unless the peer is a trusted proxy, in
// which case X-Forwarded-For is walked from the right and the right-most address that is not
// itself a trusted proxy is the client. Addresses to the left of it were written by parties we
// cannot vouch for, so they are never used.
type Resolver struct {
	Trusted []netip.Prefix
}

func (c *Resolver) isTrusted(a netip.Addr) bool {
	for _, p := range c.Trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Peer parses r.RemoteAddr; an unparsable one (not from a real listener) is the zero Addr.
func Peer(r *http.Request) netip.Addr {
	ap, err := netip.ParseAddrPort(r.RemoteAddr)
	if err != nil {
		return netip.Addr{}
	}
	return ap.Addr().Unmap()
}

// Resolve returns the client address and whether the TCP peer was a trusted proxy.
func (c *Resolver) Resolve(r *http.Request) (netip.Addr, bool) {
	addr := Peer(r)
	if len(c.Trusted) == 0 || !addr.IsValid() || !c.isTrusted(addr) {
		return addr, false
	}
	values := r.Header.Values("X-Forwarded-For")
	// Header lines are appended in order, so the last line holds the right-most hops.
	for i := len(values) - 1; i >= 0; i-- {
		line := values[i]
		for line != "" {
			var hop string
			if j := strings.LastIndexByte(line, ','); j >= 0 {
				hop, line = line[j+1:], line[:j]
			} else {
				hop, line = line, ""
			}
			a, ok := parseHop(strings.TrimSpace(hop))
			if !ok {
				// A trusted proxy would not write garbage: whoever did is not trusted, and
				// the last address we could vouch for is the client.
				return addr, true
			}
			addr = a
			if !c.isTrusted(a) {
				return addr, true
			}
		}
	}
	return addr, true
}

// parseHop accepts an IP, optionally with a port or in brackets, as proxies write them.
func parseHop(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap(), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap(), true
	}
	if len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']' {
		if a, err := netip.ParseAddr(s[1 : len(s)-1]); err == nil {
			return a.Unmap(), true
		}
	}
	return netip.Addr{}, false
}
