package main

import (
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
)

// v2 bodies as the real clients post them (DefaultChatTransport of ai 5.0.277 and 7.0.173
// with body {fp}: a first question, a follow-up carrying the answer readUIMessageStream
// built, a regenerate) are forwarded byte for byte; broken ones are refused, 400
// invalid_body naming the field, and never reach the upstream; v1 keeps its rules and its
// invalid_request code.
func TestV2BodyRules(t *testing.T) {
	t.Parallel()
	up := newRawUpstream(t, nil)
	p := startGateway(t, up.URL, "")
	post := func(path, body string) (int, map[string]any) {
		t.Helper()
		return postJSON(t, p, path, "svc_dsc_v2rules", body)
	}
	const v1, v2 = "/discovery/v1/assistant/acme/message", "/discovery/v2/assistant/acme/message"
	user := `{"id":"u1","role":"user","parts":[{"type":"text","text":"How do I rotate a key?"}]}`
	for _, c := range []struct{ body, field string }{
		{`{"fp":"anonymous","messages":[],"id":"chat1","trigger":"submit-message"}`, "messages"},
		{`{"messages":[` + user + `]}`, "fp"},
		{`{"fp":7,"messages":[` + user + `]}`, "fp"},
		{`{"fp":"a","messages":[{"id":"u1","role":"user","content":"How do I rotate a key?"}]}`, "messages[0].parts"},
		{`{"fp":"a","messages":[` + user + `,{"role":"user","parts":[]}]}`, "messages[1].id"},
		{`{"fp":"a","messages":[{"id":"u1","role":1,"parts":[]}]}`, "messages[0].role"},
		{`{"fp":"a","messages":[{"id":"u1","role":"user","parts":[{"text":"hi"}]}]}`, "messages[0].parts[0].type"},
		{`{"fp":"a","messages":[{"id":"u1","role":"user","parts":["hi"]}]}`, "messages[0].parts[0]"},
		{`{"fp":"a","messages":[` + user + `],"threadId":5}`, "threadId"},
		{`{"fp":"a","messages":[` + user + `],"retrievalPageSize":0}`, "retrievalPageSize"},
		{`{"fp":"a","messages":[` + user + `],"filter":[]}`, "filter"},
		{`{"fp":"a","messages":[` + user + `],"context":[{"value":"x","type":"image"}]}`, "context[0].type"},
		{`{"fp":"a","messages":[` + user + `],"currentPath":"/` + strings.Repeat("x", 200) + `"}`, "currentPath"},
		{`{"fp":"a","messages":[` + user + `],"MESSAGES":[]}`, "messages"},
		{`{"fp":"a"`, ""},
	} {
		code, out := post(v2, c.body)
		if code != 400 || out["code"] != "invalid_body" || (out["field"] != c.field && !(c.field == "" && out["field"] == nil)) {
			t.Fatalf("v2 %s: %d %v, want 400 invalid_body naming %q", c.body, code, out, c.field)
		}
	}
	// v1's rules and code are unchanged: a v2 body lacks content there.
	if code, out := post(v1, `{"fp":"a","messages":[`+user+`]}`); code != 400 || out["code"] != "invalid_request" || out["field"] != "messages[0].content" {
		t.Fatalf("v1 with a v2 body: %d %v", code, out)
	}
	if code, out := post(v1, `{"fp":"","messages":[]}`); code != 400 || out["code"] != "invalid_request" || out["field"] != "fp" {
		t.Fatalf("v1 with an empty fp: %d %v", code, out)
	}
	if n, _ := up.received(); n != 0 {
		t.Fatalf("%d bytes of refused bodies reached the upstream", n)
	}
	sdk := []string{
		`{"fp":"anonymous","id":"chat1","messages":[` + user + `],"trigger":"submit-message"}`,
		`{"fp":"user-42","threadId":"thread_ab12","retrievalPageSize":5,"currentPath":"/guides/keys","id":"chat1","messages":[` + user + `,` +
			`{"id":"msg-9f2c","role":"assistant","metadata":{"threadId":"thread_ab12","usage":{"inputTokens":52,"outputTokens":61}},"parts":[{"type":"step-start"},{"type":"text","text":"Open the dashboard.","state":"done"}]},` +
			`{"id":"u2","role":"user","parts":[{"type":"text","text":"And in Go?"}]}],"trigger":"submit-message"}`,
		`{"fp":"anonymous","id":"chat1","messages":[` + user + `],"trigger":"regenerate-message","messageId":"msg-9f2c"}`,
	}
	for _, b := range sdk {
		if code, out := post(v2, b); code != 200 {
			t.Fatalf("v2 SDK body %s: %d %v", b, code, out)
		}
	}
	reqs := up.requests()
	if len(reqs) != len(sdk) {
		t.Fatalf("upstream got %d requests, want %d", len(reqs), len(sdk))
	}
	for i, r := range reqs {
		if string(r.body) != sdk[i] {
			t.Fatalf("upstream got %q, want %q", r.body, sdk[i])
		}
	}
	m := scrape(t, p)
	if got := m[`gateway_validation_rejections_total{field="messages[].parts",route="assistant_message_v2"}`]; got != 1 {
		t.Fatalf("validation rejections of messages[].parts on v2: %v", got)
	}
}

// postJSON posts a JSON body with key and returns the status and the answer decoded (nil
// when it is no JSON object).
func postJSON(t *testing.T, p *proc, path, key, body string) (int, map[string]any) {
	t.Helper()
	res, data := sendBody(t, p, path, key, body)
	var out map[string]any
	_ = json.Unmarshal([]byte(data), &out)
	return res.StatusCode, out
}

// Configs written before v2 was built in add it as a pass-through route: under its name the
// entry now adjusts the built-in route (its limits), and it gets v2's body rules; under
// another name on the same path it is a config error saying what to do.
func TestV2RouteConfigs(t *testing.T) {
	t.Parallel()
	up := newRawUpstream(t, nil)
	p := startGateway(t, up.URL, `limits:
  assistant_per_org: {limit: 1}
routes:
  - {name: assistant_message_v2, method: POST, path: "/discovery/v2/assistant/{domain}/message", key: assistant, stream: true,
     limits: [assistant_per_org]}
`)
	body := `{"fp":"a","messages":[{"id":"u1","role":"user","parts":[{"type":"text","text":"hi"}]}]}`
	for i, want := range []int{200, 429} {
		res := send(t, p, "POST", "/discovery/v2/assistant/acme/message", "svc_dsc_cfg", body)
		if res.StatusCode != want {
			t.Fatalf("request %d: %d, want %d", i, res.StatusCode, want)
		}
	}
	if res := send(t, p, "POST", "/discovery/v2/assistant/other/message", "svc_dsc_cfg", `{"fp":"a","messages":[]}`); res.StatusCode != 400 {
		t.Fatalf("a v1 body on v2: %d, want 400", res.StatusCode)
	}

	for _, c := range []struct{ cfg, want string }{
		{`routes: [{name: assistant_v2, method: POST, path: "/discovery/v2/assistant/{domain}/message", key: assistant, stream: true}]`,
			"routes[0].name: POST /discovery/v2/assistant/{domain}/message is the built-in route assistant_message_v2: name the entry assistant_message_v2"},
		{`routes: [{name: assistant_message_v2, stream: false}]`, "routes[0].stream: the built-in route assistant_message_v2 is always stream: true"},
		{`routes: [{name: assistant_message_v2, key: admin}]`, "routes[0].key: the built-in route assistant_message_v2 always takes assistant keys"},
	} {
		cmd := exec.Command(gatewayBin, "-check-config", "-config", writeConfig(t, "upstream: {url: 'http://127.0.0.1:1'}\n"+c.cfg+"\n"))
		out, err := cmd.CombinedOutput()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 2 || !strings.Contains(string(out), c.want) {
			t.Errorf("%s: %v %s, want exit 2 naming %q", c.cfg, err, out, c.want)
		}
	}
}
