package admin

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// lintProblem is one finding of redocly lint --format=json.
type lintProblem struct {
	RuleID   string `json:"ruleId"`
	Severity string `json:"severity"`
	Message  string `json:"message"`
	Location []struct {
		Pointer string `json:"pointer"`
	} `json:"location"`
}

// redoclyLint runs the pinned Redocly CLI of openapi-lint/ with its recommended rules over
// the document file, offline (no telemetry, no update check), and returns its findings. It
// skips where the linter is not installed, and fails instead in CI, where
// scripts/test-deps.sh installs it.
func redoclyLint(t *testing.T, file string) []lintProblem {
	t.Helper()
	dir, err := filepath.Abs(filepath.Join("..", "openapi-lint"))
	if err != nil {
		t.Fatal(err)
	}
	cli := filepath.Join(dir, "node_modules", "@redocly", "cli", "bin", "cli.js")
	missing := ""
	if _, err := exec.LookPath("node"); err != nil {
		missing = "node"
	} else if _, err := os.Stat(cli); err != nil {
		missing = "openapi-lint/node_modules"
	}
	if missing != "" {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s not found: scripts/test-deps.sh installs it (npm ci in openapi-lint)", missing)
		}
		t.Skipf("%s not found: run scripts/test-deps.sh (npm ci in openapi-lint)", missing)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", cli, "lint", "--config", filepath.Join(dir, "redocly.yaml"), "--format=json", file)
	cmd.Env = append(os.Environ(), "REDOCLY_TELEMETRY=off", "REDOCLY_SUPPRESS_UPDATE_NOTICE=true", "REDOCLY_SUPPRESS_NOTIFICATIONS=true", "NO_COLOR=1")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var report struct {
		Totals struct {
			Errors, Warnings int
		}
		Problems []lintProblem
	}
	if jerr := json.Unmarshal(out, &report); jerr != nil {
		t.Fatalf("redocly lint: %v, %v\n%s%s", err, jerr, out, stderr.String())
	}
	if (err != nil) != (report.Totals.Errors > 0) {
		t.Fatalf("redocly lint exited %v with %d errors\n%s", err, report.Totals.Errors, stderr.String())
	}
	return report.Problems
}

// admin/openapi.json is clean under a standard linter: Redocly's recommended rules give no
// error and no warning. The same linter finds a path with a trailing slash added to a copy,
// so a clean report is the linter's verdict, not a linter that did not run.
func TestOpenAPILint(t *testing.T) {
	for _, p := range redoclyLint(t, "openapi.json") {
		where := ""
		if len(p.Location) > 0 {
			where = p.Location[0].Pointer
		}
		t.Errorf("%s %s at %s: %s", p.Severity, p.RuleID, where, p.Message)
	}

	var doc map[string]any
	if err := json.Unmarshal(openAPI, &doc); err != nil {
		t.Fatal(err)
	}
	paths := doc["paths"].(map[string]any)
	paths["/ui/"] = paths["/ui"]
	data, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	broken := filepath.Join(t.TempDir(), "openapi.json")
	if err := os.WriteFile(broken, data, 0o600); err != nil {
		t.Fatal(err)
	}
	found := false
	for _, p := range redoclyLint(t, broken) {
		found = found || p.RuleID == "no-path-trailing-slash" && p.Severity == "error"
	}
	if !found {
		t.Error("the linter did not find the path /ui/ added to a copy of the document")
	}
}
