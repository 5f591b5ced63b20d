package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A keys file whose revocation is a bare date: the key is refused (401) by the binary from
// that date on, and one revoked at a date to come still works.
func TestKeysFileDateOnlyRevocation(t *testing.T) {
	t.Parallel()
	up, _ := recordingUpstream(t)
	keys := filepath.Join(t.TempDir(), "keys.yaml")
	const gone, later = "svc_dsc_revokedbydate0001", "svc_dsc_revokedlater00001"
	body := fmt.Sprintf("keys:\n"+
		"  - {digest: %s, kind: assistant, org: acme, domains: [acme-docs], created: 2025-01-02, revoked: 2025-06-01}\n"+
		"  - {digest: %s, kind: assistant, org: acme, domains: [acme-docs], created: '2025-01-02', revoked: '2099-01-01'}\n",
		sha256hex(gone), sha256hex(later))
	if err := os.WriteFile(keys, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startGateway(t, up, fmt.Sprintf("auth:\n  mode: registry\n  keys_file: %q\n", keys))
	asst := `{"fp":"a","messages":[]}`
	if res := send(t, p, "POST", "/discovery/v1/assistant/acme-docs/message", gone, asst); res.StatusCode != 401 {
		t.Fatalf("key revoked on 2025-06-01: %d", res.StatusCode)
	}
	if res := send(t, p, "POST", "/discovery/v1/assistant/acme-docs/message", later, asst); res.StatusCode != 201 {
		t.Fatalf("key revoked only on 2099-01-01: %d", res.StatusCode)
	}
}

// -dev (and make demo) print the in-process store's warning as a plain line: stack traces are
// for errors only.
func TestDevWarningHasNoStackTrace(t *testing.T) {
	t.Parallel()
	up, _ := recordingUpstream(t)
	p := startGateway(t, up, "", "-dev")
	out := p.out.String()
	if !strings.Contains(out, "redis.addrs is empty") {
		t.Fatalf("no warning about the in-process store:\n%s", out)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "\t") || strings.HasPrefix(line, "main.") || strings.Contains(line, "goroutine ") {
			t.Fatalf("a stack trace in the -dev output:\n%s", out)
		}
	}
}
