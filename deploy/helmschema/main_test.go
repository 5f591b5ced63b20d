package main

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/pb33f/jsonschema/v6"
	"gopkg.in/yaml.v3"
)

const (
	schemaFile = "../helm/gateway/values.schema.json"
	valuesFile = "../helm/gateway/values.yaml"
)

// The committed values schema is what the generator writes from today's config definition:
// run `go generate ./deploy/helmschema` after changing the config's keys.
func TestCommittedSchemaIsGenerated(t *testing.T) {
	committed, err := os.ReadFile(schemaFile)
	if err != nil {
		t.Fatal(err)
	}
	generated, err := generate(committed)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(committed, generated) {
		t.Fatalf("%s is not what the generator writes: run go generate ./deploy/helmschema", schemaFile)
	}
}

// values reads the chart's default values, with set applied as `helm --set` would (a dotted
// path to a value).
func values(t *testing.T, set map[string]any) any {
	t.Helper()
	data, err := os.ReadFile(valuesFile)
	if err != nil {
		t.Fatal(err)
	}
	var v map[string]any
	if err := yaml.Unmarshal(data, &v); err != nil {
		t.Fatal(err)
	}
	for path, val := range set {
		m := v
		keys := strings.Split(path, ".")
		for _, k := range keys[:len(keys)-1] {
			next, ok := m[k].(map[string]any)
			if !ok {
				next = map[string]any{}
				m[k] = next
			}
			m = next
		}
		m[keys[len(keys)-1]] = val
	}
	js, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(js))
	if err != nil {
		t.Fatal(err)
	}
	return inst
}

// What `helm install` checks: the default values pass the committed schema; a misspelt key
// under config.* fails (--set config.upstream.timout=3s would otherwise render, and every pod
// crash-loop on start), as do a wrong type and a misspelt limit field, at any depth; the
// config keys an operator sets pass.
func TestValuesSchemaChecksTheConfig(t *testing.T) {
	c := jsonschema.NewCompiler()
	s, err := c.Compile(schemaFile)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		set map[string]any
		ok  bool
	}{
		{nil, true},
		{map[string]any{"config.upstream.timeout": "3s"}, true},
		{map[string]any{"config.client_ip.trusted_proxies": []any{"10.96.200.0/29"}}, true},
		{map[string]any{"config.limits.agent_job_per_project": map[string]any{"limit": 20, "window": "1m"}}, true},
		{map[string]any{"config.orgs.acme": []any{"acme-docs"}, "config.orgs.globex": map[string]any{"domains": []any{"g"}, "plan": "gold"}}, true},
		{map[string]any{"config.redis.master_name": "mymaster", "config.redis.db": 1}, true},
		{map[string]any{"config.upstream.timout": "3s"}, false},
		{map[string]any{"config.upstream.timeout": "soon"}, false},
		{map[string]any{"config.limits.agent_job_per_project": map[string]any{"limt": 20}}, false},
		{map[string]any{"config.redis.tls": "yes"}, false},
		{map[string]any{"config.lisen": ":8080"}, false},
		{map[string]any{"config.upstream.url": nil}, false},
	}
	for _, c := range cases {
		err := s.Validate(values(t, c.set))
		if (err == nil) != c.ok {
			t.Errorf("values with %v: valid %v, want %v (%v)", c.set, err == nil, c.ok, err)
		}
	}
}
