package fwdauth

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/docsgate/gateway/config"
)

// seen records the request the door hands to the pipeline: what is checked here is how the
// door rebuilds it, the pipeline's own decision has its tests against the binary.
type seen struct{ r *http.Request }

func (s *seen) Authorize(w http.ResponseWriter, r *http.Request) {
	s.r = r
	w.WriteHeader(http.StatusOK)
}

func TestRebuildsOnlyForTrustedProxies(t *testing.T) {
	fa := config.ForwardAuth{Listen: "127.0.0.1:0", Path: "/auth", TrustedProxies: []string{"10.0.0.1"}}
	for _, c := range []struct {
		name, peer, target string
		hdr                map[string]string
		status             int
		method, uri, addr  string
	}{
		{"nginx", "10.0.0.1:5000", "/auth", map[string]string{"X-Original-Method": "GET", "X-Original-URI": "/v2/agent/p/job/j?x=1", "X-Forwarded-For": "1.2.3.4, 203.0.113.9"},
			200, "GET", "/v2/agent/p/job/j?x=1", "203.0.113.9:0"},
		{"caddy", "10.0.0.1:5000", "/auth", map[string]string{"X-Forwarded-Method": "POST", "X-Forwarded-Uri": "/a/%2e%2e/b", "X-Forwarded-For": "203.0.113.9"},
			200, "POST", "/a/%2e%2e/b", "203.0.113.9:0"},
		{"envoy", "10.0.0.1:5000", "/auth/v2/agent/p/job/j?x=1", nil, 200, "GET", "/v2/agent/p/job/j?x=1", "10.0.0.1:0"},
		{"untrusted peer", "198.51.100.7:5000", "/auth", map[string]string{"X-Original-Method": "GET", "X-Original-URI": "/v2/agent/p/job/j"}, 403, "", "", ""},
		{"families disagree", "10.0.0.1:5000", "/auth", map[string]string{"X-Original-Method": "GET", "X-Forwarded-Method": "DELETE", "X-Original-URI": "/x"}, 400, "", "", ""},
		{"lower-case method", "10.0.0.1:5000", "/auth", map[string]string{"X-Original-Method": "get", "X-Original-URI": "/x"}, 400, "", "", ""},
		{"absolute URI", "10.0.0.1:5000", "/auth", map[string]string{"X-Original-Method": "GET", "X-Original-URI": "http://evil/x"}, 400, "", "", ""},
		{"scheme-relative URI", "10.0.0.1:5000", "/auth", map[string]string{"X-Original-Method": "GET", "X-Original-URI": "//evil/x"}, 400, "", "", ""},
		{"huge URI", "10.0.0.1:5000", "/auth", map[string]string{"X-Original-Method": "GET", "X-Original-URI": "/" + strings.Repeat("a", maxURI)}, 400, "", "", ""},
		{"no URI", "10.0.0.1:5000", "/auth", map[string]string{"X-Original-Method": "GET"}, 400, "", "", ""},
		{"other path", "10.0.0.1:5000", "/authx", nil, 404, "", "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			door := &seen{}
			h, err := New(fa, nil, door)
			if err != nil {
				t.Fatal(err)
			}
			r := httptest.NewRequest("GET", c.target, nil)
			r.RemoteAddr = c.peer
			r.Header.Set("Authorization", "Bearer svc_x")
			for k, v := range c.hdr {
				r.Header.Set(k, v)
			}
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			if w.Code != c.status {
				t.Fatalf("status %d %s; want %d", w.Code, w.Body, c.status)
			}
			if c.status != 200 {
				if door.r != nil {
					t.Fatal("a refused request reached the pipeline")
				}
				if !strings.Contains(w.Body.String(), `"code"`) || w.Header().Get(HeaderError) == "" {
					t.Fatalf("refusal without the error body and its header: %v %s", w.Header(), w.Body)
				}
				return
			}
			got := door.r
			if got.Method != c.method || got.URL.RequestURI() != c.uri || got.RemoteAddr != c.addr ||
				got.Header.Get("Authorization") != "Bearer svc_x" || got.Header.Get("X-Forwarded-For") != "" || got.Header.Get("X-Original-Uri") != "" {
				t.Fatalf("rebuilt %s %s from %s, headers %v; want %s %s from %s", got.Method, got.URL.RequestURI(), got.RemoteAddr, got.Header, c.method, c.uri, c.addr)
			}
		})
	}
}
