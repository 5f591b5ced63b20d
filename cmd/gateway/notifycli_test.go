package main

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/notify"
)

// gateway notifications test sends one signed ping that a Standard Webhooks receiver
// verifies, prints the answer, and exits by it.
func TestNotificationsTestCLI(t *testing.T) {
	t.Parallel()
	const (
		current = "whsec_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8="
		old     = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	)
	oldKeys, err := config.ParseSecrets(old)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var got []notify.Event
	recv := serveHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		// The receiver still holds the old secret only: a rotation's second signature passes.
		if err := notify.Verify(oldKeys, r.Header, body, time.Now(), 5*time.Minute); err != nil {
			t.Errorf("the ping does not verify: %v", err)
			w.WriteHeader(401)
			return
		}
		var ev notify.Event
		if err := json.Unmarshal(body, &ev); err != nil || ev.ID != r.Header.Get(notify.HeaderID) {
			t.Errorf("body %s: %v", body, err)
		}
		mu.Lock()
		got = append(got, ev)
		mu.Unlock()
		if strings.HasSuffix(r.URL.Path, "/down") {
			w.WriteHeader(503)
			io.WriteString(w, "maintenance\x1b[31m")
			return
		}
		io.WriteString(w, "thanks")
	}))
	cfg := writeConfig(t, "upstream: {url: 'http://127.0.0.1:9'}\n"+
		"notifications:\n  webhooks:\n"+
		"    - {name: billing, url: '"+recv+"/hooks', secret_env: HOOK_SECRET, allow_private_addresses: true}\n"+
		"    - {name: paging, url: '"+recv+"/down', secret: '"+old+"', allow_private_addresses: true}\n")
	env := []string{"HOOK_SECRET=" + current + " " + old}

	code, out, errOut := cliRun(t, env, "", "notifications", "test", "-config", cfg, "--endpoint", "billing")
	if code != 0 || !strings.HasPrefix(out, "billing answered 200 in ") || !strings.HasSuffix(out, "\nthanks\n") || errOut != "" {
		t.Fatalf("billing: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	code, out, _ = cliRun(t, env, "", "notifications", "test", "--endpoint", "paging", "-config", cfg)
	if code != 1 || !strings.HasPrefix(out, "paging answered 503 in ") || strings.Contains(out, "\x1b") {
		t.Fatalf("paging: exit %d, stdout %q", code, out)
	}
	mu.Lock()
	if len(got) != 2 || got[0].Type != "ping" || got[0].ID == got[1].ID || !strings.HasPrefix(got[0].ID, "evt_") {
		t.Fatalf("received %+v", got)
	}
	mu.Unlock()

	unreachable := writeConfig(t, "upstream: {url: 'http://127.0.0.1:9'}\n"+
		"notifications: {timeout: 1s, webhooks: [{name: gone, url: 'http://127.0.0.1:1/x?token=s3cret', secret: '"+old+"', allow_private_addresses: true}]}\n")
	code, out, errOut = cliRun(t, nil, "", "notifications", "test", "-config", unreachable, "--endpoint", "gone")
	if code != 1 || out != "" || !strings.HasPrefix(errOut, "gateway notifications: gone: ") || strings.Contains(errOut, "s3cret") {
		t.Fatalf("unreachable: exit %d, stdout %q, stderr %q", code, out, errOut)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"notifications", "test", "-config", cfg, "--endpoint", "nope"}, `no webhook endpoint "nope": the config names billing, paging`},
		{[]string{"notifications", "test", "-config", cfg}, "--endpoint NAME is required"},
		{[]string{"notifications", "test", "--endpoint", "billing"}, "-config FILE is required"},
		{[]string{"notifications", "send"}, `unknown command "send"`},
		{[]string{"notifications"}, "gateway notifications needs a command"},
	} {
		code, _, errOut := cliRun(t, env, "", tc.args...)
		if code != 2 || !usageLine.MatchString(errOut) || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want %q", tc.args, code, errOut, tc.want)
		}
	}
	// The secret's environment variable unset: a config error that names it, not the secret.
	code, _, errOut = cliRun(t, nil, "", "notifications", "test", "-config", cfg, "--endpoint", "paging")
	if code != 2 || !strings.Contains(errOut, "the environment variable HOOK_SECRET is not set") {
		t.Fatalf("no secret: exit %d, stderr %q", code, errOut)
	}
	code, out, _ = cliRun(t, nil, "", "help", "notifications")
	if code != 0 || !strings.Contains(out, "gateway notifications test -config FILE --endpoint NAME") {
		t.Fatalf("help: %d %q", code, out)
	}
}
