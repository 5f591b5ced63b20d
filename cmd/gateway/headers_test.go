package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// Issue 20, finding 4: the headers the upstream receives are the headers the gateway checked.
// Each test reads the exact bytes a raw-socket upstream received, on both upstream transports.

// projectUsed reads what agent_job_per_project has counted for project on the admin listener.
func projectUsed(t *testing.T, p *proc, project string) int64 {
	t.Helper()
	res, err := http.Get("http://" + p.admin + "/usage/projects/" + project)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var u struct {
		Limits []struct {
			Name string
			Used int64
		}
	}
	if err := json.NewDecoder(res.Body).Decode(&u); err != nil {
		t.Fatal(err)
	}
	for _, l := range u.Limits {
		if l.Name == "agent_job_per_project" {
			return l.Used
		}
	}
	t.Fatalf("no agent_job_per_project in %+v", u)
	return 0
}

const hopBody = `{"prompt":"hop by hop"}`

// hopReq is an agent job for project with a valid key and body, plus the extra header lines.
func hopReq(project string, extra ...string) string {
	h := "POST /v2/agent/" + project + "/job HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer svc_hopSECRET\r\n" +
		"Content-Type: application/json\r\nContent-Length: " + fmt.Sprint(len(hopBody)) + "\r\n"
	for _, e := range extra {
		h += e + "\r\n"
	}
	return h + "Connection: close\r\n\r\n" + hopBody
}

func TestConnectionNamedHeaders(t *testing.T) {
	t.Parallel()
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			up := newRawUpstream(t, nil)
			p := startGateway(t, up.URL, "  transport: "+tr+"\n")

			// Named in Connection, the key and the content type are this hop's only: the
			// gateway checks without them, as the upstream would have received the request.
			r := rawExchange(t, p.public, 5*time.Second, 0, []byte(hopReq("hop1", "Connection: keep-alive, Authorization, Content-Type")))
			if r.status() != 401 || !strings.Contains(r.data, `"code":"missing_credentials"`) {
				t.Fatalf("Connection naming Authorization: %.300q", r.data)
			}
			r = rawExchange(t, p.public, 5*time.Second, 0, []byte(hopReq("hop1", "Connection: Content-Type")))
			if r.status() != 415 {
				t.Fatalf("Connection naming Content-Type: %.300q", r.data)
			}
			if n, _ := up.received(); n != 0 {
				t.Fatalf("%d bytes reached the upstream", n)
			}
			if used := projectUsed(t, p, "hop1"); used != 0 {
				t.Fatalf("refused requests counted: %d", used)
			}

			// Connection naming headers the gateway does not use: they go, the rest arrives.
			r = rawExchange(t, p.public, 5*time.Second, 0, []byte(hopReq("hop2", "Connection: keep-alive, X-Hop-Only", "X-Hop-Only: 1",
				"Keep-Alive: timeout=5", "X-Request-ID: client-chosen-id", "X-End-To-End: kept")))
			if r.status() != 201 {
				t.Fatalf("forwarded request: %.300q", r.data)
			}
			reqs := up.requests()
			if len(reqs) != 1 {
				t.Fatalf("%d requests upstream", len(reqs))
			}
			got := reqs[0]
			for _, want := range []string{"Authorization: Bearer svc_hopSECRET\r\n", "Content-Type: application/json\r\n",
				"X-End-To-End: kept\r\n", "X-Request-Id: client-chosen-id\r\n"} {
				if !strings.Contains(got.head(), want) {
					t.Errorf("upstream head lacks %q:\n%s", want, got.head())
				}
			}
			for _, gone := range []string{"X-Hop-Only", "Keep-Alive"} {
				if got.hasHeader(gone) {
					t.Errorf("upstream received %s:\n%s", gone, got.head())
				}
			}
			if string(got.body) != hopBody {
				t.Errorf("upstream body %q", got.body)
			}
		})
	}
}

func TestClientIdentityHeadersRemoved(t *testing.T) {
	t.Parallel()
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			up := newRawUpstream(t, nil)
			p := startGateway(t, up.URL, "  transport: "+tr+"\n")
			spoofed := []string{"X-Real-IP: 203.0.113.7", "True-Client-IP: 203.0.113.7", "Forwarded: for=203.0.113.7",
				"X-Client-IP: 203.0.113.7", "CF-Connecting-IP: 203.0.113.7", "Fastly-Client-IP: 203.0.113.7",
				"X-Cluster-Client-IP: 203.0.113.7", "X_Real_IP: 203.0.113.7", "X_Forwarded_For: 203.0.113.7",
				"X-Forwarded-For: 203.0.113.7"}
			r := rawExchange(t, p.public, 5*time.Second, 0, []byte(hopReq("ident", spoofed...)))
			if r.status() != 201 {
				t.Fatalf("%.300q", r.data)
			}
			reqs := up.requests()
			if len(reqs) != 1 {
				t.Fatalf("%d requests upstream", len(reqs))
			}
			head := reqs[0].head()
			if strings.Contains(head, "203.0.113.7") {
				t.Fatalf("a client-sent address reached the upstream:\n%s", head)
			}
			// One address header left: the gateway's X-Forwarded-For, the TCP peer.
			if n := strings.Count(strings.ToLower(head), "x-forwarded-for: "); n != 1 || !strings.Contains(head, "X-Forwarded-For: 127.0.0.1\r\n") {
				t.Fatalf("X-Forwarded-For lines %d:\n%s", n, head)
			}
		})
	}
}

func TestUpgradeRefused(t *testing.T) {
	t.Parallel()
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			t.Parallel() // each transport its own upstream and gateway; most of it waits for closes
			up := newRawUpstream(t, nil)
			p := startGateway(t, up.URL, "  transport: "+tr+"\n")
			assistant := func(extra string) string {
				body := `{"fp":"u","messages":[]}`
				return "POST /discovery/v1/assistant/acme/message HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer svc_dsc_upSECRET\r\n" +
					"Content-Type: application/json\r\nOrigin: https://docs.example.com\r\n" + extra +
					fmt.Sprintf("Content-Length: %d\r\n\r\n%s", len(body), body)
			}
			for _, c := range []struct{ name, req string }{
				{"websocket", hopReq("up", "Connection: Upgrade", "Upgrade: websocket", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Version: 13")},
				{"h2c", hopReq("up", "Connection: Upgrade, HTTP2-Settings", "Upgrade: h2c", "HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA")},
				{"upgrade without Connection", hopReq("up", "Upgrade: websocket")},
				{"websocket on the stream route", assistant("Connection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n")},
			} {
				r := rawExchange(t, p.public, 5*time.Second, 0, []byte(c.req))
				if r.status() != 400 || !strings.Contains(r.data, `"code":"upgrade_not_supported"`) {
					t.Fatalf("%s: %.400q", c.name, r.data)
				}
			}
			if n, conns := up.received(); n != 0 || conns != 0 {
				t.Fatalf("the upstream received %d bytes on %d connections", n, conns)
			}
			if used := projectUsed(t, p, "up"); used != 0 {
				t.Fatalf("refused upgrades counted: %d", used)
			}
		})
	}
}

func TestExpectContinueAnsweredAtTheGateway(t *testing.T) {
	t.Parallel()
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			up := newRawUpstream(t, nil)
			p := startGateway(t, up.URL, "  transport: "+tr+"\n")
			rc := dialRaw(t, p.public)
			head := strings.TrimSuffix(hopReq("expect", "Expect: 100-continue"), hopBody)
			rc.write(head)
			if res, _ := rc.read(); res.StatusCode != 100 {
				t.Fatalf("first answer %d, want 100 Continue from the gateway", res.StatusCode)
			}
			rc.write(hopBody)
			if res, data := rc.read(); res.StatusCode != 201 {
				t.Fatalf("%d %s", res.StatusCode, data)
			}
			reqs := up.requests()
			if len(reqs) != 1 {
				t.Fatalf("%d requests upstream", len(reqs))
			}
			if reqs[0].hasHeader("Expect") || string(reqs[0].body) != hopBody {
				t.Fatalf("upstream received:\n%q", reqs[0].raw)
			}
			_, _ = io.Copy(io.Discard, rc.br)
		})
	}
}
