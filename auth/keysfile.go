package auth

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"gopkg.in/yaml.v3"
)

// entryFields are the keys an entry of the keys file may have.
var entryFields = map[string]bool{
	"digest": true, "kind": true, "org": true, "projects": true, "domains": true,
	"plan": true, "label": true, "created": true, "revoked": true, "expires": true,
	"scopes": true, "lineage": true, "replaces": true, "rotated_to": true,
}

// rawKeyFields are field names that suggest a raw key was pasted into the file.
var rawKeyFields = map[string]bool{"key": true, "raw_key": true, "api_key": true, "secret": true, "token": true}

// LoadKeysFile reads a keys file:
//
//	keys:
//	  - digest: <64 hex>
//	    kind: assistant
//	    org: acme
//	    domains: [acme-docs]
//	    plan: enterprise
//	    label: docs site
//	    created: 2025-01-02T03:04:05Z   # or a date: 2025-01-02 (midnight UTC)
//	    revoked: 2026-12-31             # optional; a time to come schedules the revocation
//	    expires: 2027-03-31             # optional; the key stops working then
//	    scopes: [assistant_message_v2]  # optional; the routes it may call (none: all of its kind)
//	    lineage: <64 hex>               # set by a rotation: the first key's digest
//	    replaces: <64 hex>              # set by a rotation: the key it was rotated from
//	    rotated_to: <64 hex>            # set by a rotation: the key it was rotated into
//
// Decoding is strict: an unknown field fails, naming the entry index and line. Anything that
// looks like a raw key (a field such as key:, or any value starting with "svc_") is refused,
// and the error never repeats it. Every entry is validated and digests must be unique.
func LoadKeysFile(path string) ([]Entry, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("auth: keys file: %w", err)
	}
	entries, err := parseKeysFile(data)
	if err != nil {
		return nil, fmt.Errorf("auth: keys file %s: %w", path, err)
	}
	return entries, nil
}

func parseKeysFile(data []byte) ([]Entry, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, scrubYAMLError(err)
	}
	if doc.Kind == 0 || len(doc.Content) == 0 {
		return []Entry{}, nil // empty file: no keys
	}
	root := doc.Content[0]
	if root.Kind == yaml.ScalarNode && root.Tag == "!!null" {
		return []Entry{}, nil
	}
	if root.Kind != yaml.MappingNode {
		return nil, fmt.Errorf("line %d: want a mapping with a keys list", root.Line)
	}
	var list *yaml.Node
	for i := 0; i+1 < len(root.Content); i += 2 {
		k, v := root.Content[i], root.Content[i+1]
		if k.Value != "keys" {
			return nil, fmt.Errorf("line %d: %s: unknown field (only keys:)", k.Line, clipName(k.Value))
		}
		list = v
	}
	if list == nil || list.Tag == "!!null" {
		return []Entry{}, nil
	}
	if list.Kind != yaml.SequenceNode {
		return nil, fmt.Errorf("line %d: keys: want a list", list.Line)
	}
	entries := make([]Entry, 0, len(list.Content))
	seen := make(map[string]int, len(list.Content))
	for i, n := range list.Content {
		e, err := decodeEntry(n)
		if err != nil {
			return nil, fmt.Errorf("keys[%d] (line %d): %w", i, n.Line, err)
		}
		if j, dup := seen[e.Digest]; dup {
			return nil, fmt.Errorf("keys[%d] (line %d): same digest as keys[%d]", i, n.Line, j)
		}
		seen[e.Digest] = i
		entries = append(entries, e)
	}
	return entries, nil
}

func decodeEntry(n *yaml.Node) (Entry, error) {
	if n.Kind != yaml.MappingNode {
		return Entry{}, errors.New("want a mapping")
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k := n.Content[i]
		switch {
		case rawKeyFields[k.Value]:
			return Entry{}, fmt.Errorf("line %d: %s: raw keys never go into the keys file; store the SHA-256 digest (gateway keys add)", k.Line, k.Value)
		case !entryFields[k.Value]:
			return Entry{}, fmt.Errorf("line %d: %s: unknown field", k.Line, clipName(k.Value))
		}
		if err := refuseRawKeys(n.Content[i+1]); err != nil {
			return Entry{}, fmt.Errorf("%s: %w", k.Value, err)
		}
		if k.Value == "created" || k.Value == "revoked" || k.Value == "expires" {
			if err := normalizeTime(n.Content[i+1]); err != nil {
				return Entry{}, fmt.Errorf("line %d: %s: %w", n.Content[i+1].Line, k.Value, err)
			}
		}
	}
	var e Entry
	if err := n.Decode(&e); err != nil {
		return Entry{}, scrubYAMLError(err)
	}
	if err := e.Validate(); err != nil {
		return Entry{}, err
	}
	return e, nil
}

// normalizeTime accepts a date (2025-01-02, midnight UTC) or an RFC 3339 time, quoted or not,
// like the dates of the config, and leaves the node as an RFC 3339 string for the decoder.
func normalizeTime(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode || n.Tag == "!!null" {
		return nil // not a time at all: the decoder says so
	}
	if t, err := time.Parse(time.DateOnly, n.Value); err == nil {
		n.Value, n.Tag, n.Style = t.Format(time.RFC3339), "!!str", 0
		return nil
	}
	if _, err := time.Parse(time.RFC3339, n.Value); err != nil {
		return fmt.Errorf("want a date (2025-01-02) or an RFC 3339 time (2025-01-02T03:04:05Z)")
	}
	n.Tag = "!!str"
	return nil
}

// refuseRawKeys fails on any scalar under n that looks like a raw key.
func refuseRawKeys(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode && looksLikeKey(n.Value) {
		return fmt.Errorf("line %d: this looks like a raw key; keys never go into the keys file, only their SHA-256 digest", n.Line)
	}
	for _, c := range n.Content {
		if err := refuseRawKeys(c); err != nil {
			return err
		}
	}
	return nil
}

// scrubYAMLError keeps yaml's message but never a value that could be a key: yaml quotes
// offending values in its messages.
func scrubYAMLError(err error) error {
	msg := err.Error()
	if bytes.Contains([]byte(msg), []byte(adminPrefix)) {
		return errors.New("invalid YAML (message withheld: it quoted a value that looks like a raw key)")
	}
	return err
}

// SaveKeysFile writes entries (sorted by Created then Digest) atomically: a temporary file in
// the same directory, synced, mode 0600, then renamed over path.
func SaveKeysFile(path string, entries []Entry) error {
	out := make([]Entry, len(entries))
	for i := range entries {
		if err := entries[i].Validate(); err != nil {
			return fmt.Errorf("auth: keys[%d]: %w", i, err)
		}
		out[i] = entries[i].normalize(entries[i].Created)
	}
	sortEntries(out)
	var buf bytes.Buffer
	buf.WriteString("# Registered gateway keys: SHA-256 digests of keys, never the keys themselves.\n" +
		"# Managed with `gateway keys add|revoke|list`; the gateway re-reads this file on reload.\n")
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(struct {
		Keys []Entry `yaml:"keys"`
	}{out}); err != nil {
		return fmt.Errorf("auth: keys file: %w", err)
	}
	if err := enc.Close(); err != nil {
		return fmt.Errorf("auth: keys file: %w", err)
	}
	if err := writeAtomic(path, buf.Bytes(), 0o600); err != nil {
		return fmt.Errorf("auth: keys file: %w", err)
	}
	return nil
}

func writeAtomic(path string, data []byte, perm fs.FileMode) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = os.Remove(tmp)
		}
	}()
	if err = f.Chmod(perm); err != nil {
		f.Close()
		return err
	}
	if _, err = f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err = f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp, path); err != nil {
		return err
	}
	// Make the rename itself durable; not every file system supports syncing a directory.
	if d, derr := os.Open(dir); derr == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
