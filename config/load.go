package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// Problem is one thing wrong with a configuration, tied to the key it concerns.
type Problem struct {
	Key string // dotted path such as "upstream.timeout" or "routes[2].path"; "" for the file
	Msg string
}

func (p Problem) String() string {
	if p.Key == "" {
		return p.Msg
	}
	return p.Key + ": " + p.Msg
}

// Error lists every problem found in a configuration, on one line.
type Error struct {
	Problems []Problem
}

func (e *Error) Error() string {
	parts := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		parts[i] = p.String()
	}
	return "invalid config: " + strings.Join(parts, "; ")
}

// Env is the environment lookup used for overrides (os.LookupEnv in production).
type Env func(name string) (string, bool)

// Load reads, decodes, applies environment overrides to and validates the file at path.
func Load(path string, env Env) (*Config, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	return Parse(f, env)
}

// Parse is Load for an already opened file.
func Parse(r io.Reader, env Env) (*Config, error) {
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, fmt.Errorf("config: reading: %w", err)
	}
	cfg := Defaults()
	err = decode(data, &cfg)
	if env != nil {
		applyEnv(&cfg, env)
	}
	var decoded *Error
	if err != nil && !errors.As(err, &decoded) || decoded != nil && len(decoded.Problems) == 1 && decoded.Problems[0].Key == "" {
		if decoded != nil {
			decoded.Problems = redactProblems(decoded.Problems, cfg.Secrets())
		}
		return nil, err // not YAML at all: nothing more to say
	}
	// Report every problem at once: the keys that did not decode, then what the values that
	// did decode break.
	var problems []Problem
	if decoded != nil {
		problems = decoded.Problems
	}
	var invalid *Error
	if errors.As(cfg.Validate(), &invalid) {
		problems = append(problems, invalid.Problems...)
	}
	if len(problems) == 0 {
		problems = resolveSecrets(&cfg, env, readSecretFile)
	}
	if len(problems) > 0 {
		// Every message is masked here, whichever step wrote it: the secrets of the file
		// and of the environment are known only once it is decoded.
		return nil, &Error{Problems: redactProblems(problems, cfg.Secrets())}
	}
	return &cfg, nil
}

// decode overlays the YAML document onto cfg, rejecting unknown keys and wrongly typed values
// with the full key path: yaml.v3's own errors name only a line and a Go type.
func decode(data []byte, cfg *Config) error {
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil // an empty file: all defaults (Validate still wants upstream.url)
		}
		return &Error{Problems: []Problem{{Msg: "not valid YAML: " + strings.TrimPrefix(err.Error(), "yaml: ")}}}
	}
	var more yaml.Node
	if err := dec.Decode(&more); !errors.Is(err, io.EOF) {
		return &Error{Problems: []Problem{{Msg: "the file must hold exactly one YAML document"}}}
	}
	var d decoder
	d.value(&doc, reflect.ValueOf(cfg).Elem(), "")
	if len(d.problems) > 0 {
		return &Error{Problems: d.problems}
	}
	return nil
}

type decoder struct {
	problems []Problem
}

// fail records a problem. Messages quote the values they refuse: Parse and Validate mask
// the secrets in them (Redact) before any leaves the package.
func (d *decoder) fail(key, format string, args ...any) {
	d.problems = append(d.problems, Problem{Key: key, Msg: fmt.Sprintf(format, args...)})
}

var (
	durationType     = reflect.TypeFor[time.Duration]()
	longDurationType = reflect.TypeFor[LongDuration]()
)

func (d *decoder) value(n *yaml.Node, v reflect.Value, path string) {
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) == 1 {
			d.value(n.Content[0], v, path)
		}
		return
	case yaml.AliasNode:
		d.value(n.Alias, v, path)
		return
	}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		return // an explicit null keeps the default
	}
	if sf, ok := v.Addr().Interface().(shortForm); ok && n.Kind != yaml.MappingNode {
		if err := sf.decodeShort(n); err != nil {
			d.fail(path, "%v (line %d)", err, n.Line)
		}
		return
	}
	switch {
	case v.Kind() == reflect.Pointer && v.Type().Elem().Kind() == reflect.Struct:
		if v.IsNil() {
			v.Set(reflect.New(v.Type().Elem()))
		}
		d.value(n, v.Elem(), path)
	case v.Kind() == reflect.Struct:
		d.mapping(n, v, path)
	case v.Kind() == reflect.Map && v.Type().Key().Kind() == reflect.String:
		d.namedEntries(n, v, path)
	case v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.Struct:
		if n.Kind != yaml.SequenceNode {
			d.fail(path, "must be a list (line %d)", n.Line)
			return
		}
		s := reflect.MakeSlice(v.Type(), len(n.Content), len(n.Content))
		for i, item := range n.Content {
			d.value(item, s.Index(i), fmt.Sprintf("%s[%d]", path, i))
		}
		v.Set(s)
	default:
		d.leaf(n, v, path)
	}
}

// shortForm is implemented by config types that accept a shorter YAML form besides their
// mapping (an org as a bare list of domains): the decoder hands them every node but a
// mapping, and decodes mappings itself, key by key, like any struct.
type shortForm interface {
	decodeShort(n *yaml.Node) error
}

// namedEntries decodes a mapping of names (limits, plans, orgs) to values, each value as
// strictly as the rest of the file, under its name's path.
func (d *decoder) namedEntries(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.MappingNode {
		d.fail(path, "must be a mapping of names to values (line %d)", n.Line)
		return
	}
	if v.IsNil() {
		v.Set(reflect.MakeMap(v.Type()))
	}
	seen := make(map[string]bool, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		key := joinKey(path, k.Value)
		if k.Kind != yaml.ScalarNode {
			d.fail(path, "a name must be a string (line %d)", k.Line)
			continue
		}
		if seen[k.Value] {
			d.fail(key, "appears twice (line %d)", k.Line)
			continue
		}
		seen[k.Value] = true
		name := reflect.ValueOf(k.Value).Convert(v.Type().Key())
		elem := reflect.New(v.Type().Elem()).Elem()
		if old := v.MapIndex(name); old.IsValid() {
			elem.Set(old)
		}
		d.value(val, elem, key)
		v.SetMapIndex(name, elem)
	}
}

func (d *decoder) mapping(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.MappingNode {
		d.fail(path, "must be a mapping of keys to values (line %d)", n.Line)
		return
	}
	fields := yamlFields(v.Type())
	seen := make(map[string]bool, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		key := joinKey(path, k.Value)
		if seen[k.Value] {
			d.fail(key, "appears twice (line %d)", k.Line)
			continue
		}
		seen[k.Value] = true
		idx, ok := fields[k.Value]
		if !ok {
			d.fail(key, "unknown key (line %d)%s", k.Line, Suggest(k.Value, slices.Sorted(maps.Keys(fields))))
			continue
		}
		d.value(val, v.Field(idx), key)
	}
}

func (d *decoder) leaf(n *yaml.Node, v reflect.Value, path string) {
	if err := n.Decode(v.Addr().Interface()); err != nil {
		d.fail(path, "cannot use %s here: want %s (line %d)", describe(n), want(v.Type()), n.Line)
	}
}

func yamlFields(t reflect.Type) map[string]int {
	m := make(map[string]int, t.NumField())
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		if name != "" && name != "-" {
			m[name] = i
		}
	}
	return m
}

func joinKey(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	}
	return strconv.Quote(n.Value)
}

func want(t reflect.Type) string {
	for t.Kind() == reflect.Pointer { // an optional value (limit, history) wants what it points to
		t = t.Elem()
	}
	switch {
	case t == durationType:
		return "a duration such as 30s or 100ms"
	case t == longDurationType:
		return "a duration such as 90d or 36h"
	case t.Kind() == reflect.Bool:
		return "true or false"
	case t.Kind() == reflect.String:
		return "a string"
	case t.Kind() >= reflect.Int && t.Kind() <= reflect.Uint64:
		return "a whole number"
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.String:
		return "a list of strings"
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Float64:
		return "a list of numbers"
	case t.Kind() == reflect.Map:
		return "a mapping"
	}
	return t.String()
}

// applyEnv lets deployments override the few keys that differ per environment.
func applyEnv(cfg *Config, env Env) {
	if v, ok := env("GATEWAY_UPSTREAM_URL"); ok && v != "" {
		cfg.Upstream.URL = v
	}
	if v, ok := env("GATEWAY_LISTEN"); ok && v != "" {
		cfg.Listen = v
	}
	if v, ok := env("GATEWAY_REDIS_ADDRS"); ok {
		cfg.Redis.Addrs = nil
		for _, a := range strings.Split(v, ",") {
			if a = strings.TrimSpace(a); a != "" {
				cfg.Redis.Addrs = append(cfg.Redis.Addrs, a)
			}
		}
	}
	if v, ok := env("GATEWAY_ADMIN_TOKEN"); ok && v != "" {
		cfg.AdminToken = v
	}
	if v, ok := env("REDIS_PASSWORD"); ok && v != "" {
		cfg.Redis.Password = v
	}
}
