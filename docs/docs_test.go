package docs

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"
	"unicode"

	"github.com/prometheus/client_golang/prometheus"
	"gopkg.in/yaml.v3"

	"github.com/docsgate/gateway/config"
	"github.com/docsgate/gateway/metrics"
)

// root is the repository's root: go test runs in this package's directory.
const root = ".."

// placeholders name the keys of the config's maps as the configuration reference writes them:
// limits.<name>.limit, plans.<plan>.<limit>.window, orgs.<org>.domains. A map of plain values
// (tracing.headers) is one key and needs none.
var placeholders = map[string]string{
	"limits":       "<name>",
	"plans":        "<plan>",
	"plans.<plan>": "<limit>",
	"orgs":         "<org>",
}

// schemaKeys lists every key path of the config's schema, from the yaml tags of config.Config:
// the leaves (values, lists of values, maps of values), routes[] for the list of routes.
func schemaKeys(t *testing.T) []string {
	t.Helper()
	var keys []string
	var walk func(path string, typ reflect.Type)
	walk = func(path string, typ reflect.Type) {
		for typ.Kind() == reflect.Pointer {
			typ = typ.Elem()
		}
		switch {
		case typ.Kind() == reflect.Struct:
			for i := range typ.NumField() {
				f := typ.Field(i)
				tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
				if !f.IsExported() || tag == "-" {
					continue
				}
				if tag == "" {
					t.Errorf("config field %s.%s has no yaml tag", typ.Name(), f.Name)
					continue
				}
				walk(join(path, tag), f.Type)
			}
		case typ.Kind() == reflect.Map && isNode(typ.Elem()):
			ph, ok := placeholders[path]
			if !ok {
				t.Errorf("%s: a map of structs: name its keys in placeholders", path)
				return
			}
			walk(join(path, ph), typ.Elem())
		case typ.Kind() == reflect.Slice && isNode(typ.Elem()):
			walk(path+"[]", typ.Elem())
		default:
			keys = append(keys, path)
		}
	}
	walk("", reflect.TypeFor[config.Config]())
	return keys
}

// isNode tells whether values of typ hold keys of their own (structs, maps of structs).
func isNode(typ reflect.Type) bool {
	for typ.Kind() == reflect.Pointer || typ.Kind() == reflect.Slice {
		typ = typ.Elem()
	}
	return typ.Kind() == reflect.Struct && typ != reflect.TypeFor[time.Time]() ||
		typ.Kind() == reflect.Map && isNode(typ.Elem())
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// exampleKeys lists the key paths config.example.yaml sets, walking the document beside the
// schema's types, so that a key the schema lacks is reported.
func exampleKeys(t *testing.T) []string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(root, "config.example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	var keys []string
	var walk func(path string, n *yaml.Node, typ reflect.Type)
	walk = func(path string, n *yaml.Node, typ reflect.Type) {
		for typ.Kind() == reflect.Pointer {
			typ = typ.Elem()
		}
		switch {
		case typ.Kind() == reflect.Struct && n.Kind == yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				name := n.Content[i].Value
				f, ok := fieldByTag(typ, name)
				if !ok {
					t.Errorf("config.example.yaml line %d: %s is not a key of the config schema", n.Content[i].Line, join(path, name))
					continue
				}
				walk(join(path, name), n.Content[i+1], f.Type)
			}
		case typ.Kind() == reflect.Struct && typ == reflect.TypeFor[config.Org]() && n.Kind == yaml.SequenceNode:
			keys = append(keys, path+".domains") // an org's short form: its list of domains
		case typ.Kind() == reflect.Map && isNode(typ.Elem()) && n.Kind == yaml.MappingNode:
			for i := 0; i+1 < len(n.Content); i += 2 {
				walk(join(path, placeholders[path]), n.Content[i+1], typ.Elem())
			}
		case typ.Kind() == reflect.Slice && isNode(typ.Elem()) && n.Kind == yaml.SequenceNode:
			for _, item := range n.Content {
				walk(path+"[]", item, typ.Elem())
			}
		case typ.Kind() == reflect.Map && isNode(typ.Elem()), typ.Kind() == reflect.Slice && isNode(typ.Elem()):
			// an empty map or list ({} or []): nothing below it is set
		default:
			keys = append(keys, path)
		}
	}
	walk("", doc.Content[0], reflect.TypeFor[config.Config]())
	return keys
}

func fieldByTag(typ reflect.Type, name string) (reflect.StructField, bool) {
	for i := range typ.NumField() {
		f := typ.Field(i)
		if tag, _, _ := strings.Cut(f.Tag.Get("yaml"), ","); tag == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// tableKeys returns the code spans of the first column of every table in the Markdown file
// whose header's first cell is header, with the line each is on.
func tableKeys(t *testing.T, file, header string) map[string]int {
	t.Helper()
	lines := readLines(t, file)
	keys := map[string]int{}
	inTable := false
	for i, line := range lines {
		if !strings.HasPrefix(line, "|") {
			inTable = false
			continue
		}
		first := firstCell(line)
		if i == 0 || !strings.HasPrefix(lines[i-1], "|") {
			inTable = first == header // a table's first line is its header
			continue
		}
		if !inTable || strings.Trim(first, "-: ") == "" {
			continue
		}
		for _, m := range codeSpan.FindAllStringSubmatch(first, -1) {
			keys[m[1]] = i + 1
		}
	}
	return keys
}

var codeSpan = regexp.MustCompile("`([^`]+)`")

// firstCell is the text of a table row's first cell.
func firstCell(line string) string {
	rest := line[1:]
	for i := 0; i < len(rest); i++ {
		switch rest[i] {
		case '\\':
			i++
		case '|':
			return strings.TrimSpace(rest[:i])
		}
	}
	return strings.TrimSpace(rest)
}

func readLines(t *testing.T, file string) []string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(string(data), "\n")
}

// TestConfigurationReference: every key of the config schema and of config.example.yaml is a
// row of docs/reference/configuration.md, and every key there exists in the schema.
func TestConfigurationReference(t *testing.T) {
	page := filepath.Join("reference", "configuration.md")
	documented := tableKeys(t, page, "key")
	if len(documented) < 50 {
		t.Fatalf("%s: only %d keys found in its key tables: is the page's format still | key | default | meaning |?", page, len(documented))
	}
	schema := schemaKeys(t)
	for _, k := range schema {
		if _, ok := documented[k]; !ok {
			t.Errorf("config key %s is not documented in %s (a row of a | key | ... | table)", k, page)
		}
	}
	for _, k := range exampleKeys(t) {
		if _, ok := documented[k]; !ok {
			t.Errorf("config.example.yaml sets %s, which %s does not document", k, page)
		}
	}
	for k, line := range documented {
		if !slices.Contains(schema, k) {
			t.Errorf("%s:%d documents %s, which is no key of the config schema", page, line, k)
		}
	}
	// The example must also load as it stands (strict decoding, validation).
	if _, err := config.Load(filepath.Join(root, "config.example.yaml"), nil); err != nil {
		t.Errorf("config.example.yaml does not load: %v", err)
	}
}

// descRecorder is a prometheus.Registerer that records the names of every metric the
// collectors registered on it describe, series or not, and registers them on a real registry.
type descRecorder struct {
	reg   *prometheus.Registry
	names map[string]bool
}

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (r *descRecorder) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		m := fqName.FindStringSubmatch(d.String())
		if m == nil {
			return fmt.Errorf("no fqName in %s", d)
		}
		r.names[m[1]] = true
	}
	return r.reg.Register(c)
}

func (r *descRecorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

func (r *descRecorder) Unregister(c prometheus.Collector) bool { return r.reg.Unregister(c) }

// exportedMetrics is every metric name the gateway registers (metrics.New, the one place that
// does), from the collectors' descriptions and from a gather of a fresh registry.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	rec := &descRecorder{reg: prometheus.NewRegistry(), names: map[string]bool{}}
	metrics.New(rec)
	mfs, err := rec.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		rec.names[mf.GetName()] = true
	}
	return rec.names
}

var gatewayMetric = regexp.MustCompile(`\bgateway_[a-z0-9_]*[a-z0-9]\b(\*|\{?)`)

// TestMetricsReference: every gateway_ metric the gateway registers is a row of
// docs/reference/metrics.md, and every gateway_ name in the documentation exists.
func TestMetricsReference(t *testing.T) {
	page := filepath.Join("reference", "metrics.md")
	exported := exportedMetrics(t)
	documented := tableKeys(t, page, "metric")
	n := 0
	for name := range exported {
		if !strings.HasPrefix(name, "gateway_") {
			continue
		}
		n++
		if _, ok := documented[name]; !ok {
			t.Errorf("metric %s is not documented in %s (a row of a | metric | ... | table)", name, page)
		}
	}
	if n < 20 {
		t.Fatalf("only %d gateway_ metrics registered: is metrics.New still the one constructor?", n)
	}
	text := strings.Join(readLines(t, page), "\n")
	for _, family := range []string{"`go_*`", "`process_*`"} {
		if !strings.Contains(text, family) {
			t.Errorf("%s does not mention the %s collector", page, family)
		}
	}
	// Every gateway_ name a page of the documentation mentions is a metric the gateway exports
	// (a histogram's _bucket, _sum and _count series included; gateway_foo_* is a pattern).
	for _, file := range markdownFiles(t) {
		for i, line := range readLines(t, file) {
			for _, m := range gatewayMetric.FindAllStringSubmatch(line, -1) {
				name := strings.TrimSuffix(strings.TrimSuffix(m[0], "{"), "*")
				if m[1] == "*" || isMetric(exported, name) {
					continue
				}
				t.Errorf("%s:%d names %s, which the gateway does not export", file, i+1, name)
			}
		}
	}
}

func isMetric(exported map[string]bool, name string) bool {
	if exported[name] {
		return true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok && exported[base] {
			return true
		}
	}
	return false
}

// markdownFiles lists the repository's Markdown files (not node_modules, build output or
// test data).
func markdownFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "node_modules", "bin", "dist", "testdata", ".tmp":
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".md") {
			files = append(files, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(files)
	return files
}

var (
	inlineLink = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	refLink    = regexp.MustCompile(`^\s*\[[^\]]+\]:\s*(\S+)`)
	heading    = regexp.MustCompile(`^#{1,6}\s+(.*?)\s*#*\s*$`)
	scheme     = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
)

// proseLines returns a Markdown file's lines outside fenced code blocks, by line number.
func proseLines(t *testing.T, file string) map[int]string {
	t.Helper()
	out := map[int]string{}
	fenced := false
	for i, line := range readLines(t, file) {
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if !fenced {
			out[i+1] = line
		}
	}
	return out
}

// anchors returns the anchors GitHub gives the headings of a Markdown file.
func anchors(t *testing.T, file string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	seen := map[string]int{}
	lines := proseLines(t, file)
	nums := make([]int, 0, len(lines))
	for n := range lines {
		nums = append(nums, n)
	}
	sort.Ints(nums)
	for _, n := range nums {
		m := heading.FindStringSubmatch(lines[n])
		if m == nil {
			continue
		}
		a := slug(m[1])
		if k := seen[a]; k > 0 {
			out[fmt.Sprintf("%s-%d", a, k)] = true
		} else {
			out[a] = true
		}
		seen[a]++
	}
	return out
}

// slug is GitHub's anchor of a heading: lower case, letters, digits, '_' and '-' kept,
// spaces turned into '-', everything else dropped.
func slug(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(h) {
		switch {
		case unicode.IsLetter(r), unicode.IsDigit(r), unicode.Is(unicode.Mn, r), r == '_', r == '-':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

// TestLinks: every relative link of the repository's Markdown files names a file that exists,
// and every #anchor a heading of the Markdown file it points into.
func TestLinks(t *testing.T) {
	files := markdownFiles(t)
	if len(files) < 15 {
		t.Fatalf("only %d Markdown files found from %s", len(files), root)
	}
	anchorsOf := map[string]map[string]bool{}
	checked := 0
	for _, file := range files {
		for n, line := range proseLines(t, file) {
			var targets []string
			for _, m := range inlineLink.FindAllStringSubmatch(line, -1) {
				targets = append(targets, m[1])
			}
			if m := refLink.FindStringSubmatch(line); m != nil {
				targets = append(targets, m[1])
			}
			for _, target := range targets {
				target = strings.Trim(target, "<>")
				if scheme.MatchString(target) {
					continue // http:, https:, mailto:
				}
				checked++
				path, anchor, _ := strings.Cut(target, "#")
				dest := file
				if path != "" {
					dest = filepath.Join(filepath.Dir(file), filepath.FromSlash(path))
					if _, err := os.Stat(dest); err != nil {
						t.Errorf("%s:%d: link %s: %s does not exist", file, n, target, dest)
						continue
					}
				}
				if anchor == "" || !strings.HasSuffix(dest, ".md") {
					continue
				}
				if anchorsOf[dest] == nil {
					anchorsOf[dest] = anchors(t, dest)
				}
				if !anchorsOf[dest][anchor] {
					t.Errorf("%s:%d: link %s: %s has no heading with the anchor #%s", file, n, target, dest, anchor)
				}
			}
		}
	}
	if checked < 50 {
		t.Errorf("only %d relative links checked: is the link pattern still right?", checked)
	}
}

var (
	testName = regexp.MustCompile(`\b(Test|Benchmark|Fuzz|Example)[A-Z][A-Za-z0-9_]*`)
	workItem = regexp.MustCompile(`(?i)\b(issue|work item|PR)s?\s*#?\d+`)
)

// TestUserPagesCiteNoInternals: the pages for users (the README, SECURITY.md, docs/ but the
// contributors' page) cite no test or benchmark name and no internal work-item number; those
// belong in docs/contributing.md and bench/README.md.
func TestUserPagesCiteNoInternals(t *testing.T) {
	pages := []string{filepath.Join(root, "README.md"), filepath.Join(root, "SECURITY.md")}
	for _, f := range markdownFiles(t) {
		if strings.HasPrefix(f, filepath.Join(root, "docs")+string(filepath.Separator)) && filepath.Base(f) != "contributing.md" {
			pages = append(pages, f)
		}
	}
	for _, page := range pages {
		for i, line := range readLines(t, page) {
			for _, re := range []*regexp.Regexp{testName, workItem} {
				if m := re.FindString(line); m != "" {
					t.Errorf("%s:%d cites %q: user pages name no test and no work item (docs/contributing.md may)", page, i+1, m)
				}
			}
		}
	}
}

// TestDemoConfig: the config scripts/demo.sh writes loads, keeps both listeners on loopback,
// and sets the admin token and the keys file its printed examples need.
func TestDemoConfig(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("no bash")
	}
	out := filepath.Join(t.TempDir(), "demo.yaml")
	cmd := exec.Command("bash", filepath.Join(root, "scripts", "demo.sh"), "--write-config", out)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("scripts/demo.sh --write-config: %v\n%s", err, b)
	}
	cfg, err := config.Load(out, nil)
	if err != nil {
		t.Fatalf("the demo's config does not load: %v", err)
	}
	for key, addr := range map[string]string{"admin_listen": cfg.AdminListen, "listen": cfg.Listen} {
		host, _, err := net.SplitHostPort(addr)
		if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
			t.Errorf("the demo's %s is %q, not a loopback address", key, addr)
		}
	}
	if len(cfg.AdminToken) < 16 {
		t.Errorf("the demo's admin_token is %q: its quota and usage examples need one", cfg.AdminToken)
	}
	if cfg.Auth.KeysFile == "" {
		t.Error("the demo sets no auth.keys_file: its keys examples need one")
	}
	// The token the demo prints is the token it configures.
	script, err := os.ReadFile(filepath.Join(root, "scripts", "demo.sh"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(script), "token="+cfg.AdminToken+"\n") {
		t.Errorf("scripts/demo.sh does not set token=%s", cfg.AdminToken)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(readme), cfg.AdminToken) {
		t.Errorf("README.md's demo tour does not show the demo's admin token %s", cfg.AdminToken)
	}
}

// TestReadmeTestCommand: the README's test command is the one CI runs.
func TestReadmeTestCommand(t *testing.T) {
	ci, err := os.ReadFile(filepath.Join(root, ".ci", "run"))
	if err != nil {
		t.Fatal(err)
	}
	var command string
	sc := bufio.NewScanner(strings.NewReader(string(ci)))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line != "" && !strings.HasPrefix(line, "#") && !strings.HasPrefix(line, "set ") && !strings.HasPrefix(line, "cd ") &&
			!strings.Contains(line, "gofmt") && !strings.HasPrefix(line, "if ") && !strings.HasPrefix(line, "echo ") && line != "fi" {
			command = line // the last command: the test command
		}
	}
	if command == "" {
		t.Fatal(errors.New(".ci/run: no test command found"))
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(command) + `\s+#`).Match(readme) {
		t.Errorf("README.md does not show .ci/run's test command %q as a command line", command)
	}
}
