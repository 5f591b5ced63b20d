package docs

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// goPackage is what go list says of one of the module's packages.
type goPackage struct {
	ImportPath string
	Dir        string
	Doc        string   // the first sentence of the package's doc comment
	Imports    []string // of its non-test files
	GoFiles    []string
}

const module = "github.com/docsgate/gateway"

// modulePackages lists the module's packages with go list.
func modulePackages(t *testing.T) []goPackage {
	t.Helper()
	cmd := exec.Command("go", "list", "-json", "./...")
	cmd.Dir = root
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []goPackage
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for dec.More() {
		var p goPackage
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// layoutRows reads the package map of contributing.md: package (a row may name several) ->
// the gateway's packages it may import ("any", or none).
func layoutRows(t *testing.T) map[string][]string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "docs", "contributing.md"))
	if err != nil {
		t.Fatal(err)
	}
	section := string(data)
	i := strings.Index(section, "## Layout")
	if i < 0 {
		t.Fatal("contributing.md has no Layout section")
	}
	section = section[i:]
	if j := strings.Index(section[1:], "\n## "); j >= 0 {
		section = section[:j+1]
	}
	code := regexp.MustCompile("`([^`]+)`")
	rows := map[string][]string{}
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) != 5 || !strings.HasPrefix(strings.TrimSpace(cells[1]), "`") {
			continue // not a row of the three-column package map
		}
		allowed := []string{}
		switch may := strings.TrimSpace(cells[3]); may {
		case "any":
			allowed = nil
		case "none":
		default:
			for _, m := range code.FindAllStringSubmatch(may, -1) {
				allowed = append(allowed, m[1])
			}
		}
		for _, m := range code.FindAllStringSubmatch(cells[1], -1) {
			rows[m[1]] = allowed
		}
	}
	return rows
}

// The package map of contributing.md is the code's: every package of the module has its row,
// every row is a package, each imports only the gateway's packages its row allows (so the
// dependencies point one way: policy, then engine, then the front doors), and each package's
// doc comment says its job in its first line.
func TestPackageMap(t *testing.T) {
	rows := layoutRows(t)
	if len(rows) < 10 {
		t.Fatalf("the Layout section's package map has %d rows", len(rows))
	}
	seen := map[string]bool{}
	for _, p := range modulePackages(t) {
		name := strings.TrimPrefix(strings.TrimPrefix(p.ImportPath, module), "/")
		allowed, ok := rows[name]
		if !ok {
			t.Errorf("package %s has no row in the package map of contributing.md", name)
			continue
		}
		seen[name] = true
		if allowed != nil {
			for _, imp := range p.Imports {
				dep, ours := strings.CutPrefix(imp, module+"/")
				if ours && !slices.Contains(allowed, dep) {
					t.Errorf("%s imports %s, which its row does not allow (%v)", name, dep, allowed)
				}
			}
		}
		if len(p.GoFiles) > 0 && !firstLineSaysJob(t, p) {
			t.Errorf("%s: its doc comment's first line is no sentence saying its job: %q", name, p.Doc)
		}
	}
	for name := range rows {
		if !seen[name] {
			t.Errorf("the package map names %s, which is no package of the module", name)
		}
	}
}

// firstLineSaysJob reports whether p's doc comment begins with one line that is a whole
// sentence ("Package x ..." or "Command x ...", ending with a period).
func firstLineSaysJob(t *testing.T, p goPackage) bool {
	t.Helper()
	for _, f := range p.GoFiles {
		data, err := os.ReadFile(filepath.Join(p.Dir, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			if strings.HasPrefix(line, "// Package ") || strings.HasPrefix(line, "// Command ") {
				return strings.HasSuffix(line, ".")
			}
			if strings.HasPrefix(line, "package ") {
				break
			}
		}
	}
	return false
}
