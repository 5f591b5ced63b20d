package clientip

import (
	"net/http"
	"net/netip"
	"testing"
)

func TestClientIPResolution(t *testing.T) {
	c := Resolver{Trusted: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("2001:db8::/32")}}
	cases := []struct {
		name, remote string
		xff          []string
		want         string
		trusted      bool
	}{
		{"untrusted peer ignores xff", "203.0.113.5:1234", []string{"1.2.3.4"}, "203.0.113.5", false},
		{"trusted peer, no xff", "10.0.0.1:80", nil, "10.0.0.1", true},
		{"right-most untrusted", "10.0.0.1:80", []string{"1.1.1.1, 2.2.2.2, 10.9.9.9"}, "2.2.2.2", true},
		{"several header lines", "10.0.0.1:80", []string{"1.1.1.1", "2.2.2.2, 10.0.0.7"}, "2.2.2.2", true},
		{"all trusted: left-most", "10.0.0.1:80", []string{"10.1.1.1, 10.2.2.2"}, "10.1.1.1", true},
		{"garbage stops the walk", "10.0.0.1:80", []string{"1.1.1.1, nonsense, 10.0.0.9"}, "10.0.0.9", true},
		{"port and brackets", "10.0.0.1:80", []string{"[2001:db9::1]:443"}, "2001:db9::1", true},
		{"v4-mapped peer", "[::ffff:10.0.0.1]:80", []string{"192.0.2.1"}, "192.0.2.1", true},
		{"ipv6 trusted peer", "[2001:db8::1]:80", []string{"2001:db9::5"}, "2001:db9::5", true},
		{"bad remote addr", "pipe", []string{"1.2.3.4"}, "invalid IP", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := &http.Request{RemoteAddr: tc.remote, Header: http.Header{}}
			for _, v := range tc.xff {
				r.Header.Add("X-Forwarded-For", v)
			}
			got, trusted := c.Resolve(r)
			if got.String() != tc.want || trusted != tc.trusted {
				t.Fatalf("resolve = %s, %t; want %s, %t", got, trusted, tc.want, tc.trusted)
			}
		})
	}
}
