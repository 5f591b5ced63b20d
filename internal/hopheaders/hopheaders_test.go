package hopheaders

import (
	"net/http"
	"testing"
)

func TestStripConnectionNamed(t *testing.T) {
	h := http.Header{
		"Connection":    {"keep-alive, Authorization", " x-extra ,upgrade"},
		"Keep-Alive":    {"timeout=5"},
		"Authorization": {"Bearer svc_x"},
		"X-Extra":       {"1"},
		"Upgrade":       {"websocket"},
		"Content-Type":  {"application/json"},
	}
	StripConnectionNamed(h)
	for _, gone := range []string{"Keep-Alive", "Authorization", "X-Extra"} {
		if _, ok := h[gone]; ok {
			t.Errorf("%s named in Connection was kept", gone)
		}
	}
	for _, kept := range []string{"Upgrade", "Content-Type", "Connection"} {
		if _, ok := h[kept]; !ok {
			t.Errorf("%s was removed", kept)
		}
	}
}

func TestCleanOutgoing(t *testing.T) {
	h := http.Header{
		"Forwarded":       {"for=1.2.3.4"},
		"X-Real-Ip":       {"1.2.3.4"},
		"X_real_ip":       {"1.2.3.4"},
		"X_forwarded_for": {"1.2.3.4"},
		"Expect":          {"100-continue"},
		"Http2-Settings":  {"AAA"},
		"X_custom_thing":  {"kept"},
		"Authorization":   {"Bearer svc_x"},
		"X-Forwarded-For": {"10.0.0.1"},
	}
	CleanOutgoing(h)
	for _, gone := range []string{"Forwarded", "X-Real-Ip", "X_real_ip", "X_forwarded_for", "Expect", "Http2-Settings"} {
		if _, ok := h[gone]; ok {
			t.Errorf("%s reached the upstream", gone)
		}
	}
	for _, kept := range []string{"X_custom_thing", "Authorization", "X-Forwarded-For"} {
		if _, ok := h[kept]; !ok {
			t.Errorf("%s was removed", kept)
		}
	}
}
