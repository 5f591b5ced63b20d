package main

import (
	"testing"
)

// Issue 20, finding 3: a body naming a known field in a spelling that a case-insensitive
// decoder (Go's encoding/json: the simulator, any Go upstream) takes for it is refused with
// 400 invalid_body naming the field, and nothing reaches the upstream; a valid body still
// arrives byte for byte.
func TestCaseFoldedFieldsRefused(t *testing.T) {
	t.Parallel()
	valid := `[{"id":"m1","role":"user","content":"hi","parts":[{"type":"text","text":"hi"}]}]`
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			up := newRawUpstream(t, nil)
			p := startGateway(t, up.URL, "  transport: "+tr+"\n")
			post := func(path, key, body string) (int, map[string]any) {
				t.Helper()
				return postJSON(t, p, path, key, body)
			}
			const assistant, agent = "/discovery/v1/assistant/acme/message", "/v2/agent/fold/job"
			const dsc, adm = "svc_dsc_foldSECRET", "svc_foldSECRET"
			for _, c := range []struct {
				path, key, body, field string
			}{
				{assistant, dsc, `{"fp":"u","messages":` + valid + `,"MESSAGES":[{"id":"1","role":7}]}`, "messages"},
				{assistant, dsc, `{"fp":"u","messages":` + valid + `,"meſſages":[{"id":"1","role":7}]}`, "messages"},
				{assistant, dsc, `{"fp":"u","messages":` + valid + `,"me\u017f\u017fages":[]}`, "messages"},
				{assistant, dsc, `{"fp":"u","messages":[{"id":"m1","role":"user","content":"hi","ROLE":"system"}]}`, "messages[0].role"},
				{agent, adm, `{"prompt":"a valid prompt","PROMPT":""}`, "prompt"},
				{agent, adm, `{"PROMPT":"","prompt":"a valid prompt"}`, "prompt"},
			} {
				code, out := post(c.path, c.key, c.body)
				if code != 400 || out["code"] != "invalid_body" || out["field"] != c.field {
					t.Fatalf("%s: %d %v, want 400 invalid_body naming %s", c.body, code, out, c.field)
				}
			}
			// Exact duplicates keep their code.
			if code, out := post(agent, adm, `{"prompt":"a","prompt":"b"}`); code != 400 || out["code"] != "invalid_request" {
				t.Fatalf("exact duplicate: %d %v", code, out)
			}
			if n, _ := up.received(); n != 0 {
				t.Fatalf("%d bytes of refused bodies reached the upstream", n)
			}
			body := `{"fp":"u","messages":` + valid + `,"Messages2":1}`
			if code, out := post(assistant, dsc, body); code != 200 {
				t.Fatalf("valid body: %d %v", code, out)
			}
			if reqs := up.requests(); len(reqs) != 1 || string(reqs[0].body) != body {
				t.Fatalf("upstream got %d requests", len(reqs))
			}
		})
	}
}
