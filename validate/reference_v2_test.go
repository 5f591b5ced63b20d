package validate

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
)

// The reference model, typed decoding and Go's own decoding of the v2 body, as for v1 in
// reference_test.go and gojson_test.go.

func refAssistantMessageV2(body []byte) bool {
	n, ok := parseRef(body)
	if !ok || n.kind != 'o' {
		return false
	}
	message := func(m *node) bool {
		return exactlySpelled(m, "id", "role", "parts") &&
			refField(m, "id", true, isString) &&
			refField(m, "role", true, isString) &&
			refField(m, "parts", true, arrayOf(refPart))
	}
	return refField(n, "fp", true, isString) &&
		refField(n, "messages", true, func(m *node) bool { return arrayOf(message)(m) && len(m.elems) > 0 }) &&
		refSharedFields(n)
}

// typedAssistantV2Err decodes an accepted v2 body as an upstream would, by exact names, and
// checks the rules hold.
func typedAssistantV2Err(body []byte) error {
	m, err := exactFields(body)
	if err != nil {
		return err
	}
	var fp string
	if err := strictString(m["fp"], &fp); err != nil {
		return errors.New("fp")
	}
	var msgs []json.RawMessage
	if err := json.Unmarshal(m["messages"], &msgs); err != nil || len(msgs) == 0 {
		return errors.New("messages")
	}
	for _, raw := range msgs {
		mm, err := exactFields(raw)
		if err != nil || mm == nil {
			return errors.New("message")
		}
		var id, role string
		if strictString(mm["id"], &id) != nil || strictString(mm["role"], &role) != nil {
			return errors.New("message id or role")
		}
		var parts []json.RawMessage
		if err := json.Unmarshal(mm["parts"], &parts); err != nil || parts == nil {
			return errors.New("parts")
		}
		for _, praw := range parts {
			pm, err := exactFields(praw)
			var typ string
			if err != nil || pm == nil || strictString(pm["type"], &typ) != nil {
				return errors.New("part.type")
			}
		}
	}
	// The v1 fields: the same rules, the same decoding (a v1 body with these members and a
	// placeholder message).
	rest := map[string]json.RawMessage{"fp": json.RawMessage(`"x"`), "messages": json.RawMessage(`[]`)}
	for _, k := range []string{"threadId", "retrievalPageSize", "filter", "context", "currentPath"} {
		if v, ok := m[k]; ok {
			rest[k] = v
		}
	}
	b, _ := json.Marshal(rest)
	_, err = decodeAssistant(b)
	return err
}

type goMessageV2 struct {
	ID    *string  `json:"id"`
	Role  *string  `json:"role"`
	Parts []goPart `json:"parts"`
}

type goAssistantV2 struct {
	Fp       *string       `json:"fp"`
	Messages []goMessageV2 `json:"messages"`
}

// goAssistantV2Agrees decodes an accepted v2 body as a Go upstream does (case-insensitive
// field names) and compares the v2 members; the v1 members go through goAssistantAgrees.
func goAssistantV2Agrees(body []byte) error {
	n, ok := parseRef(body)
	if !ok {
		return fmt.Errorf("accepted body the reference cannot parse")
	}
	var a goAssistantV2
	if err := json.Unmarshal(body, &a); err != nil {
		return fmt.Errorf("Go cannot decode it: %w", err)
	}
	if err := sameString(n, "fp", a.Fp); err != nil {
		return err
	}
	msgs, _ := n.get("messages")
	if len(msgs.elems) != len(a.Messages) {
		return fmt.Errorf("messages: Go decoded %d, the validator checked %d", len(a.Messages), len(msgs.elems))
	}
	for i, m := range msgs.elems {
		g := a.Messages[i]
		if err := sameString(m, "id", g.ID); err != nil {
			return fmt.Errorf("messages[%d].%w", i, err)
		}
		if err := sameString(m, "role", g.Role); err != nil {
			return fmt.Errorf("messages[%d].%w", i, err)
		}
		if err := sameParts(m, i, g.Parts); err != nil {
			return err
		}
	}
	return goV1FieldsAgree(n, body)
}

// goV1FieldsAgree compares the members v2 shares with v1, as goAssistantAgrees does.
func goV1FieldsAgree(n *node, body []byte) error {
	var a struct { // goAssistant without fp and messages, which differ on v2
		ThreadID          *string        `json:"threadId"`
		RetrievalPageSize *float64       `json:"retrievalPageSize"`
		Filter            map[string]any `json:"filter"`
		Context           []goContext    `json:"context"`
		CurrentPath       *string        `json:"currentPath"`
	}
	if err := json.Unmarshal(body, &a); err != nil {
		return fmt.Errorf("Go cannot decode it: %w", err)
	}
	for _, c := range []struct {
		key string
		got *string
	}{{"threadId", a.ThreadID}, {"currentPath", a.CurrentPath}} {
		if err := sameString(n, c.key, c.got); err != nil {
			return err
		}
	}
	if v, _ := n.get("retrievalPageSize"); v == nil {
		if a.RetrievalPageSize != nil {
			return fmt.Errorf("retrievalPageSize: Go decoded %v where the body has none", *a.RetrievalPageSize)
		}
	} else if f, err := strconv.ParseFloat(string(v.num), 64); a.RetrievalPageSize == nil || err != nil || *a.RetrievalPageSize != f {
		return fmt.Errorf("retrievalPageSize: Go decoded %v, the validator checked %s", a.RetrievalPageSize, v.num)
	}
	if v, _ := n.get("filter"); (v != nil && v.kind == 'o') != (a.Filter != nil) {
		return fmt.Errorf("filter: Go decoded %v", a.Filter)
	}
	ctx, _ := n.get("context")
	if ctx == nil {
		if a.Context != nil {
			return fmt.Errorf("context: Go decoded %d items where the body has none", len(a.Context))
		}
		return nil
	}
	if len(ctx.elems) != len(a.Context) {
		return fmt.Errorf("context: Go decoded %d, the validator checked %d", len(a.Context), len(ctx.elems))
	}
	for k, c := range ctx.elems {
		if err := sameString(c, "value", a.Context[k].Value); err != nil {
			return fmt.Errorf("context[%d].%w", k, err)
		}
		if err := sameString(c, "type", a.Context[k].Type); err != nil {
			return fmt.Errorf("context[%d].%w", k, err)
		}
	}
	return nil
}

func checkAssistantMessageV2(t *testing.T, body []byte) {
	t.Helper()
	checkProperties(t, "AssistantMessageV2", AssistantMessageV2, refAssistantMessageV2, typedAssistantV2Err, goAssistantV2Agrees, body)
}

// seedsV2 are the v2 table bodies, the real clients' bodies and the v1 seeds (which v2
// refuses, or accepts when they carry parts).
func seedsV2() []string {
	var out []string
	for _, tc := range assistantV2Cases() {
		if len(tc.body) < 4096 {
			out = append(out, tc.body)
		}
	}
	return append(out, seeds()...)
}

func FuzzAssistantMessageV2(f *testing.F) {
	for _, s := range seedsV2() {
		f.Add([]byte(s))
	}
	f.Add([]byte(asstV2(`"MESSAGES":[{"id":1}]`)))
	f.Add([]byte(`{"fp":"","messages":[{"id":"1","role":"u","parts":[{"type":"t","TYPE":1}],"Parts":[]}]}`))
	f.Fuzz(func(t *testing.T, body []byte) { checkAssistantMessageV2(t, body) })
}

func TestDifferentialV2(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var bodies [][]byte
	for _, s := range seedsV2() {
		bodies = append(bodies, []byte(s))
	}
	bodies = append(bodies, corpusBodies(t)...)
	n := 200
	if testing.Short() {
		n = 20
	}
	accepted := 0
	total := 0
	for _, b := range bodies {
		for _, m := range append([][]byte{b}, mutate(rng, b, n)...) {
			checkAssistantMessageV2(t, m)
			total++
			if AssistantMessageV2(m) == nil {
				accepted++
			}
		}
	}
	t.Logf("%d bodies; AssistantMessageV2 accepted %d", total, accepted)
	if accepted < 100 {
		t.Fatalf("too few accepted bodies to be meaningful: %d", accepted)
	}
}
