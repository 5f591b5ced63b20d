package config

import (
	"reflect"
	"strings"

	"gopkg.in/yaml.v3"
)

// durationPattern matches what a duration key takes as a string: Go's time.ParseDuration
// syntax (30s, 1h30m, 100ms, 0). A whole number is taken too, as nanoseconds.
const durationPattern = `^([-+]?(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+|[-+]?0)$`

// longDurationPattern matches a LongDuration: a whole number of days (90d) or a duration.
const longDurationPattern = `^([0-9]{1,5}d|([-+]?(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+|[-+]?0))$`

// yamlUnmarshaler is a type that decodes itself: its schema cannot be read off its Go kind.
var yamlUnmarshaler = reflect.TypeFor[yaml.Unmarshaler]()

// JSONSchema is the JSON Schema (draft-07) of the config file, generated from the Config type:
// every key the strict decoder takes, at every depth, with its type, and no other key
// (additionalProperties: false), so that a misspelt key fails where the schema is checked (an
// editor, the Helm chart's values.schema.json) as it fails at start. Values the decoder takes
// but Validate refuses (a bad URL, an unknown log level) are left to the gateway: the schema
// says only what the file's shape is. Each call builds a new map.
func JSONSchema() map[string]any {
	s := schemaOf(reflect.TypeFor[Config]())
	s["$schema"] = "http://json-schema.org/draft-07/schema#"
	s["title"] = "Gateway config file"
	s["description"] = "The gateway's config file (config.example.yaml documents every key); generated from package config's Config type."
	return s
}

// schemaOf is the schema of a value of type t as the decoder reads it.
func schemaOf(t reflect.Type) map[string]any {
	for t.Kind() == reflect.Pointer { // optional: the value it points to
		t = t.Elem()
	}
	switch {
	case t == durationType:
		return map[string]any{"type": []any{"string", "integer"}, "pattern": durationPattern}
	case t == reflect.TypeFor[LongDuration]():
		return map[string]any{"anyOf": []any{
			map[string]any{"type": "string", "pattern": longDurationPattern},
			map[string]any{"const": 0},
		}}
	case reflect.PointerTo(t).Implements(yamlUnmarshaler):
		// A new type that decodes itself: give it a case above.
		panic("config: no JSON Schema for " + t.String() + ", which decodes itself")
	case t == reflect.TypeFor[Org]():
		// Its short form, a list of domains, or the mapping (Org.decodeShort).
		return map[string]any{"anyOf": []any{
			map[string]any{"type": "array", "items": map[string]any{"type": "string"}},
			structSchema(t),
		}}
	}
	switch t.Kind() {
	case reflect.Struct:
		return structSchema(t)
	case reflect.Map:
		return map[string]any{"type": "object", "additionalProperties": schemaOf(t.Elem())}
	case reflect.Slice:
		return map[string]any{"type": "array", "items": schemaOf(t.Elem())}
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Float32, reflect.Float64:
		return map[string]any{"type": "number"}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return map[string]any{"type": "integer"}
	}
	panic("config: no JSON Schema for " + t.String()) // a new field type: give it a case above
}

// structSchema is an object with exactly the struct's yaml keys.
func structSchema(t reflect.Type) map[string]any {
	props := map[string]any{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if !f.IsExported() || name == "" || name == "-" {
			continue
		}
		props[name] = schemaOf(f.Type)
	}
	return map[string]any{"type": "object", "additionalProperties": false, "properties": props}
}
