package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Keys of the two families; the gateway only checks their shape.
const (
	adminKey     = "svc_benchadmin0123456789abcdef"
	assistantKey = "svc_dsc_benchpublic0123456789abcdef"
	badKey       = "nope_0123456789abcdef" // neither family: 401 invalid_credentials
)

// reqSpec is one request of a workload and the status each kind of server must answer.
type reqSpec struct {
	label        string
	method, path string
	auth, body   string
	want         map[string]int // "direct", "bare", "gateway" -> status
}

type workload struct {
	name string
	reqs []reqSpec
}

var agentJobBody = `{"prompt":"Write a migration guide from SDK v1 to v2, with code samples for Go and Python.","model":"default","metadata":{"source":"bench"}}`

// conversation is 20 messages, as a docs chat sends after a few turns.
func conversation() (roles, texts []string) {
	for i := 0; i < 20; i++ {
		role, text := "user", fmt.Sprintf("Question %d: how do I rotate an API key without downtime, and does the old key keep working for a while?", i)
		if i%2 == 1 {
			role = "assistant"
			text = fmt.Sprintf("Answer %d: create a second key on the dashboard, deploy it, then revoke the first one; both keys work until you revoke. See the API keys page for details.", i)
		}
		roles, texts = append(roles, role), append(texts, text)
	}
	return roles, texts
}

type part struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// assistantBody is the conversation as an AI SDK 4 client posts it to v1 (about 6.9 KB):
// messages with content and parts, and the platform's fields.
var assistantBody = func() string {
	type msg struct {
		ID      string `json:"id"`
		Role    string `json:"role"`
		Content string `json:"content"`
		Parts   []part `json:"parts"`
	}
	var msgs []msg
	roles, texts := conversation()
	for i := range roles {
		msgs = append(msgs, msg{ID: fmt.Sprintf("msg-%02d", i), Role: roles[i], Content: texts[i], Parts: []part{{Type: "text", Text: texts[i]}}})
	}
	return mustJSON(map[string]any{
		"fp": "anonymous", "threadId": nil, "retrievalPageSize": 5, "filter": nil,
		"currentPath": "/docs/api-keys", "context": []any{}, "messages": msgs,
	})
}()

// assistantBodyV2 is the same conversation as an AI SDK 5+ client posts it to v2
// (DefaultChatTransport: id, messages of parts, trigger; the platform's fields in its body).
var assistantBodyV2 = func() string {
	type msg struct {
		ID    string `json:"id"`
		Role  string `json:"role"`
		Parts []part `json:"parts"`
	}
	var msgs []msg
	roles, texts := conversation()
	for i := range roles {
		msgs = append(msgs, msg{ID: fmt.Sprintf("msg-%02d", i), Role: roles[i], Parts: []part{{Type: "text", Text: texts[i]}}})
	}
	return mustJSON(map[string]any{
		"fp": "anonymous", "threadId": nil, "retrievalPageSize": 5, "filter": nil,
		"currentPath": "/docs/api-keys", "context": []any{}, "id": "chat-bench", "messages": msgs, "trigger": "submit-message",
	})
}()

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return string(b)
}

var (
	agentJob = reqSpec{label: "agent_job", method: "POST", path: "/v2/agent/proj-bench/job", auth: "Bearer " + adminKey,
		body: agentJobBody, want: map[string]int{"direct": 201, "bare": 201, "gateway": 201}}
	assistantMsg = reqSpec{label: "assistant_message", method: "POST", path: "/discovery/v1/assistant/bench-docs/message", auth: "Bearer " + assistantKey,
		body: assistantBody, want: map[string]int{"direct": 200, "bare": 200, "gateway": 200}}
	assistantMsgV2 = reqSpec{label: "assistant_message_v2", method: "POST", path: "/discovery/v2/assistant/bench-docs/message", auth: "Bearer " + assistantKey,
		body: assistantBodyV2, want: map[string]int{"direct": 200, "bare": 200, "gateway": 200}}
	// The simulator accepts any bearer token on jobs, and knows no /tiny path: direct and
	// bare answer these from the upstream (201, 404); the gateway refuses them itself.
	badKeyReq = reqSpec{label: "401 bad key", method: "POST", path: "/v2/agent/proj-bench/job", auth: "Bearer " + badKey,
		body: agentJobBody, want: map[string]int{"direct": 201, "bare": 201, "gateway": 401}}
	tinyReq = reqSpec{label: "429 tiny limit", method: "POST", path: "/v2/agent/proj-bench/tiny", auth: "Bearer " + adminKey,
		body: agentJobBody, want: map[string]int{"direct": 404, "bare": 404, "gateway": 429}}
)

var allWorkloads = []workload{
	{name: "agent_job", reqs: []reqSpec{agentJob}},
	{name: "assistant_message", reqs: []reqSpec{assistantMsg}},
	{name: "assistant_message_v2", reqs: []reqSpec{assistantMsgV2}},
	{name: "401/429 mix", reqs: []reqSpec{badKeyReq, tinyReq}},
}

// wrkScript writes the wrk Lua script of a workload: static request fields for one request,
// a round-robin request() for a mix.
func wrkScript(dir string, w workload) (string, error) {
	var sb strings.Builder
	lua := func(s string) string { return "[==[" + s + "]==]" }
	if len(w.reqs) == 1 {
		r := w.reqs[0]
		fmt.Fprintf(&sb, "wrk.method = %s\nwrk.body = %s\n", lua(r.method), lua(r.body))
		fmt.Fprintf(&sb, "wrk.headers[\"Content-Type\"] = \"application/json\"\nwrk.headers[\"Authorization\"] = %s\n", lua(r.auth))
	} else {
		sb.WriteString("local reqs = {}\nlocal i = 0\ninit = function(args)\n")
		for k, r := range w.reqs {
			fmt.Fprintf(&sb, "  reqs[%d] = wrk.format(%s, %s, {[\"Content-Type\"] = \"application/json\", [\"Authorization\"] = %s}, %s)\n",
				k+1, lua(r.method), lua(r.path), lua(r.auth), lua(r.body))
		}
		fmt.Fprintf(&sb, "end\nrequest = function()\n  i = i %% %d + 1\n  return reqs[i]\nend\n", len(w.reqs))
	}
	p := filepath.Join(dir, "wrk-"+strings.NewReplacer("/", "-", " ", "-").Replace(w.name)+".lua")
	return p, os.WriteFile(p, []byte(sb.String()), 0o644)
}

// workloadNamed is the workload called name.
func workloadNamed(name string) (workload, bool) {
	for _, w := range allWorkloads {
		if w.name == name {
			return w, true
		}
	}
	return workload{}, false
}
