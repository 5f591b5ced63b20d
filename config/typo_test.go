package config

import (
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// keyRef is one key of the example file that names a field of the schema (not a user-chosen
// name such as a limit's or a plan's), with its dotted path.
type keyRef struct {
	node *yaml.Node // the key's scalar node, to misspell in place
	path string
}

// schemaKeys walks the YAML tree beside the Go type it decodes into and lists every key
// that names a struct field, at every depth: inside maps of names, lists and pointers.
func schemaKeys(n *yaml.Node, t reflect.Type, path string, out *[]keyRef) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			schemaKeys(c, t, path, out)
		}
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			key := joinKey(path, k.Value)
			switch t.Kind() {
			case reflect.Struct:
				idx, ok := yamlFields(t)[k.Value]
				if !ok {
					continue
				}
				*out = append(*out, keyRef{k, key})
				schemaKeys(v, t.Field(idx).Type, key, out)
			case reflect.Map:
				schemaKeys(v, t.Elem(), key, out)
			}
		}
	case yaml.SequenceNode:
		if t.Kind() == reflect.Slice {
			for i, c := range n.Content {
				schemaKeys(c, t.Elem(), path+"["+strconv.Itoa(i)+"]", out)
			}
		}
	}
}

// misspell drops a letter (or adds one to short keys): a typo a person makes.
func misspell(k string) string {
	if len(k) <= 3 {
		return k + "x"
	}
	return k[:len(k)-2] + k[len(k)-1:]
}

// exampleKeys reads config.example.yaml and lists the keys of it that name a schema field.
func exampleKeys(t *testing.T) (data []byte, doc *yaml.Node, keys []keyRef) {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	data, err := os.ReadFile(filepath.Join(filepath.Dir(file), "..", "config.example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	doc = &yaml.Node{}
	if err := yaml.Unmarshal(data, doc); err != nil {
		t.Fatal(err)
	}
	schemaKeys(doc, reflect.TypeFor[Config](), "", &keys)
	if len(keys) < 60 {
		t.Fatalf("only %d keys found in the example: the walk is broken", len(keys))
	}
	return data, doc, keys
}

// eachMisspelt calls f with the example with each key misspelt in turn, and the misspelt
// key's path.
func eachMisspelt(t *testing.T, doc *yaml.Node, keys []keyRef, f func(k keyRef, bad string, out []byte)) {
	t.Helper()
	for _, k := range keys {
		orig := k.node.Value
		k.node.Value = misspell(orig)
		out, err := yaml.Marshal(doc)
		k.node.Value = orig
		if err != nil {
			t.Fatal(err)
		}
		f(k, k.path[:len(k.path)-len(orig)]+misspell(orig), out)
	}
}

// Every key of config.example.yaml, misspelled in turn, is refused with its full path and
// line: at the top level, in lists (routes), in maps of names (limits) and below.
func TestEveryMisspelledExampleKeyIsRefused(t *testing.T) {
	_, doc, keys := exampleKeys(t)
	seenPaths := map[string]bool{}
	eachMisspelt(t, doc, keys, func(k keyRef, bad string, out []byte) {
		seenPaths[k.path] = true
		_, err := Parse(strings.NewReader(string(out)), nil)
		if err == nil {
			t.Errorf("%s misspelled as %s: accepted", k.path, bad)
			return
		}
		if !strings.Contains(err.Error(), bad+": unknown key (line ") {
			t.Errorf("%s misspelled: the error does not name %s: %v", k.path, bad, err)
		}
	})
	// The walk reached inside maps of names and lists.
	for _, p := range []string{"limits.assistant_per_org.limit", "limits.assistant_tokens_per_org.unit", "routes[0].path", "redis.breaker.failures", "log.sampling.initial"} {
		if !seenPaths[p] {
			t.Errorf("the walk missed %s", p)
		}
	}
}

// The typos the bug report named, and the same inside plans and orgs.
func TestTyposInNamedEntries(t *testing.T) {
	for yml, want := range map[string]string{
		"limits: {assistant_per_org: {limt: 5}}":                                 "limits.assistant_per_org.limt: unknown key (line 2)",
		"limits: {assistant_per_org: {windw: hour}}":                             "limits.assistant_per_org.windw: unknown key (line 2)",
		"plans: {gold: {assistant_per_org: {limt: 5}}}":                          "plans.gold.assistant_per_org.limt: unknown key (line 2)",
		"orgs: {acme: {domians: [a]}}":                                           "orgs.acme.domians: unknown key (line 2)",
		"orgs: {acme: {domains: [a], plan: gold, plann: x}}":                     "orgs.acme.plann: unknown key (line 2)",
		"orgs: {acme: 5}":                                                        "orgs.acme: want a list of domains or {domains: [...], plan: NAME} (line 2)",
		"limits: {assistant_per_org: 5}":                                         "limits.assistant_per_org: must be a mapping of keys to values (line 2)",
		"limits: [a]":                                                            "limits: must be a mapping of names to values (line 2)",
		"limits: {assistant_per_org: {limit: 5}, assistant_per_org: {limit: 6}}": "limits.assistant_per_org: appears twice (line 2)",
	} {
		_, err := parse(t, "upstream: {url: \"http://up:9000\"}\n"+yml+"\n", nil)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", yml, err, want)
		}
	}
	// The short and long org forms still work, and entries keep what they do not set.
	cfg, err := parse(t, "upstream: {url: \"http://up:9000\"}\nplans: {gold: {}}\norgs: {a: [x, y], b: {domains: [z], plan: gold}}\nlimits: {assistant_per_org: {limit: 5}}\n", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Orgs["a"].Domains; len(got) != 2 || cfg.Orgs["b"].Plan != "gold" || cfg.Orgs["b"].Domains[0] != "z" {
		t.Fatalf("orgs: %+v", cfg.Orgs)
	}
	for _, s := range cfg.ResolvedLimits() {
		if s.Name == "assistant_per_org" && (s.Limit != 5 || s.Window != "hour") {
			t.Fatalf("assistant_per_org: %+v", s)
		}
	}
}
