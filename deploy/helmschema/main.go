// Command helmschema writes the Helm chart's values schema: its config part generated from the gateway's config definition.
//
// deploy/helm/gateway/values.schema.json checks the chart's values; its "config" property is
// the gateway's config file, and is generated from package config's Config type
// (config.JSONSchema), so that a misspelt key under config.* fails `helm install` as it would
// fail the gateway's start. The rest of the file (the chart's own values) is kept as it is.
// Run it after a change of the config's keys:
//
//	go generate ./deploy/helmschema
//
// The package's test fails while the committed file differs from what this writes.
package main

//go:generate go run . -file ../helm/gateway/values.schema.json

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"

	"github.com/docsgate/gateway/config"
)

func main() {
	file := flag.String("file", "../helm/gateway/values.schema.json", "the chart's values.schema.json, rewritten in place")
	flag.Parse()
	old, err := os.ReadFile(*file)
	if err == nil {
		var out []byte
		if out, err = generate(old); err == nil {
			err = os.WriteFile(*file, out, 0o644)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "helmschema:", err)
		os.Exit(1)
	}
}

// generate is the values schema with its config property generated: the gateway's config
// schema, plus what the chart itself needs of the config (admin_listen, whose port the pods
// expose and probe, and upstream.url, which has no useful default). Keys are sorted, indented
// by two spaces: the same input gives the same bytes.
func generate(values []byte) ([]byte, error) {
	var doc map[string]any
	if err := json.Unmarshal(values, &doc); err != nil {
		return nil, fmt.Errorf("the values schema: %w", err)
	}
	props, ok := doc["properties"].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("the values schema has no properties")
	}
	cfg := config.JSONSchema()
	for _, k := range []string{"$schema", "title"} {
		delete(cfg, k) // the document's, not a property's
	}
	cfg["description"] = "The gateway's config file (config.example.yaml documents every key); generated from the gateway's config definition by deploy/helmschema."
	cfg["required"] = []any{"admin_listen", "upstream"}
	upstream := cfg["properties"].(map[string]any)["upstream"].(map[string]any)
	upstream["required"] = []any{"url"}
	props["config"] = cfg
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(doc); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
