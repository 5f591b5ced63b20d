package validate

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// What a Go upstream reads (issue 20, finding 3): encoding/json decodes an object key into
// the struct field of that exact name, else into one whose name equals it under Unicode case
// folding, and the last such key wins. Whatever the validators accept must decode, through
// encoding/json into the upstream's structs, to the very values they validated (the members
// of exactly those names, as the reference model reads them).

type goAgentJob struct {
	Prompt *string `json:"prompt"`
}

type goPart struct {
	Type *string `json:"type"`
}

type goMessage struct {
	ID      *string  `json:"id"`
	Role    *string  `json:"role"`
	Content *string  `json:"content"`
	Parts   []goPart `json:"parts"`
}

type goContext struct {
	Value *string `json:"value"`
	Type  *string `json:"type"`
}

type goAssistant struct {
	Fp                *string        `json:"fp"`
	Messages          []goMessage    `json:"messages"`
	ThreadID          *string        `json:"threadId"`
	RetrievalPageSize *float64       `json:"retrievalPageSize"`
	Filter            map[string]any `json:"filter"`
	Context           []goContext    `json:"context"`
	CurrentPath       *string        `json:"currentPath"`
}

// sameString compares a decoded *string with the exact member key of obj (absent or null:
// nil).
func sameString(obj *node, key string, got *string) error {
	v, _ := obj.get(key)
	switch {
	case v == nil || v.kind == 'z':
		if got != nil {
			return fmt.Errorf("%s: Go decoded %q where the body has none", key, *got)
		}
	case got == nil:
		return fmt.Errorf("%s: Go decoded nothing where the body has %q", key, v.str)
	case *got != v.str:
		return fmt.Errorf("%s: Go decoded %q, the validator checked %q", key, *got, v.str)
	}
	return nil
}

// goAgentJobAgrees decodes an accepted job body as a Go upstream does and compares.
func goAgentJobAgrees(body []byte) error {
	n, ok := parseRef(body)
	if !ok {
		return fmt.Errorf("accepted body the reference cannot parse")
	}
	var j goAgentJob
	if err := json.Unmarshal(body, &j); err != nil {
		return fmt.Errorf("Go cannot decode it: %w", err)
	}
	return sameString(n, "prompt", j.Prompt)
}

// goAssistantAgrees decodes an accepted assistant body as a Go upstream does and compares
// every validated member.
func goAssistantAgrees(body []byte) error {
	n, ok := parseRef(body)
	if !ok {
		return fmt.Errorf("accepted body the reference cannot parse")
	}
	var a goAssistant
	if err := json.Unmarshal(body, &a); err != nil {
		return fmt.Errorf("Go cannot decode it: %w", err)
	}
	for _, c := range []struct {
		key string
		got *string
	}{{"fp", a.Fp}} {
		if err := sameString(n, c.key, c.got); err != nil {
			return err
		}
	}
	msgs, _ := n.get("messages")
	if len(msgs.elems) != len(a.Messages) {
		return fmt.Errorf("messages: Go decoded %d, the validator checked %d", len(a.Messages), len(msgs.elems))
	}
	for i, m := range msgs.elems {
		g := a.Messages[i]
		for _, c := range []struct {
			key string
			got *string
		}{{"id", g.ID}, {"role", g.Role}, {"content", g.Content}} {
			if err := sameString(m, c.key, c.got); err != nil {
				return fmt.Errorf("messages[%d].%w", i, err)
			}
		}
		if err := sameParts(m, i, g.Parts); err != nil {
			return err
		}
	}
	return goV1FieldsAgree(n, body)
}

// sameParts compares messages[i].parts of the body with the parts Go decoded.
func sameParts(m *node, i int, got []goPart) error {
	parts, _ := m.get("parts")
	if parts == nil {
		if got != nil {
			return fmt.Errorf("messages[%d].parts: Go decoded %d parts where the body has none", i, len(got))
		}
		return nil
	}
	if len(parts.elems) != len(got) {
		return fmt.Errorf("messages[%d].parts: Go decoded %d, the validator checked %d", i, len(got), len(parts.elems))
	}
	for j, p := range parts.elems {
		if err := sameString(p, "type", got[j].Type); err != nil {
			return fmt.Errorf("messages[%d].parts[%d].%w", i, j, err)
		}
	}
	return nil
}

// Where FuzzFoldedKeys puts its key: an object of each kind the validators check.
var foldedKeyPlaces = []struct {
	validator string // "agent", "assistant" or "v2"
	format    string // %s is the member "key": value
}{
	{"agent", `{"prompt":"p",%s}`},
	{"agent", `{%s,"prompt":"p"}`},
	{"assistant", `{"fp":"u","messages":[{"id":"1","role":"user","content":"c"}],%s}`},
	{"assistant", `{%s,"fp":"u","messages":[]}`},
	{"assistant", `{"fp":"u","messages":[{"id":"1","role":"user","content":"c",%s}]}`},
	{"assistant", `{"fp":"u","messages":[{"id":"1","role":"user","content":"c","parts":[{"type":"text",%s}]}]}`},
	{"assistant", `{"fp":"u","messages":[],"context":[{"value":"v",%s}]}`},
	{"assistant", `{"fp":"u","messages":[],"context":[{%s,"value":"v","type":"code"}]}`},
	{"v2", `{"fp":"u","messages":[{"id":"1","role":"user","parts":[]}],%s}`},
	{"v2", `{"fp":"u","messages":[{"id":"1","role":"user","parts":[],%s}]}`},
	{"v2", `{"fp":"u","messages":[{%s,"id":"1","role":"user","parts":[{"type":"text"}]}]}`},
	{"v2", `{"fp":"u","messages":[{"id":"1","role":"user","parts":[{"type":"text",%s}]}]}`},
	{"v2", `{"fp":"u","messages":[{"id":"1","role":"user","parts":[]}],"context":[{"value":"v",%s}]}`},
}

// jsonKey renders key as a JSON string: as it is, or with every non-ASCII character (or
// every character) as a \u escape, which decoders unescape before matching.
func jsonKey(key string, escape uint8) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range key {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20 || escape%3 == 2 || (escape%3 == 1 && r >= utf8.RuneSelf):
			if r > 0xFFFF {
				hi, lo := utf16Pair(r)
				fmt.Fprintf(&b, `\u%04x\u%04x`, hi, lo)
			} else {
				fmt.Fprintf(&b, `\u%04x`, r)
			}
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}

func utf16Pair(r rune) (rune, rune) {
	r -= 0x10000
	return 0xD800 + (r>>10)&0x3FF, 0xDC00 + r&0x3FF
}

// FuzzFoldedKeys puts a fuzzer-chosen key, spelled as is or escaped, with a fuzzer-chosen
// value, into each object the validators check, and holds both to the contract of
// checkProperties, Go's own decoding included. Its seeds are the spellings of the issue:
// case variants, U+017F for 's', U+212A for 'k', escapes.
func FuzzFoldedKeys(f *testing.F) {
	for _, seed := range []struct {
		key, value string
	}{
		{"MESSAGES", `[{"id":"1","role":"user","content":5}]`},
		{"meſſages", `[{"id":"1","role":7,"content":"c"}]`},
		{"PROMPT", `""`},
		{"Prompt", `"x"`},
		{"pRoMpT", `1`},
		{"FP", `""`},
		{"ROLE", `null`},
		{"Parts", `[{"type":1}]`},
		{"TYPE", `"image"`},
		{"Value", `3`},
		{"currentpath", `"` + strings.Repeat("a", 300) + `"`},
		{"retrievalpagesize", `-1`},
		{"threadid", `7`},
		{"conteXt", `{}`},
		{"\u212aey", `1`},
		{"prompts", `1`},
		{"ſ", `1`},
		{"fıp", `1`},
		{"id", `"dup"`},
		{"", `1`},
	} {
		for place := range foldedKeyPlaces {
			f.Add(uint8(place), seed.key, seed.value, uint8(0))
		}
		f.Add(uint8(4), seed.key, seed.value, uint8(1))
		f.Add(uint8(2), seed.key, seed.value, uint8(2))
	}
	f.Fuzz(func(t *testing.T, where uint8, key, value string, escape uint8) {
		place := foldedKeyPlaces[int(where)%len(foldedKeyPlaces)]
		body := []byte(fmt.Sprintf(place.format, jsonKey(key, escape)+":"+value))
		switch place.validator {
		case "agent":
			checkAgentJob(t, body)
		case "v2":
			checkAssistantMessageV2(t, body)
		default:
			checkAssistantMessage(t, body)
		}
	})
}

// TestFoldedSpellingsFitTheKeyBuffer: foldedName compares keys unescaped into keyBufLen
// bytes and skips longer ones, and filters by length assuming ASCII names; both hold only if
// every spelling a case-insensitive decoder matches to a known name fits the buffer and every
// known name is ASCII. Spellings are built from each letter's whole simple-fold orbit.
func TestFoldedSpellingsFitTheKeyBuffer(t *testing.T) {
	all := [][]string{agentNames[:], assistantNames[:], messageNames[:], messageNamesV2[:], partNames[:], contextNames[:]}
	for _, names := range all {
		for _, name := range names {
			longest := 0
			for _, c := range name {
				if c >= utf8.RuneSelf {
					t.Fatalf("%q is not ASCII", name)
				}
				widest := utf8.RuneLen(c)
				for r := unicode.SimpleFold(c); r != c; r = unicode.SimpleFold(r) {
					widest = max(widest, utf8.RuneLen(r))
				}
				longest += widest
			}
			if longest > keyBufLen {
				t.Fatalf("%q has spellings of %d bytes, past the key buffer (%d)", name, longest, keyBufLen)
			}
		}
	}
}

// The bodies, and their kin, as the gateway's validators now answer them.
func TestCaseFoldedKeysRefused(t *testing.T) {
	valid := `[{"id":"1","role":"user","content":"c"}]`
	for _, c := range []struct {
		fn    func([]byte) error
		body  string
		field string
	}{
		{AssistantMessage, `{"fp":"u","messages":` + valid + `,"MESSAGES":[{"id":1}]}`, "messages"},
		{AssistantMessage, `{"fp":"u","MESSAGES":[{"id":1}],"messages":` + valid + `}`, "messages"},
		{AssistantMessage, `{"fp":"u","messages":` + valid + `,"meſſages":[{"id":1}]}`, "messages"},
		{AssistantMessage, `{"fp":"u","messages":` + valid + `,"me\u017f\u017fages":[]}`, "messages"},
		{AssistantMessage, `{"fp":"u","messages":` + valid + `,"Fp":""}`, "fp"},
		{AssistantMessage, `{"fp":"u","messages":[{"id":"1","role":"user","content":"c","ROLE":7}]}`, "messages[0].role"},
		{AssistantMessage, `{"fp":"u","messages":[{"id":"1","role":"user","content":"c","parts":[{"type":"t","TYPE":1}]}]}`, "messages[0].parts[0].type"},
		{AssistantMessage, `{"fp":"u","messages":[],"context":[{"value":"v","Type":"image"}]}`, "context[0].type"},
		{AssistantMessage, `{"fp":"u","messages":[],"CurrentPath":"x"}`, "currentPath"},
		{AgentJob, `{"prompt":"a valid prompt","PROMPT":""}`, "prompt"},
		{AgentJob, `{"PROMPT":"","prompt":"a valid prompt"}`, "prompt"},
		{AgentJob, `{"prompt":"a","\u0050rompt":""}`, "prompt"},
		{AgentJob, `{"Prompt":"a"}`, "prompt"},
	} {
		err := c.fn([]byte(c.body))
		ve, ok := err.(*Error)
		if !ok || !ve.CaseFolded || ve.Field != c.field {
			t.Errorf("%s: %v, want a case-folded error naming %s", c.body, err, c.field)
		}
	}
	// Keys that only contain a known name, or fold to none, stay unknown fields.
	for _, body := range []string{`{"prompt":"a","prompts":1,"xprompt":2,"promp":3,"prompſ":4,"ſ":5}`} {
		if err := AgentJob([]byte(body)); err != nil {
			t.Errorf("%s: %v", body, err)
		}
	}
}
