package clientip

import (
	"net/http"
	"net/netip"
	"strings"
	"testing"
)

// FuzzClientIP drives (*Resolver).Resolve with arbitrary peers and X-Forwarded-For lines
// (newline-separated in xff, one header line each). Whatever the input: no panic; the result
// is the peer or an address written in X-Forwarded-For; from an untrusted peer it is always
// the peer and the peer is not reported trusted.
func FuzzClientIP(f *testing.F) {
	f.Add("203.0.113.5:1234", "1.2.3.4")
	f.Add("10.0.0.1:80", "")
	f.Add("10.0.0.1:80", "1.1.1.1, 2.2.2.2, 10.9.9.9")
	f.Add("10.0.0.1:80", "1.1.1.1\n2.2.2.2, 10.0.0.7")
	f.Add("10.0.0.1:80", "10.1.1.1, 10.2.2.2")
	f.Add("10.0.0.1:80", "1.1.1.1, nonsense, 10.0.0.9")
	f.Add("10.0.0.1:80", "[2001:db9::1]:443")
	f.Add("[::ffff:10.0.0.1]:80", "192.0.2.1")
	f.Add("[2001:db8::1]:80", "2001:db9::5")
	f.Add("[2001:db8::1]:80", "::ffff:192.0.2.9,fe80::1%eth0")
	f.Add("pipe", "1.2.3.4")
	f.Add("10.0.0.1:80", ",,,  ,")
	f.Add("10.0.0.1:80", "1.2.3.4:99999")
	f.Add("127.0.0.1:1", "[::1], 0.0.0.0, 255.255.255.255")
	f.Fuzz(func(t *testing.T, remote, xff string) {
		c := Resolver{Trusted: []netip.Prefix{
			netip.MustParsePrefix("10.0.0.0/8"),
			netip.MustParsePrefix("127.0.0.0/8"),
			netip.MustParsePrefix("2001:db8::/32"),
		}}
		r := &http.Request{RemoteAddr: remote, Header: http.Header{}}
		var hops []netip.Addr // every parsable hop, left to right
		var chain []string    // every hop, left to right, as written
		for _, line := range strings.Split(xff, "\n") {
			r.Header.Add("X-Forwarded-For", line)
			if line == "" {
				continue
			}
			for _, hop := range strings.Split(line, ",") {
				chain = append(chain, hop)
				if a, ok := parseHop(strings.TrimSpace(hop)); ok {
					hops = append(hops, a)
				}
			}
		}
		got, trusted := c.Resolve(r)
		p := Peer(r)
		if !p.IsValid() || !c.isTrusted(p) {
			if got != p || trusted {
				t.Fatalf("untrusted peer %q, xff %q: resolved %v (trusted %t), want the peer %v", remote, xff, got, trusted, p)
			}
			return
		}
		if !trusted {
			t.Fatalf("trusted peer %v reported untrusted", p)
		}
		found := got == p
		for _, h := range hops {
			found = found || got == h
		}
		if !found {
			t.Fatalf("peer %q, xff %q: resolved %v, neither the peer nor a forwarded address", remote, xff, got)
		}
		// Reference walk: from the right, stop at the first hop that is garbage (keep the
		// last address vouched for) or not trusted (it is the client).
		want := p
		for i := len(chain) - 1; i >= 0; i-- {
			a, ok := parseHop(strings.TrimSpace(chain[i]))
			if !ok {
				break
			}
			want = a
			if !c.isTrusted(a) {
				break
			}
		}
		if got != want {
			t.Fatalf("peer %q, xff %q: resolved %v, want the right-most untrusted hop %v", remote, xff, got, want)
		}
	})
}
