package main

import (
	"crypto/rand"
	"encoding/base64"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// A webhook secret, an API key or the admin token pasted where a name or a value was
// expected never comes back, against the binary: not from -check-config, not in the exit
// message of a start, not in POST /reload's 422, not in the reload-rejected log line, not on
// the usage page. Each message still names the key.
func TestConfigErrorsMaskPastedSecrets(t *testing.T) {
	t.Parallel()
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		t.Fatal(err)
	}
	hook := "whsec_" + base64.StdEncoding.EncodeToString(raw)
	key := "svc_" + secretSuffix(t)
	const token = "pasted-admin-token-4c1d9e0b7a"
	webhook := func(fields string) string {
		return "notifications: {webhooks: [{name: h, url: 'https://hooks.example.com/x', " + fields + "}]}\n"
	}
	cases := []struct{ broken, key, secret string }{
		{webhook("secret_env: '" + hook + "'"), "notifications.webhooks[0].secret_env", hook},
		{webhook("secret_file: '" + hook + "'"), "notifications.webhooks[0].secret_file", hook},
		{webhook("secret_env: HOOK_SECRET, events: ['" + hook + "']"), "notifications.webhooks[0].events[0]", hook},
		{"notifications: {timeout: '" + hook + "'}\n", "notifications.timeout", hook},
		{"limits: {agent_job_per_project: {by: " + key + "}}\n", "limits.agent_job_per_project.by", key},
		{"log: {level: " + token + "}\n", "log.level", token},
		// Refused when the routes are compiled (ServeMux's conflict), after the file decoded.
		{"routes: [{name: a, method: GET, path: '/k/" + key + "', key: admin}, {name: b, method: GET, path: '/k/" + key + "', key: admin}]\n", "routes[1].path", key},
	}
	leaks := func(out, secret string) bool {
		return strings.Contains(out, secret) || strings.Contains(out, secret[len(secret)-16:])
	}
	base := "upstream: {url: 'http://127.0.0.1:1'}\nadmin_token: " + token + "\n"
	for _, c := range cases {
		for _, args := range [][]string{{"-check-config"}, nil} {
			cmd := exec.Command(gatewayBin, append(args, "-config", writeConfig(t, base+c.broken))...)
			cmd.Env = append(os.Environ(), "HOOK_SECRET="+hook)
			out, err := cmd.CombinedOutput()
			if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || leaks(string(out), c.secret) ||
				!strings.Contains(string(out), c.key) || !strings.Contains(string(out), "REDACTED") {
				t.Errorf("%v %q: %v %s, want exit 2 naming %s with the secret masked", args, c.broken, err, out, c.key)
			}
		}
	}

	up, _ := recordingUpstream(t)
	p := startGateway(t, up, "admin_token: "+token+"\n")
	cfg := p.cmd.Args[2]
	good, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	auth := map[string]string{"Authorization": "Bearer " + token}
	for _, c := range cases {
		// The running admin token is masked even when the new file lacks it.
		body := strings.Replace(string(good), "admin_token: "+token+"\n", "", 1) + c.broken
		if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		a := adminCall(t, http.DefaultClient, "http://"+p.admin, "POST", "/reload", auth, "")
		if a.status != 422 || a.code != "reload_rejected" || leaks(a.body, c.secret) || !strings.Contains(a.body, c.key) || !strings.Contains(a.body, "REDACTED") {
			t.Errorf("reload of %q: %d %s", c.broken, a.status, a.body)
		}
		page := adminCall(t, http.DefaultClient, "http://"+p.admin, "GET", "/ui/", auth, "")
		if page.status != 200 || leaks(page.body, c.secret) {
			t.Errorf("usage page after %q: %d, holds the secret: %t", c.broken, page.status, leaks(page.body, c.secret))
		}
	}
	out := p.out.String()
	if n := strings.Count(out, "reload rejected"); n != len(cases) {
		t.Fatalf("%d reload-rejected lines, want %d:\n%s", n, len(cases), out)
	}
	for _, c := range cases {
		if leaks(out, c.secret) {
			t.Errorf("the log repeats the secret of %q", c.broken)
		}
	}
}
