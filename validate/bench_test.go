package validate

import (
	"encoding/json"
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// conversation builds a realistic assistant body: n messages alternating
// user/assistant, assistant turns with text and tool-call parts, markdown with
// code, escapes and non-ASCII text, plus context, filter and currentPath. If
// padTo > 0, message contents are lengthened until the body is about padTo
// bytes.
func conversation(n, padTo int) []byte {
	const answer = "To rotate a key, open **Settings → API keys**, click *Rotate*, then update your client:\n\n" +
		"```go\nclient := docs.New(docs.WithKey(os.Getenv(\"DOCS_KEY\")))\nif err := client.Ping(ctx); err != nil {\n\tlog.Fatal(err)\n}\n```\n\n" +
		"The old key stays valid for 24 h. Ça marche aussi avec l'API v1 — 日本語のドキュメントも参照してください。\t\"Quoted\" \\ path: C:\\\\keys\n"
	const question = "How do I rotate an API key without downtime? We run 3 replicas behind a load balancer and use the Go SDK v2.4.1."
	build := func(pad int) []byte {
		type part struct {
			Type string         `json:"type"`
			Text string         `json:"text,omitempty"`
			Name string         `json:"toolName,omitempty"`
			Args map[string]any `json:"args,omitempty"`
		}
		type message struct {
			ID      string `json:"id"`
			Role    string `json:"role"`
			Content string `json:"content"`
			Parts   []part `json:"parts,omitempty"`
			Created int64  `json:"createdAt"`
		}
		msgs := make([]message, n)
		for i := range msgs {
			m := message{ID: fmt.Sprintf("msg_%04d", i), Role: "user", Content: question, Created: 1767225600 + int64(i)}
			if i%2 == 1 {
				content := answer + strings.Repeat(answer, pad)
				m.Role, m.Content = "assistant", content
				m.Parts = []part{
					{Type: "text", Text: content},
					{Type: "tool-call", Name: "search_docs", Args: map[string]any{"query": "rotate api key", "limit": 5, "filters": map[string]any{"version": []string{"v2", "v2.4"}}}},
					{Type: "source", Text: "https://docs.example.com/guides/keys#rotation"},
				}
			}
			msgs[i] = m
		}
		body := map[string]any{
			"fp":                "3f9c2a7e-fp",
			"threadId":          "thr_01HZX7",
			"messages":          msgs,
			"retrievalPageSize": 8,
			"filter":            map[string]any{"version": "v2", "tags": []string{"sdk", "auth"}},
			"context": []map[string]any{
				{"type": "code", "value": "client := docs.New()", "elementId": "code-block-3", "path": "/guides/keys"},
				{"type": "textSelection", "value": "keys stay valid for 24 h"},
			},
			"currentPath": "/guides/keys#rotation",
		}
		out, err := json.Marshal(body)
		if err != nil {
			panic(err)
		}
		return out
	}
	body := build(0)
	for pad := 1; len(body) < padTo; pad++ {
		body = build(pad)
	}
	return body
}

func BenchmarkAssistantMessage100KiB(b *testing.B) {
	body := conversation(24, 100<<10)
	if err := AssistantMessage(body); err != nil {
		b.Fatal(err)
	}
	// Let the garbage from building the body be collected now, so a
	// background GC cycle's own bookkeeping does not show up as allocs/op.
	runtime.GC()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if err := AssistantMessage(body); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkJSON100KiB is JSON, the grammar and the duplicate rule without a schema, on the
// body of BenchmarkAssistantMessage100KiB: all of it goes through skipValue.
func BenchmarkJSON100KiB(b *testing.B) {
	body := conversation(24, 100<<10)
	if err := JSON(body); err != nil {
		b.Fatal(err)
	}
	runtime.GC() // see BenchmarkAssistantMessage100KiB
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if err := JSON(body); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAgentJob(b *testing.B) {
	body := []byte(`{"prompt":"Write a migration guide from SDK v1 to v2, with code samples for Go, Python and TypeScript.\nKeep it under 800 words.","model":"default","metadata":{"source":"docs-ui","tags":["migration","sdk"]}}`)
	if err := AgentJob(body); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if err := AgentJob(body); err != nil {
			b.Fatal(err)
		}
	}
}

// TestZeroAllocs enforces the hot-path contract outside of benchmarks, on
// bodies exercising every known field including escaped keys and values.
func TestZeroAllocs(t *testing.T) {
	big := conversation(24, 100<<10)
	escaped := []byte(`{"f\u0070":"x","messages":[{"id":"1","r\u006fle":"u","content":"\ud83d\ude00","parts":[{"typ\u0065":"t"}]}],` +
		`"retrievalPageSize":2.5e1,"currentPath":"\u00e9/p","context":[{"value":"v","type":"textS\u0065lection"}],"threadId":null,"filter":null}`)
	job := []byte(`{"pr\u006fmpt":"a","x":[1,{"y":null}]}`)
	v2 := []byte(sdkBodies[1])
	// Objects of more members than are compared one by one (sorted when they close), nested.
	wide := []byte(`{"prompt":"p","a":` + wideObject(20, false) + `,"b":{"c":` + wideObject(17, false) + `}}`)
	bounds := Bounds{Messages: 1000, PartsPerMessage: 500}
	runtime.GC() // see BenchmarkAssistantMessage100KiB
	for name, run := range map[string]func(){
		"assistant 100KiB":         func() { _ = AssistantMessage(big) },
		"assistant escaped":        func() { _ = AssistantMessage(escaped) },
		"agent job":                func() { _ = AgentJob(job) },
		"assistant v2":             func() { _ = AssistantMessageV2(v2) },
		"assistant 100KiB bounded": func() { _, _ = bounds.AssistantMessageText(big) },
		"assistant v2 bounded":     func() { _, _ = bounds.AssistantMessageV2Text(v2) },
		"wide objects":             func() { _ = AgentJob(wide) },
		"any JSON":                 func() { _ = JSON(big) },
	} {
		if a := testing.AllocsPerRun(20, run); a != 0 {
			t.Errorf("%s: %v allocs per run, want 0", name, a)
		}
	}
	if err := AssistantMessage(escaped); err != nil {
		t.Fatal(err)
	}
	if err := AgentJob(job); err != nil {
		t.Fatal(err)
	}
	if err := AssistantMessageV2(v2); err != nil {
		t.Fatal(err)
	}
	if err := AgentJob(wide); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkAssistantMessageV2 is the v2 validator on a follow-up as the AI SDK 5+ posts it
// (metadata, step-start and text parts, a file part), with the gateway's default bounds.
func BenchmarkAssistantMessageV2(b *testing.B) {
	body := []byte(sdkBodies[1])
	bounds := Bounds{Messages: 1000, PartsPerMessage: 500}
	if _, err := bounds.AssistantMessageV2Text(body); err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := bounds.AssistantMessageV2Text(body); err != nil {
			b.Fatal(err)
		}
	}
}
