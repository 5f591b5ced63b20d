// Package hopheaders removes from a request the headers its upstream must not receive.
//
// Headers the gateway checks must be the headers the upstream receives: ReverseProxy removes
// the hop-by-hop headers, and those the client names in Connection, from the request it sends,
// so a client naming Authorization there would have its key checked and charged by the gateway
// and never seen by the upstream. The gateway therefore removes them on arrival, before
// anything reads the request (RFC 9110 7.6.1: they are meant for this hop only).
package hopheaders

import (
	"net/http"
	"net/textproto"
	"strings"
)

// StripConnectionNamed removes from h the headers the client names in Connection. "upgrade"
// stays for the gateway to refuse the upgrade; "close" and "keep-alive" name no
// end-to-end header. It allocates nothing for the Connection values clients usually send.
func StripConnectionNamed(h http.Header) {
	for _, v := range h["Connection"] {
		for v != "" {
			var tok string
			tok, v, _ = strings.Cut(v, ",")
			tok = textproto.TrimString(tok)
			switch {
			case tok == "", strings.EqualFold(tok, "close"), strings.EqualFold(tok, "upgrade"):
			case strings.EqualFold(tok, "keep-alive"):
				delete(h, "Keep-Alive")
			default:
				h.Del(tok)
			}
		}
	}
}

// clientIdentityHeaders claim the client's address in other ways than X-Forwarded-For. A
// client could set any of them; the gateway's X-Forwarded-For is the one source of the
// client's address the upstream gets (ReverseProxy already drops Forwarded; it is listed
// so that does not have to be remembered).
var clientIdentityHeaders = [...]string{
	"Forwarded",
	"X-Real-Ip",
	"True-Client-Ip",
	"X-Client-Ip",
	"X-Cluster-Client-Ip",
	"Cf-Connecting-Ip",
	"Fastly-Client-Ip",
}

// CleanOutgoing removes from the upstream request what the gateway answers or decides itself:
// the client identity headers, Expect (the gateway has answered 100-continue by reading the
// body; the upstream gets the body at once) and HTTP2-Settings (part of an h2c upgrade, which
// is never forwarded; hop-by-hop by RFC 9113 3.2.1 anyway).
func CleanOutgoing(h http.Header) {
	for _, k := range clientIdentityHeaders {
		delete(h, k)
	}
	delete(h, "Expect")
	delete(h, "Http2-Settings")
	for k := range h {
		if strings.IndexByte(k, '_') >= 0 && spoofsAddress(k) {
			delete(h, k)
		}
	}
}

// spoofsAddress reports whether a header name with underscores reads as an address header
// to an upstream that maps '_' to '-' (CGI-style servers see X_Real_IP and X-Real-IP, or
// X_Forwarded_For and X-Forwarded-For, as one variable). Only such names get here.
func spoofsAddress(k string) bool {
	k = strings.ReplaceAll(k, "_", "-")
	for _, id := range clientIdentityHeaders {
		if strings.EqualFold(k, id) {
			return true
		}
	}
	for _, id := range [...]string{"X-Forwarded-For", "X-Forwarded-Host", "X-Forwarded-Proto"} {
		if strings.EqualFold(k, id) {
			return true
		}
	}
	return false
}
