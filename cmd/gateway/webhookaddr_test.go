package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// Webhook URLs to private addresses, against the binary. A URL naming the metadata service
// or a link-local address literally is refused by -check-config and at start, naming the
// opt-in (never the URL); with allow_private_addresses it is valid. A URL whose name resolves
// to loopback passes the config (a name is only a name) and is refused when a delivery
// connects, after DNS: the running gateway's events and the test command reach the receiver
// only through the endpoint that opts in, which the start log warns about.
func TestWebhookPrivateAddressesRefused(t *testing.T) {
	t.Parallel()
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	// Ports of the system's choosing: a gateway that wrongly starts binds nothing of another's.
	base := "upstream: {url: 'http://127.0.0.1:1'}\nlisten: '127.0.0.1:0'\nadmin_listen: '127.0.0.2:0'\n"
	for target, addr := range map[string]string{
		"http://169.254.169.254/latest/meta-data/": "169.254.169.254 is a cloud metadata address",
		"http://[fe80::1]/":                        "fe80::1 is a link-local address",
	} {
		hook := func(extra string) string {
			return base + fmt.Sprintf("notifications: {webhooks: [{name: billing, url: %q, secret: %q%s}]}\n", target, secret, extra)
		}
		for _, args := range [][]string{{"-check-config"}, nil} {
			// Bounded: a gateway that accepted the URL would run until killed.
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			out, err := exec.CommandContext(ctx, gatewayBin, append(args, "-config", writeConfig(t, hook("")))...).CombinedOutput()
			cancel()
			if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), "notifications.webhooks[0].url: "+addr) ||
				!strings.Contains(string(out), "allow_private_addresses: true") || strings.Contains(string(out), "meta-data") {
				t.Errorf("%v %s: %v %s, want exit 2 naming the address and the opt-in", args, target, err, out)
			}
		}
		out, err := exec.Command(gatewayBin, "-check-config", "-config", writeConfig(t, hook(", allow_private_addresses: true"))).CombinedOutput()
		if err != nil || !strings.Contains(string(out), "is valid") {
			t.Errorf("-check-config %s with the opt-in: %v %s", target, err, out)
		}
	}

	var mu sync.Mutex
	got := map[string]int{} // path -> deliveries
	recv := serveHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got[r.URL.Path]++
		mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	count := func(path string) int { mu.Lock(); defer mu.Unlock(); return got[path] }
	u, _ := url.Parse(recv)
	_, port, _ := net.SplitHostPort(u.Host)
	byName := "http://localhost:" + port // resolves to loopback: refused when connecting
	cfg := fmt.Sprintf("admin_token: %q\n"+
		"limits:\n  assistant_per_org: {limit: 10, thresholds: [0.1]}\n"+
		"notifications:\n  max_backoff: 1s\n  webhooks:\n"+
		"    - {name: guarded, url: %q, secret: %q}\n"+
		"    - {name: relay, url: %q, secret: %q, allow_private_addresses: true}\n",
		adminToken, byName+"/guarded", secret, recv+"/relay", secret)
	up, _ := recordingUpstream(t)
	gw := startGateway(t, up, cfg)
	if !strings.Contains(gw.out.String(), "notifications.webhooks[1].allow_private_addresses is set") ||
		strings.Contains(gw.out.String(), "notifications.webhooks[0].allow_private_addresses") {
		t.Fatalf("the start log does not warn of the opt-in, or warns of the wrong endpoint:\n%s", gw.out.String())
	}
	if c := burst(t, []*proc{gw}, 1, "/discovery/v1/assistant/acme/message", "svc_dsc_n", `{"fp":"a","messages":[]}`, nil); c[201] != 1 {
		t.Fatalf("request: %v", c)
	}
	var list struct {
		Deliveries []struct {
			Endpoint  string
			LastError string `json:"last_error"`
			Attempts  int
		}
	}
	var raw string
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		raw = adminCallOK(t, gw, "GET", "/notifications?state=pending", "", 200)
		if err := json.Unmarshal([]byte(raw), &list); err != nil {
			t.Fatal(err)
		}
		if count("/relay") == 1 && len(list.Deliveries) == 1 && list.Deliveries[0].Attempts >= 1 || time.Now().After(deadline) {
			break
		}
	}
	if count("/relay") != 1 || len(list.Deliveries) != 1 || list.Deliveries[0].Endpoint != "guarded" ||
		!strings.Contains(list.Deliveries[0].LastError, "a loopback address") || !strings.Contains(list.Deliveries[0].LastError, "allow_private_addresses") {
		t.Fatalf("relay got %d deliveries; pending: %s", count("/relay"), raw)
	}

	code, out, errOut := cliRun(t, nil, "", "notifications", "test", "-config", gw.cmd.Args[2], "--endpoint", "guarded")
	if code != 1 || !strings.Contains(errOut, "a loopback address") || strings.Contains(errOut+out, port) && strings.Contains(errOut+out, "/guarded") {
		t.Fatalf("test command to guarded: exit %d %q %q", code, out, errOut)
	}
	if code, out, errOut := cliRun(t, nil, "", "notifications", "test", "-config", gw.cmd.Args[2], "--endpoint", "relay"); code != 0 || !strings.HasPrefix(out, "relay answered 204") {
		t.Fatalf("test command to relay: exit %d %q %q", code, out, errOut)
	}
	if n := count("/guarded"); n != 0 {
		t.Fatalf("the guarded endpoint got %d requests", n)
	}
}
