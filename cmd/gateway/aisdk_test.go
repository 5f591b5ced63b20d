package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// Real AI SDK clients (aisdk-clients/, pinned in its package-lock.json and installed by
// scripts/test-deps.sh with npm ci) against the built gateway and upstream-sim: ai 5 and ai 7
// on v2 (DefaultChatTransport + readUIMessageStream), ai 4 on v1 (callChatApi, what useChat
// runs). Each gets the simulator's whole answer, sees its finish, reads the thread, and the
// gateway counts the tokens the answer reported on /metrics and in the tokens limit that
// /usage/top shows.

// aisdkClients returns the client project's directory, skipping the test when Node or the
// installed clients are missing (failing instead in CI, where test-deps.sh installs them).
func aisdkClients(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", "..", "aisdk-clients"))
	if err != nil {
		t.Fatal(err)
	}
	missing := ""
	if _, err := exec.LookPath("node"); err != nil {
		missing = "node"
	} else if _, err := os.Stat(filepath.Join(dir, "node_modules", "ai5", "package.json")); err != nil {
		missing = "aisdk-clients/node_modules"
	}
	if missing != "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s not found: scripts/test-deps.sh installs it (npm ci in aisdk-clients)", missing)
		}
		t.Skipf("%s not found: run scripts/test-deps.sh (npm ci in aisdk-clients)", missing)
	}
	return dir
}

// startSimulator builds and starts upstream-sim on a free port, stopped by PID at cleanup.
func startSimulator(t *testing.T, args ...string) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "upstream-sim")
	if out, err := exec.Command("go", "build", "-o", bin, "../upstream-sim").CombinedOutput(); err != nil {
		t.Fatalf("building upstream-sim: %v\n%s", err, out)
	}
	addr := freeAddr(t)
	cmd := exec.Command(bin, append([]string{"-listen", addr}, args...)...)
	out := newSyncBuffer()
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-done
	})
	deadline := time.Now().Add(10 * time.Second)
	for {
		res, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			res.Body.Close()
			return "http://" + addr
		}
		if time.Now().After(deadline) {
			t.Fatalf("upstream-sim not up: %v\n%s", err, out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// runNode runs a client script and returns its output lines, each a JSON object.
func runNode(t *testing.T, dir string, args ...string) []map[string]any {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", args...)
	cmd.Dir = dir
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node %v: %v\n%s%s", args, err, out, stderr.String())
	}
	var res []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("node %v printed %q: %v", args, line, err)
		}
		res = append(res, m)
	}
	return res
}

// simAnswer asks the simulator directly, on v2 with the question as the last user message,
// and returns the answer's text: what a client must read through the gateway.
func simAnswer(t *testing.T, sim, question string) string {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"fp": "direct", "messages": []any{
		map[string]any{"id": "u1", "role": "user", "parts": []any{map[string]any{"type": "text", "text": question}}}}})
	req, _ := http.NewRequest("POST", sim+"/discovery/v2/assistant/direct/message", strings.NewReader(string(body)))
	req.Header.Set("Authorization", "Bearer svc_dsc_direct")
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var text strings.Builder
	sc := bufio.NewScanner(res.Body)
	for sc.Scan() {
		var c struct{ Type, Delta string }
		if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok && json.Unmarshal([]byte(data), &c) == nil && c.Type == "text-delta" {
			text.WriteString(c.Delta)
		}
	}
	return text.String()
}

func TestAISDKClients(t *testing.T) {
	t.Parallel()
	dir := aisdkClients(t)
	sim := startSimulator(t, "-part-delay", "5ms", "-answer-parts", "4")
	p := startGateway(t, sim, `orgs:
  ai4: [ai4-docs]
  ai5: [ai5-docs]
  ai7: [ai7-docs]
limits:
  assistant_tokens_per_org: {limit: 1000000, window: month, by: org, unit: tokens}
routes:
  - name: assistant_message
    limits: [assistant_per_key, assistant_per_org, assistant_per_ip, assistant_tokens_per_org]
  - name: assistant_message_v2
    limits: [assistant_per_key, assistant_per_org, assistant_per_ip, assistant_tokens_per_org]
`)
	const question, followUp = "How do I rotate an API key?", "And with the Go SDK?"
	num := func(v any) int64 { f, _ := v.(float64); return int64(f) }
	usedTokens := func(org string) int64 {
		for _, tn := range getTop(t, p, "?limit=assistant_tokens_per_org&n=1000").Tenants {
			if tn.ID == org {
				return tn.Used
			}
		}
		return 0
	}
	waitUsed := func(org string, want int64) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for usedTokens(org) != want {
			if time.Now().After(deadline) {
				t.Fatalf("/usage/top: %s used %d tokens, want %d", org, usedTokens(org), want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	for _, pkg := range []string{"ai5", "ai7"} {
		t.Run(pkg, func(t *testing.T) {
			api := "http://" + p.public + "/discovery/v2/assistant/" + pkg + "-docs/message"
			turns := runNode(t, dir, "v2-chat.mjs", pkg, api, "svc_dsc_"+pkg+"client", "anonymous", question, followUp)
			if len(turns) != 2 {
				t.Fatalf("%d turns", len(turns))
			}
			var prompt, completion int64
			for i, turn := range turns {
				q := question
				if i == 1 {
					q = followUp
				}
				if want := simAnswer(t, sim, q); turn["text"] != want || want == "" {
					t.Fatalf("turn %d: text %q, want %q", i, turn["text"], want)
				}
				types, _ := turn["chunkTypes"].([]any)
				if len(types) == 0 || types[len(types)-1] != "finish" || turn["uiMessageStreamHeader"] != "v1" {
					t.Fatalf("turn %d: chunks %v, x-vercel-ai-ui-message-stream %v", i, types, turn["uiMessageStreamHeader"])
				}
				meta, _ := turn["metadata"].(map[string]any)
				usage, _ := meta["usage"].(map[string]any)
				thread, _ := meta["threadId"].(string)
				if !strings.HasPrefix(thread, "thread_") || usage == nil || num(usage["outputTokens"]) <= 0 {
					t.Fatalf("turn %d: metadata %v", i, meta)
				}
				if i == 0 && turn["threadHeader"] != thread {
					t.Fatalf("threadId %q in the metadata, X-Thread-Id %v", thread, turn["threadHeader"])
				}
				if i == 1 && thread != turns[0]["metadata"].(map[string]any)["threadId"] {
					t.Fatalf("the follow-up sent the thread back but got %q", thread)
				}
				prompt += num(usage["inputTokens"])
				completion += num(usage["outputTokens"])
			}
			waitUsed(pkg, prompt+completion)
			m := scrape(t, p)
			for kind, want := range map[string]int64{"prompt": prompt, "completion": completion} {
				k := fmt.Sprintf(`gateway_stream_tokens_total{kind=%q,org=%q,route="assistant_message_v2"}`, kind, pkg)
				if int64(m[k]) != want {
					t.Errorf("%s = %v, want %d", k, m[k], want)
				}
			}
		})
	}

	t.Run("ai4 on v1", func(t *testing.T) {
		api := "http://" + p.public + "/discovery/v1/assistant/ai4-docs/message"
		out := runNode(t, dir, "v1-chat.mjs", api, "svc_dsc_ai4client", "anonymous", question)[0]
		if want := simAnswer(t, sim, question); out["text"] != want {
			t.Fatalf("text %q, want %q", out["text"], want)
		}
		usage, _ := out["usage"].(map[string]any)
		thread, _ := out["threadHeader"].(string)
		if out["finishReason"] != "stop" || usage == nil || !strings.HasPrefix(thread, "thread_") || out["dataStreamHeader"] != "v1" {
			t.Fatalf("ai4 client read %v", out)
		}
		prompt, completion := num(usage["promptTokens"]), num(usage["completionTokens"])
		waitUsed("ai4", prompt+completion)
		m := scrape(t, p)
		for kind, want := range map[string]int64{"prompt": prompt, "completion": completion} {
			k := fmt.Sprintf(`gateway_stream_tokens_total{kind=%q,org="ai4",route="assistant_message"}`, kind)
			if int64(m[k]) != want {
				t.Errorf("%s = %v, want %d", k, m[k], want)
			}
		}
	})

	// Nothing was estimated: every answer reported its usage.
	for k, v := range scrape(t, p) {
		if strings.HasPrefix(k, "gateway_stream_tokens_estimated_total") && v != 0 {
			t.Errorf("%s = %v", k, v)
		}
	}
	if reqs := accessLines(p); len(reqs) != 5 {
		t.Errorf("%d access lines, want 5", len(reqs))
	}
}
