package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/docsgate/gateway/auth"
)

// conversation builds an assistant body of n messages with parts parts each: v1 messages
// carry an empty content, v2 messages none; every string empty when empty.
func conversation(v2 bool, n, parts int, empty bool) string {
	text := "hi"
	if empty {
		text = ""
	}
	var b strings.Builder
	b.WriteString(`{"fp":"f","messages":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `{"id":"%s","role":"%s"`, text, text)
		if !v2 {
			fmt.Fprintf(&b, `,"content":"%s"`, text)
		}
		if parts > 0 || v2 {
			b.WriteString(`,"parts":[`)
			for j := range parts {
				if j > 0 {
					b.WriteByte(',')
				}
				fmt.Fprintf(&b, `{"type":"text","text":"%s"}`, text)
			}
			b.WriteByte(']')
		}
		b.WriteByte('}')
	}
	b.WriteString(`]}`)
	return b.String()
}

type bodyAnswer struct {
	status             int
	Error, Code, Field string
}

func postBody(t *testing.T, p *proc, path, key, body string) bodyAnswer {
	t.Helper()
	res, data := sendBody(t, p, path, key, body)
	a := bodyAnswer{status: res.StatusCode}
	_ = json.Unmarshal([]byte(data), &a)
	return a
}

const (
	v1Path = "/discovery/v1/assistant/acme/message"
	v2Path = "/discovery/v2/assistant/acme/message"
)

// The conversations of the issue, against the binary with the default bounds: v1 with
// 20,000 messages, v2 with 15,000, one v2 message of 30,000 parts, 30,000 empty messages. Each
// is refused, 400 naming the field, and never reaches the upstream; 1000 messages and 500
// parts a message pass. A reload changes the bounds (0 lifts one), and a bound on a route
// whose body holds no conversation, or a negative one, is a config error.
func TestConversationBounds(t *testing.T) {
	t.Parallel()
	up, forwarded := recordingUpstream(t)
	p := startGateway(t, up, fmt.Sprintf("admin_token: %q\n", adminToken))
	refused := []struct {
		name, path, body, code, field, msg string
	}{
		{"v1, 20,000 messages", v1Path, conversation(false, 20_000, 0, false), "invalid_request", "messages", "messages must hold at most 1000 messages"},
		{"v2, 15,000 messages", v2Path, conversation(true, 15_000, 0, false), "invalid_body", "messages", "messages must hold at most 1000 messages"},
		{"v2, a message of 30,000 parts", v2Path, conversation(true, 1, 30_000, false), "invalid_body", "messages[0].parts", "messages[0].parts must hold at most 500 parts"},
		{"v1, 30,000 empty messages", v1Path, conversation(false, 30_000, 0, true), "invalid_request", "messages", "messages must hold at most 1000 messages"},
		{"v2, 30,000 empty messages", v2Path, conversation(true, 30_000, 0, true), "invalid_body", "messages", "messages must hold at most 1000 messages"},
	}
	for _, c := range refused {
		if len(c.body) > 1<<20 {
			t.Fatalf("%s: %d bytes, past max_body_bytes: the bound would not be what refuses it", c.name, len(c.body))
		}
		a := postBody(t, p, c.path, "svc_dsc_bounds", c.body)
		if a.status != 400 || a.Code != c.code || a.Field != c.field || !strings.Contains(a.Error, c.msg) {
			t.Errorf("%s: %+v, want 400 %s naming %s", c.name, a, c.code, c.field)
		}
	}
	if n := forwarded(); n != 0 {
		t.Fatalf("%d refused bodies reached the upstream", n)
	}
	for _, c := range []struct{ path, body string }{
		{v1Path, conversation(false, 1000, 0, false)},
		{v1Path, conversation(false, 1, 500, false)},
		{v2Path, conversation(true, 1000, 1, false)},
		{v2Path, conversation(true, 2, 500, false)},
	} {
		if a := postBody(t, p, c.path, "svc_dsc_bounds", c.body); a.status != 201 {
			t.Errorf("%s at the bounds (%d bytes): %+v", c.path, len(c.body), a)
		}
	}
	if n := forwarded(); n != 4 {
		t.Fatalf("%d bodies at the bounds reached the upstream, want 4", n)
	}

	cfg := p.cmd.Args[2]
	good, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	reload := func(extra string) adminAnswer {
		t.Helper()
		if err := os.WriteFile(cfg, append(append([]byte{}, good...), extra...), 0o600); err != nil {
			t.Fatal(err)
		}
		return adminCall(t, http.DefaultClient, "http://"+p.admin, "POST", "/reload", map[string]string{"Authorization": "Bearer " + adminToken}, "")
	}
	if a := reload("routes:\n  - {name: assistant_message, max_messages: 0}\n  - {name: assistant_message_v2, max_messages: 3, max_parts_per_message: 2}\n"); a.status != 200 {
		t.Fatalf("reload: %d %s", a.status, a.body)
	}
	if a := postBody(t, p, v1Path, "svc_dsc_bounds", conversation(false, 20_000, 0, false)); a.status != 201 {
		t.Errorf("v1 without a bound on messages: %+v", a)
	}
	if a := postBody(t, p, v1Path, "svc_dsc_bounds", conversation(false, 1, 501, false)); a.status != 400 || a.Field != "messages[0].parts" {
		t.Errorf("v1 keeps its default bound on parts: %+v", a)
	}
	if a := postBody(t, p, v2Path, "svc_dsc_bounds", conversation(true, 4, 0, false)); a.status != 400 || a.Error != "Invalid request: messages must hold at most 3 messages." {
		t.Errorf("v2 with max_messages 3: %+v", a)
	}
	if a := postBody(t, p, v2Path, "svc_dsc_bounds", conversation(true, 3, 3, false)); a.status != 400 || a.Field != "messages[0].parts" {
		t.Errorf("v2 with max_parts_per_message 2: %+v", a)
	}

	for extra, want := range map[string]string{
		"routes: [{name: agent_job, max_messages: 10}]\n":                                             "routes[0].max_messages: applies only to the assistant routes",
		"routes: [{name: extra, method: POST, path: /x, key: assistant, max_parts_per_message: 5}]\n": "routes[0].max_parts_per_message: applies only to the assistant routes",
		"routes: [{name: assistant_message_v2, max_messages: -1}]\n":                                  "routes[0].max_messages: must not be negative",
	} {
		out, err := exec.Command(gatewayBin, "-check-config", "-config", writeConfig(t, "upstream: {url: 'http://127.0.0.1:1'}\n"+extra)).CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), want) {
			t.Errorf("-check-config %q: %v %s, want %q", extra, err, out, want)
		}
		if a := reload(extra); a.status != 422 || !strings.Contains(a.body, want) {
			t.Errorf("reload %q: %d %s", extra, a.status, a.body)
		}
	}
}

// A member named twice, at any depth, on every route and in every JSON body of the admin
// listener, against the binary: 400 naming it, nothing forwarded, nothing done. On the
// public routes the error names the object that holds it; on the admin listener "field"
// names the member.
func TestDuplicateMembersAgainstBinary(t *testing.T) {
	t.Parallel()
	up, forwarded := recordingUpstream(t)
	var gone atomic.Bool
	gone.Store(true)
	hook := serveHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if gone.Load() {
			w.WriteHeader(http.StatusGone)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	keys := filepath.Join(t.TempDir(), "keys.yaml")
	p := startGateway(t, up, fmt.Sprintf("admin_token: %q\nauth: {mode: registry, keys_file: %q}\n"+
		"limits:\n  agent_job_per_project: {limit: 1, thresholds: [1.0]}\n"+
		"notifications:\n  webhooks:\n    - {name: billing, url: %q, secret: whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw, allow_private_addresses: true}\n",
		adminToken, keys, hook+"/hooks"))
	admin := func(method, path, body string) bodyAnswer {
		t.Helper()
		a := adminCall(t, http.DefaultClient, "http://"+p.admin, method, path,
			map[string]string{"Authorization": "Bearer " + adminToken, "Content-Type": "application/json"}, body)
		b := bodyAnswer{status: a.status}
		_ = json.Unmarshal([]byte(a.body), &b)
		return b
	}
	adminKey, asstKey := "svc_"+secretSuffix(t), "svc_dsc_"+secretSuffix(t)
	for kind, key := range map[string]string{"admin": adminKey, "assistant": asstKey} {
		grant := `"projects":["p1"]`
		if kind == "assistant" {
			grant = `"domains":["acme"]`
		}
		if a := admin("POST", "/keys", `{"key":"`+key+`","kind":"`+kind+`","org":"acme",`+grant+`}`); a.status != 201 {
			t.Fatalf("registering the %s key: %+v", kind, a)
		}
	}

	v2msg := `{"id":"1","role":"user","parts":[{"type":"text","text":"hi"}]}`
	public := []struct {
		name, path, key, body, code, field, member string
	}{
		{"agent job, top level", "/v2/agent/p1/job", adminKey, `{"prompt":"p","model":"a","model":"b"}`, "invalid_request", "", "model"},
		{"agent job, nested", "/v2/agent/p1/job", adminKey, `{"prompt":"p","metadata":{"source":"a","source":"b"}}`, "invalid_request", "", "source"},
		{"v1, top level", v1Path, asstKey, `{"fp":"f","messages":[],"trigger":"a","trigger":"b"}`, "invalid_request", "", "trigger"},
		{"v1, in a message", v1Path, asstKey, `{"fp":"f","messages":[{"id":"1","role":"user","content":"c","x":1,"x":2}]}`, "invalid_request", "messages[0]", "x"},
		{"v1, in filter", v1Path, asstKey, `{"fp":"f","messages":[],"filter":{"version":"v1","version":"v2"}}`, "invalid_request", "filter", "version"},
		{"v2, top level", v2Path, asstKey, `{"fp":"f","messages":[` + v2msg + `],"messageId":"a","m\u0065ssageId":"b"}`, "invalid_body", "", "messageId"},
		{"v2, in a part", v2Path, asstKey, `{"fp":"f","messages":[{"id":"1","role":"user","parts":[{"type":"text","text":"a","text":"b"}]}]}`, "invalid_body", "messages[0].parts[0]", "text"},
		{"v2, deep in metadata", v2Path, asstKey, `{"fp":"f","messages":[{"id":"1","role":"user","metadata":{"u":[{"k":1,"k":2}]},"parts":[]}]}`, "invalid_body", "messages[0]", "k"},
	}
	for _, c := range public {
		a := postBody(t, p, c.path, c.key, c.body)
		want := fmt.Sprintf("has a duplicate member %q", c.member)
		if a.status != 400 || a.Code != c.code || a.Field != c.field || !strings.Contains(a.Error, want) {
			t.Errorf("%s: %+v, want 400 %s naming %q and %q", c.name, a, c.code, c.field, c.member)
		}
	}
	if n := forwarded(); n != 0 {
		t.Fatalf("%d bodies with a duplicate member reached the upstream", n)
	}
	if a := postBody(t, p, v2Path, asstKey, `{"fp":"f","messages":[`+v2msg+`,`+v2msg+`],"metadata":{"text":1}}`); a.status != 201 {
		t.Fatalf("the same names in different objects: %+v", a)
	}

	// Two dead letters to drop: the project's threshold and its exhaustion.
	if c := burst(t, []*proc{p}, 2, "/v2/agent/p1/job", adminKey, `{"prompt":"p"}`, nil); c[201] != 1 || c[429] != 1 {
		t.Fatalf("burst: %v", c)
	}
	var list struct {
		Dead       int
		Deliveries []struct{ Key string }
	}
	for deadline := time.Now().Add(10 * time.Second); list.Dead != 2; time.Sleep(50 * time.Millisecond) {
		a := adminCall(t, http.DefaultClient, "http://"+p.admin, "GET", "/notifications", map[string]string{"Authorization": "Bearer " + adminToken}, "")
		if err := json.Unmarshal([]byte(a.body), &list); err != nil || time.Now().After(deadline) {
			t.Fatalf("dead letters: %v %s", err, a.body)
		}
	}
	dead := `["` + list.Deliveries[0].Key + `","` + list.Deliveries[1].Key + `"]`
	digest := auth.Digest("svc_" + secretSuffix(t))
	grant := `{"limit":"agent_job_per_project","id":"p1","reason":"r","amount":1`
	for _, c := range []struct{ method, path, body, field string }{
		{"POST", "/notifications/drop", `{"keys":["evt_nope/billing"],"keys":` + dead + `}`, "keys"},
		{"POST", "/notifications/retry", `{"keys":` + dead + `,"keys":["evt_nope/billing"]}`, "keys"},
		{"POST", "/quota/grants", grant + `,"amount":1000000}`, "amount"},
		{"PUT", "/quota/overrides/agent_job_per_project/p1", `{"limit":0,"ttl":"1h","reason":"r","limit":1000000}`, "limit"},
		{"POST", "/quota/resets", `{"limit":"agent_job_per_project","id":"p2","reason":"r","id":"p1"}`, "id"},
		{"POST", "/keys", `{"digest":"` + digest + `","kind":"admin","org":"acme","projects":["p1"],"projects":["*"]}`, "projects"},
		{"POST", "/usage/key", `{"key":"` + asstKey + `","key":"` + adminKey + `"}`, "key"},
	} {
		a := admin(c.method, c.path, c.body)
		if a.status != 400 || a.Code != "invalid_request" || a.Field != c.field || a.Error != `Invalid "`+c.field+`": given twice: send each member once.` {
			t.Errorf("%s %s: %+v, want 400 naming %s", c.method, c.path, a, c.field)
		}
	}
	// Nothing was done: both dead letters are there, no quota action, no key.
	a := adminCall(t, http.DefaultClient, "http://"+p.admin, "GET", "/notifications", map[string]string{"Authorization": "Bearer " + adminToken}, "")
	if err := json.Unmarshal([]byte(a.body), &list); err != nil || list.Dead != 2 {
		t.Fatalf("after the refusals: %s", a.body)
	}
	if a := adminCall(t, http.DefaultClient, "http://"+p.admin, "GET", "/quota/audit", map[string]string{"Authorization": "Bearer " + adminToken}, ""); a.status != 200 || strings.Contains(a.body, `"action"`) {
		t.Fatalf("the audit trail after the refusals: %d %s", a.status, a.body)
	}
	if a := adminCall(t, http.DefaultClient, "http://"+p.admin, "GET", "/keys", map[string]string{"Authorization": "Bearer " + adminToken}, ""); strings.Contains(a.body, digest) {
		t.Fatalf("the refused key was registered: %s", a.body)
	}
}
