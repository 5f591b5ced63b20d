package docs

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/policy"
)

// The answer of GET /gateway/usage that the public API page shows lists what the shipped
// config's assistant_message_v2 would list in registry mode: its enforced limits in the
// route's order, never a shadow one (the endpoint leaves those out).
func TestSelfUsageExampleMatchesTheShippedConfig(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(root, "docs", "reference", "public-api.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(data), "A registered key's answer (registry mode")
	if !ok {
		t.Fatal("public-api.md: no registered key's answer")
	}
	_, block, _ := strings.Cut(after, "```json\n")
	block, _, _ = strings.Cut(block, "```\n")
	var answer struct {
		Route  string
		Limits []struct{ Name string }
	}
	if err := json.Unmarshal([]byte(block), &answer); err != nil {
		t.Fatalf("the example does not parse: %v\n%s", err, block)
	}
	var shown []string
	for _, l := range answer.Limits {
		shown = append(shown, l.Name)
	}

	cfg, err := config.Load(filepath.Join(root, "config.example.yaml"), nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Auth.Mode, cfg.Auth.KeysFile = "registry", "keys.yaml"
	p, err := policy.Compile(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, r := range p.Routes() {
		if r.Name != answer.Route {
			continue
		}
		for _, l := range r.Limits("").Limits {
			if !l.Shadow {
				want = append(want, l.Rule.Name)
			}
		}
	}
	if len(want) == 0 || !slices.Equal(shown, want) {
		t.Errorf("the example of %s lists %v; the shipped config shows %v", answer.Route, shown, want)
	}
}

// Every "Node N or later" of the docs and scripts is the highest Node the pinned AI SDK
// clients declare (engines.node in aisdk-clients/package-lock.json): a newcomer who follows
// the docs gets no EBADENGINE warning from npm ci.
func TestNodeVersionIsTheClientsOwn(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(root, "aisdk-clients", "package-lock.json"))
	if err != nil {
		t.Fatal(err)
	}
	var lock struct {
		Packages map[string]struct {
			Engines map[string]string `json:"engines"`
		} `json:"packages"`
	}
	if err := json.Unmarshal(data, &lock); err != nil {
		t.Fatal(err)
	}
	floor := regexp.MustCompile(`^>=\s*(\d+)`)
	need := 0
	for _, p := range lock.Packages {
		if m := floor.FindStringSubmatch(p.Engines["node"]); m != nil {
			if n, _ := strconv.Atoi(m[1]); n > need {
				need = n
			}
		}
	}
	if need == 0 {
		t.Fatal("no package of the lock file declares a Node version")
	}
	said := regexp.MustCompile(`Node (\d+) or later`)
	files := append(markdownFiles(t), filepath.Join(root, "scripts", "demo.sh"), filepath.Join(root, "scripts", "test-deps.sh"))
	found := 0
	for _, f := range files {
		text, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range said.FindAllStringSubmatch(string(text), -1) {
			found++
			if n, _ := strconv.Atoi(m[1]); n != need {
				t.Errorf("%s says %q; the pinned clients need Node %d", f, m[0], need)
			}
		}
	}
	if found == 0 {
		t.Error("no page says which Node the AI SDK clients need")
	}
}

// The README's own-limits example is a valid config in which every limit it defines is
// applied (no warning of an unused one), and it applies what it says.
func TestReadmeLimitsExample(t *testing.T) {
	block := readmeBlock(t, "## Your own limits", "yaml")
	cfg, err := config.Parse(strings.NewReader("upstream: {url: 'http://127.0.0.1:9000'}\n"+block), nil)
	if err != nil {
		t.Fatalf("the README's limits example is not a valid config: %v\n%s", err, block)
	}
	if unused := policy.Unused(cfg); len(unused) > 0 {
		t.Errorf("the README's limits example defines limits nothing applies: %v", unused)
	}
	p, err := policy.Compile(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	applied := map[string]string{}
	for _, r := range p.Routes() {
		for _, l := range r.Limits("").Limits {
			applied[r.Name] += l.Rule.Name + ";" + strconv.FormatInt(l.Rule.Limit, 10) + "/" + l.Rule.Window.String() + " "
		}
	}
	for route, want := range map[string]string{"agent_job": "agent_job_per_project;20/1m0s ", "agent_job_status": "status_reads_per_key;1000/hour "} {
		if applied[route] != want {
			t.Errorf("%s applies %q, want %q", route, applied[route], want)
		}
	}
}
