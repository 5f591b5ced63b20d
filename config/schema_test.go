package config

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/pb33f/jsonschema/v6"
	"gopkg.in/yaml.v3"
)

// compileSchema compiles JSONSchema() with a real JSON Schema validator.
func compileSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	data, err := json.Marshal(JSONSchema())
	if err != nil {
		t.Fatal(err)
	}
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("config.schema.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("config.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// asJSON is a YAML document as the JSON a schema validates (what Helm hands its schema).
func asJSON(t *testing.T, yml string) any {
	t.Helper()
	var v any
	if err := yaml.Unmarshal([]byte(yml), &v); err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	inst, err := jsonschema.UnmarshalJSON(strings.NewReader(string(data)))
	if err != nil {
		t.Fatal(err)
	}
	return inst
}

// The schema takes config.example.yaml, and refuses each of its keys misspelt, as the decoder
// does; it takes both forms of an org, durations as strings and whole numbers, and refuses a
// wrong type.
func TestJSONSchemaAgreesWithTheDecoder(t *testing.T) {
	s := compileSchema(t)
	data, doc, keys := exampleKeys(t)
	if err := s.Validate(asJSON(t, string(data))); err != nil {
		t.Fatalf("config.example.yaml does not pass the schema: %v", err)
	}
	eachMisspelt(t, doc, keys, func(k keyRef, bad string, out []byte) {
		if s.Validate(asJSON(t, string(out))) == nil {
			t.Errorf("%s misspelt as %s: the schema takes it", k.path, bad)
		}
	})
	for yml, ok := range map[string]bool{
		"orgs: {acme: [a, b], globex: {domains: [g], plan: gold}}":                   true,
		"upstream: {timeout: 30s, dial_timeout: 1h30m}":                              true,
		"upstream: {timeout: 1000000}":                                               true,
		"auth: {expiry_notice: 7d, key_lifetime: {admin: {default: 90d, max: 36h}}}": true,
		"auth: {expiry_notice: 7 days}":                                              false,
		"plans: {gold: {assistant_per_org: {limit: 5, window: 1m}}}":                 true,
		"tracing: {headers: {x-token: abc}, sample_ratio: 0.5}":                      true,
		"upstream: {timeout: forever}":                                               false,
		"upstream: {timout: 3s}":                                                     false,
		"orgs: {acme: 5}":                                                            false,
		"limits: {x: {limit: many}}":                                                 false,
		"plans: {gold: {assistant_per_org: {limt: 5}}}":                              false,
		"routes: [{name: r, stream: yes please}]":                                    false,
	} {
		if err := s.Validate(asJSON(t, yml)); (err == nil) != ok {
			t.Errorf("%s: valid %v, want %v (%v)", yml, err == nil, ok, err)
		}
	}
}
