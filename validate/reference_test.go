package validate

// A deliberately naive reference implementation of both schemas, built on
// encoding/json's tokenizer, for the differential and fuzz tests. It is slow
// and allocates freely; what matters is that it is obviously right.

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"unicode/utf8"
)

// node is a decoded JSON value that, unlike map[string]any, keeps its keys'
// order. A body with a duplicate member, at any depth, does not parse.
type node struct {
	kind  byte // 'o' object, 'a' array, 's' string, 'n' number, 'b' bool, 'z' null
	str   string
	num   json.Number
	keys  []string
	vals  []*node
	elems []*node
}

func readNode(dec *json.Decoder) (*node, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		n := &node{kind: 'a'}
		if t == '{' {
			n.kind = 'o'
		}
		for dec.More() {
			if n.kind == 'o' {
				k, err := dec.Token()
				if err != nil {
					return nil, err
				}
				if slices.Contains(n.keys, k.(string)) {
					return nil, errors.New("duplicate member") // refused at any depth
				}
				n.keys = append(n.keys, k.(string))
				v, err := readNode(dec)
				if err != nil {
					return nil, err
				}
				n.vals = append(n.vals, v)
			} else {
				v, err := readNode(dec)
				if err != nil {
					return nil, err
				}
				n.elems = append(n.elems, v)
			}
		}
		if _, err := dec.Token(); err != nil { // closing delimiter
			return nil, err
		}
		return n, nil
	case string:
		return &node{kind: 's', str: t}, nil
	case json.Number:
		return &node{kind: 'n', num: t}, nil
	case bool:
		return &node{kind: 'b'}, nil
	case nil:
		return &node{kind: 'z'}, nil
	}
	return nil, errors.New("unexpected token")
}

func (n *node) depth() int {
	d := 0
	for _, c := range append(n.vals, n.elems...) {
		d = max(d, c.depth())
	}
	if n.kind == 'o' || n.kind == 'a' {
		return d + 1
	}
	return 0
}

// get returns the member named key (exact, case-sensitive match) and how
// many times it occurs.
func (n *node) get(key string) (*node, int) {
	var v *node
	count := 0
	for i, k := range n.keys {
		if k == key {
			v = n.vals[i]
			count++
		}
	}
	return v, count
}

// parseRef decodes body when it is grammatical JSON in valid UTF-8 (which
// json.Valid alone does not check) within MaxDepth.
func parseRef(body []byte) (*node, bool) {
	if !json.Valid(body) || !utf8.Valid(body) {
		return nil, false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	n, err := readNode(dec)
	if err != nil || n.depth() > MaxDepth {
		return nil, false
	}
	return n, true
}

// refField checks one optional/required member; check is called when present.
func refField(obj *node, key string, required bool, check func(*node) bool) bool {
	v, count := obj.get(key)
	switch {
	case count > 1:
		return false
	case count == 0:
		return !required
	}
	return check(v)
}

func isString(n *node) bool         { return n.kind == 's' }
func isNonEmptyString(n *node) bool { return n.kind == 's' && n.str != "" }

func arrayOf(check func(*node) bool) func(*node) bool {
	return func(n *node) bool {
		if n.kind != 'a' {
			return false
		}
		for _, e := range n.elems {
			if e.kind != 'o' || !check(e) {
				return false
			}
		}
		return true
	}
}

// exactlySpelled reports whether no key of obj is a known name in another spelling that
// encoding/json would match to it (bytes.EqualFold, which is how it matches struct fields).
func exactlySpelled(obj *node, names ...string) bool {
	for _, k := range obj.keys {
		for _, n := range names {
			if k != n && bytes.EqualFold([]byte(k), []byte(n)) {
				return false
			}
		}
	}
	return true
}

func refAgentJob(body []byte) bool {
	n, ok := parseRef(body)
	return ok && n.kind == 'o' && exactlySpelled(n, "prompt") && refField(n, "prompt", true, isNonEmptyString)
}

func refAssistantMessage(body []byte) bool {
	n, ok := parseRef(body)
	if !ok || n.kind != 'o' {
		return false
	}
	message := func(m *node) bool {
		return exactlySpelled(m, "id", "role", "content", "parts") &&
			refField(m, "id", true, isString) &&
			refField(m, "role", true, isString) &&
			refField(m, "content", true, isString) &&
			refField(m, "parts", false, arrayOf(refPart))
	}
	return refField(n, "fp", true, isNonEmptyString) &&
		refField(n, "messages", true, arrayOf(message)) &&
		refSharedFields(n)
}

func refPart(p *node) bool { return exactlySpelled(p, "type") && refField(p, "type", true, isString) }

// refSharedFields checks the top-level spellings and the members both assistant versions
// share: threadId, retrievalPageSize, filter, context, currentPath.
func refSharedFields(n *node) bool {
	ctx := func(c *node) bool {
		return exactlySpelled(c, "value", "type") &&
			refField(c, "value", true, isString) &&
			refField(c, "type", false, func(t *node) bool {
				return t.kind == 's' && (t.str == "code" || t.str == "textSelection")
			})
	}
	return exactlySpelled(n, "fp", "messages", "threadId", "retrievalPageSize", "filter", "context", "currentPath") &&
		refField(n, "threadId", false, func(t *node) bool { return t.kind == 's' || t.kind == 'z' }) &&
		refField(n, "retrievalPageSize", false, func(t *node) bool {
			if t.kind != 'n' {
				return false
			}
			f, err := strconv.ParseFloat(string(t.num), 64)
			return err == nil && f > 0
		}) &&
		refField(n, "filter", false, func(t *node) bool { return t.kind == 'o' || t.kind == 'z' }) &&
		refField(n, "context", false, arrayOf(ctx)) &&
		refField(n, "currentPath", false, func(t *node) bool {
			return t.kind == 's' && utf8.RuneCountInString(t.str) <= maxCurrentPath
		})
}

// exactFields decodes an object into its members keyed by exact name, so the
// typed checks below see the members the validator checked; what a Go
// upstream decodes (case-insensitively) is checked in gojson_test.go.
func exactFields(raw []byte) (map[string]json.RawMessage, error) {
	var m map[string]json.RawMessage
	err := json.Unmarshal(raw, &m)
	return m, err
}

// typedAgentJob is what an upstream would decode from an accepted job body.
type typedAgentJob struct {
	Prompt string
}

func decodeAgentJob(body []byte) (typedAgentJob, error) {
	var j typedAgentJob
	m, err := exactFields(body)
	if err != nil {
		return j, err
	}
	if err := json.Unmarshal(m["prompt"], &j.Prompt); err != nil {
		return j, err
	}
	if j.Prompt == "" {
		return j, errors.New("empty prompt")
	}
	return j, nil
}

type typedPart struct{ Type string }

type typedMessage struct {
	ID, Role, Content string
	Parts             []typedPart
}

type typedContext struct{ Value, Type string }

type typedAssistant struct {
	Fp                string
	Messages          []typedMessage
	ThreadID          *string
	RetrievalPageSize *float64
	Filter            map[string]any
	Context           []typedContext
	CurrentPath       *string
}

// strictString unmarshals raw into a string, refusing null (which
// encoding/json would silently turn into "").
func strictString(raw json.RawMessage, dst *string) error {
	if raw == nil || string(raw) == "null" {
		return errors.New("missing or null string")
	}
	return json.Unmarshal(raw, dst)
}

func decodeAssistant(body []byte) (typedAssistant, error) {
	var a typedAssistant
	m, err := exactFields(body)
	if err != nil {
		return a, err
	}
	if err := strictString(m["fp"], &a.Fp); err != nil || a.Fp == "" {
		return a, errors.New("fp")
	}
	var msgs []json.RawMessage
	if err := json.Unmarshal(m["messages"], &msgs); err != nil || msgs == nil {
		return a, errors.New("messages")
	}
	for _, raw := range msgs {
		mm, err := exactFields(raw)
		if err != nil || mm == nil {
			return a, errors.New("message")
		}
		var msg typedMessage
		for key, dst := range map[string]*string{"id": &msg.ID, "role": &msg.Role, "content": &msg.Content} {
			if err := strictString(mm[key], dst); err != nil {
				return a, errors.New("message." + key)
			}
		}
		if p, ok := mm["parts"]; ok {
			var parts []json.RawMessage
			if err := json.Unmarshal(p, &parts); err != nil || parts == nil {
				return a, errors.New("parts")
			}
			for _, praw := range parts {
				pm, err := exactFields(praw)
				var part typedPart
				if err != nil || pm == nil || strictString(pm["type"], &part.Type) != nil {
					return a, errors.New("part.type")
				}
				msg.Parts = append(msg.Parts, part)
			}
		}
		a.Messages = append(a.Messages, msg)
	}
	if raw, ok := m["threadId"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &a.ThreadID); err != nil {
			return a, err
		}
	}
	if raw, ok := m["retrievalPageSize"]; ok {
		if err := json.Unmarshal(raw, &a.RetrievalPageSize); err != nil || a.RetrievalPageSize == nil || !(*a.RetrievalPageSize > 0) {
			return a, errors.New("retrievalPageSize")
		}
	}
	if raw, ok := m["filter"]; ok {
		if err := json.Unmarshal(raw, &a.Filter); err != nil {
			return a, err
		}
	}
	if raw, ok := m["context"]; ok {
		var items []json.RawMessage
		if err := json.Unmarshal(raw, &items); err != nil || items == nil {
			return a, errors.New("context")
		}
		for _, craw := range items {
			cm, err := exactFields(craw)
			var c typedContext
			if err != nil || cm == nil || strictString(cm["value"], &c.Value) != nil {
				return a, errors.New("context.value")
			}
			if t, ok := cm["type"]; ok {
				if strictString(t, &c.Type) != nil || (c.Type != "code" && c.Type != "textSelection") {
					return a, errors.New("context.type")
				}
			}
			a.Context = append(a.Context, c)
		}
	}
	if raw, ok := m["currentPath"]; ok {
		if err := strictString(raw, new(string)); err != nil {
			return a, err
		}
		_ = json.Unmarshal(raw, &a.CurrentPath)
		if utf8.RuneCountInString(*a.CurrentPath) > maxCurrentPath {
			return a, errors.New("currentPath too long")
		}
	}
	return a, nil
}
