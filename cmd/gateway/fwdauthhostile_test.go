package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// hostileDoorConfig: the door believes only 127.0.0.2 (the test asks as 127.0.0.1 to be an
// untrusted peer), job_status counts 5 an hour per project, secret_status is served only
// through the door, and the tenants' usage endpoint is on (its default).
func hostileDoorConfig(upURL, fwdListen string) string {
	return fmt.Sprintf(`upstream: {url: %q}
admin_token: %q
forward_auth: {listen: %q, trusted_proxies: [127.0.0.2/32]}
`, upURL, adminToken, fwdListen) + strings.Replace(jobStatusRoute(5), "limits:\n", `  - name: secret_status
    method: GET
    path: /v2/secret/{projectId}
    key: admin
    limits: [job_status_per_project]
    forward_auth_only: true
limits:
`, 1)
}

// doorAsk asks the door at addr, from local address from, about method and uri (nginx's
// headers), with the extra headers.
func doorAsk(t *testing.T, from, addr, method, uri string, hdr map[string]string) fwdAnswer {
	t.Helper()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, a string) (net.Conn, error) { return d.DialContext(ctx, network, a) },
	}}
	defer client.CloseIdleConnections()
	req, err := http.NewRequest("GET", "http://"+addr+"/auth", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-Original-Method", method)
	req.Header.Set("X-Original-URI", uri)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	return fwdDo(t, client, req)
}

// The forward-auth door against the binary, asked the way an attacker would: nothing it
// answers 2xx may be something the public listener would refuse or answer itself, and nothing
// refused counts. A 2xx tells the proxy in front to pass the request to the platform.
func TestForwardAuthHostileRequests(t *testing.T) {
	t.Parallel()
	upURL, upCount := recordingUpstream(t)
	door := freeAddrs(t, 1)[0]
	p := startGatewayRaw(t, hostileDoorConfig(upURL, door))
	const key, trusted = "svc_hostile_door_key", "127.0.0.2"
	auth := map[string]string{"Authorization": "Bearer " + key}

	// Each is refused with the status and code given, through the door from a trusted proxy.
	for _, c := range []struct {
		name, method, uri string
		hdr               map[string]string
		status            int
		code              string
	}{
		// The gateway answers these itself: a 2xx would have nginx forward them unchecked.
		{"CORS preflight", "OPTIONS", "/discovery/v2/assistant/acme-docs/message",
			map[string]string{"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"}, 403, "forbidden"},
		{"tenants' usage endpoint", "GET", "/gateway/usage?route=job_status&projectId=p&jobId=j", auth, 403, "forbidden"},
		{"body-checked route", "POST", "/v2/agent/p/job", auth, 403, "forbidden"},
		{"dot segments", "GET", "/v2/agent/x/job/../../p/job/j", auth, 404, "not_found"},
		{"encoded dot segments", "GET", "/v2/agent/x/job/%2e%2e/%2E%2E/p/job/j", auth, 404, "not_found"},
		{"scheme-relative URI", "GET", "//evil.example/v2/agent/p/job/j", auth, 400, "invalid_request"},
		{"absolute URI", "GET", "http://evil.example/v2/agent/p/job/j", auth, 400, "invalid_request"},
		{"lower-case method", "get", "/v2/agent/p/job/j", auth, 400, "invalid_request"},
		{"HEAD on a GET route", "HEAD", "/v2/agent/p/job/j", auth, 405, "method_not_allowed"},
		{"no key", "GET", "/v2/agent/p/job/j", nil, 401, "missing_credentials"},
		{"the other family disagrees", "GET", "/v2/agent/p/job/j",
			map[string]string{"Authorization": "Bearer " + key, "X-Forwarded-Uri": "/v2/agent/other/job/j"}, 400, "invalid_request"},
	} {
		a := doorAsk(t, trusted, door, c.method, c.uri, c.hdr)
		if a.status != c.status || !strings.Contains(a.body, `"code":"`+c.code+`"`) || !strings.Contains(a.hdr.Get("X-Gateway-Error"), c.code) {
			t.Errorf("%s: %d %s (X-Gateway-Error %q); want %d %s", c.name, a.status, a.body, a.hdr.Get("X-Gateway-Error"), c.status, c.code)
		}
	}
	// An untrusted peer is refused whatever it names, and the pipeline never sees it.
	if a := doorAsk(t, "127.0.0.1", door, "GET", "/v2/agent/p/job/j", map[string]string{"Authorization": "Bearer " + key, "X-Forwarded-For": trusted}); a.status != 403 || !strings.Contains(a.body, "trusted proxies") {
		t.Errorf("untrusted peer: %d %s; want 403", a.status, a.body)
	}
	// A route served only through the door: not found on the public listener, admitted
	// through the door; a method override changes nothing (the door decides GET).
	if a := fwdGet(t, "http://"+p.public, "/v2/secret/p", key); a.status != 404 || !strings.Contains(a.body, `"not_found"`) {
		t.Errorf("forward_auth_only route on the public listener: %d %s; want 404", a.status, a.body)
	}
	override := map[string]string{"Authorization": "Bearer " + key, "X-HTTP-Method-Override": "DELETE"}
	if a := doorAsk(t, trusted, door, "GET", "/v2/secret/p?x=1", override); a.status != 200 || a.hdr.Get("RateLimit-Remaining") != "4" {
		t.Errorf("forward_auth_only route through the door: %d %s %v; want 200, 4 remaining", a.status, a.body, a.hdr)
	}
	// Nothing above counted but that one admitted request, and nothing reached the upstream.
	if u := orgUsageOf(t, p, "/usage/projects/p", "job_status_per_project"); u.Used != 1 {
		t.Errorf("project p used %d; want the 1 admitted request", u.Used)
	}
	if n := upCount(); n != 0 {
		t.Errorf("the upstream saw %d requests; the door forwards none", n)
	}
}
