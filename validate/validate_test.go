package validate

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

type tcase struct {
	name   string
	body   string
	field  string // expected Error.Field
	reason string // expected Error.Reason; "" (with field "") means valid; a prefix for syntax errors
}

// msg is a valid message, used to build assistant bodies.
const msg = `{"id":"m1","role":"user","content":"How do I rotate an API key?"}`

// asst builds an assistant body from a fragment of extra top-level members.
func asst(extra string) string {
	body := `{"fp":"fp-1","messages":[` + msg + `]`
	if extra != "" {
		body += "," + extra
	}
	return body + "}"
}

const syntax = "is not valid JSON: "

func check(t *testing.T, fn func([]byte) error, tc tcase) {
	t.Helper()
	err := fn([]byte(tc.body))
	if tc.field == "" && tc.reason == "" {
		if err != nil {
			t.Fatalf("body %s: unexpected error %v", tc.body, err)
		}
		return
	}
	var ve *Error
	if !errors.As(err, &ve) {
		t.Fatalf("body %s: got %v (%T), want *Error{%q, %q}", tc.body, err, err, tc.field, tc.reason)
	}
	if ve.Field != tc.field || !(ve.Reason == tc.reason || strings.HasPrefix(tc.reason, syntax) && strings.HasPrefix(ve.Reason, tc.reason)) {
		t.Fatalf("body %s: got {%q, %q}, want {%q, %q}", tc.body, ve.Field, ve.Reason, tc.field, tc.reason)
	}
}

// grammarCases apply to both operations: the JSON grammar is checked before
// or regardless of the schema.
var grammarCases = []tcase{
	{"empty body", ``, "", "is empty: expected a JSON object"},
	{"only whitespace", " \n\t", "", "is empty: expected a JSON object"},
	{"top-level array", `[1,2]`, "", reasonBodyObject},
	{"top-level string", `"prompt"`, "", reasonBodyObject},
	{"top-level null", ` null `, "", reasonBodyObject},
	{"top-level number", `42`, "", reasonBodyObject},
	{"bad top-level literal", `tru`, "", syntax + "unexpected end of input"},
	{"broken top-level array", `[1,]`, "", syntax + "unexpected character ']'"},
	{"garbage", `hello`, "", syntax + "unexpected character 'h'"},
	{"utf-8 BOM", "\xef\xbb\xbf{}", "", syntax + "unexpected byte 0xEF"},
	{"unterminated object", `{"prompt":"a"`, "", syntax + "unexpected end of input"},
	{"trailing garbage", `{"prompt":"a"}x`, "", syntax + "unexpected character 'x' after the top-level value"},
	{"two objects", `{"prompt":"a"}{}`, "", syntax + "unexpected character '{' after the top-level value"},
	{"trailing comma", `{"prompt":"a",}`, "", syntax + "unexpected character '}'"},
	{"missing colon", `{"prompt" "a"}`, "", syntax + "unexpected character '\"'"},
	{"single quotes", `{'prompt':'a'}`, "", syntax + "unexpected character '\\''"},
	{"unquoted key", `{prompt:"a"}`, "", syntax + "unexpected character 'p'"},
	{"raw newline in string", "{\"x\":\"a\nb\",\"prompt\":\"a\"}", "", syntax + "control character byte 0x0A in a string must be escaped"},
	{"raw NUL in string", "{\"x\":\"a\x00\"}", "", syntax + "control character byte 0x00"},
	{"NUL outside string", "{\"x\":1\x00}", "", syntax + "unexpected byte 0x00"},
	{"invalid utf-8", "{\"x\":\"\xff\"}", "", syntax + "invalid UTF-8"},
	{"truncated utf-8", "{\"x\":\"\xe2\x82\"}", "", syntax + "invalid UTF-8"},
	{"utf-8 encoded surrogate", "{\"x\":\"\xed\xa0\x80\"}", "", syntax + "invalid UTF-8"},
	{"overlong utf-8", "{\"x\":\"\xc0\xaf\"}", "", syntax + "invalid UTF-8"},
	{"bad escape", `{"x":"\x"}`, "", syntax + "invalid escape sequence"},
	{"short unicode escape", `{"x":"\u12"}`, "", syntax + "invalid \\u escape"},
	{"unicode escape at eof", `{"x":"\u12`, "", syntax + "unexpected end of input"},
	{"leading zero", `{"x":01}`, "", syntax + "unexpected character '1'"},
	{"bare minus", `{"x":-}`, "", syntax + "unexpected character '}' in a number"},
	{"dot without digits", `{"x":1.}`, "", syntax + "expected a digit after the decimal point"},
	{"exponent without digits", `{"x":1e+}`, "", syntax + "expected a digit in the exponent"},
	{"leading plus", `{"x":+1}`, "", syntax + "unexpected character '+'"},
	{"NaN", `{"x":NaN}`, "", syntax + "unexpected character 'N'"},
	{"bad literal", `{"x":nul}`, "", syntax + "unexpected character '}'"},
	{"capitalised literal", `{"x":True}`, "", syntax + "unexpected character 'T'"},
	{"deep unknown field", `{"x":` + strings.Repeat("[", MaxDepth) + strings.Repeat("]", MaxDepth) + `}`, "", reasonTooDeep},
	{"hostile nesting", `{"x":` + strings.Repeat("[", 100000), "", reasonTooDeep},
	{"hostile nesting at top", strings.Repeat("[", 100000), "", reasonTooDeep},
	{"hostile object nesting", strings.Repeat(`{"a":`, 100000), "", reasonTooDeep},
}

func agentCases() []tcase {
	return []tcase{
		{"minimal", `{"prompt":"Summarise the changelog"}`, "", ""},
		{"whitespace everywhere", " \r\n\t{ \"prompt\" : \"a\" } \n", "", ""},
		{"escaped prompt", `{"prompt":"\u0041"}`, "", ""},
		{"escaped key", `{"pr\u006fmpt":"a"}`, "", ""},
		{"lone surrogate escape", `{"prompt":"\ud800"}`, "", ""},
		{"unicode prompt", `{"prompt":"héllo 世界 🚀"}`, "", ""},
		{"unknown fields of every type", `{"a":1,"b":-0.5e10,"c":true,"d":false,"e":null,"f":[{}],"g":{"h":[1,"x"]},"prompt":"p","Prompts":5}`, "", ""},
		{"nesting at MaxDepth", `{"prompt":"a","x":` + strings.Repeat("[", MaxDepth-1) + strings.Repeat("]", MaxDepth-1) + `}`, "", ""},
		{"missing prompt", `{}`, "prompt", reasonRequired},
		{"prompt wrong case", `{"Prompt":"a"}`, "prompt", `must be spelled exactly: "Prompt" would be read as this field by a case-insensitive JSON decoder`},
		{"prompt twin in capitals", `{"prompt":"a","PROMPT":""}`, "prompt", `must be spelled exactly: "PROMPT" would be read as this field by a case-insensitive JSON decoder`},
		{"empty prompt", `{"prompt":""}`, "prompt", reasonNonEmptyString},
		{"null prompt", `{"prompt":null}`, "prompt", reasonNonEmptyString},
		{"number prompt", `{"prompt":42}`, "prompt", reasonNonEmptyString},
		{"array prompt", `{"prompt":["a"]}`, "prompt", reasonNonEmptyString},
		{"malformed prompt value", `{"prompt":tru}`, "", syntax + "unexpected character '}'"},
		{"duplicate prompt", `{"prompt":"a","prompt":"b"}`, "prompt", reasonDuplicated},
		{"duplicate via escape", `{"prompt":"a","pr\u006fmpt":""}`, "prompt", reasonDuplicated},
		{"first problem wins", `{"prompt":"","x":tru}`, "prompt", reasonNonEmptyString},
	}
}

func TestAgentJob(t *testing.T) {
	for _, tc := range append(agentCases(), grammarCases...) {
		t.Run(tc.name, func(t *testing.T) { check(t, AgentJob, tc) })
	}
}

func assistantCases() []tcase {
	long := strings.Repeat("é", maxCurrentPath)
	return []tcase{
		{"minimal", asst(""), "", ""},
		{"empty messages", `{"fp":"f","messages":[]}`, "", ""},
		{"full", asst(`"threadId":"t1","retrievalPageSize":5,"filter":{"version":["v2",{"x":null}]},` +
			`"context":[{"value":"x := 1","type":"code","elementId":"e","path":"/p"},{"value":"sel","type":"textSelection"},{"value":""}],` +
			`"currentPath":"/docs/api","extra":{"any":[1,2,3]}`), "", ""},
		{"parts", `{"fp":"f","messages":[{"id":"1","role":"assistant","content":"c","parts":[{"type":"text","text":"hi"},{"type":"tool","args":{"a":[1]}}]}]}`, "", ""},
		{"empty parts", `{"fp":"f","messages":[{"id":"1","role":"user","content":"","parts":[]}]}`, "", ""},
		{"null threadId", asst(`"threadId":null`), "", ""},
		{"null filter", asst(`"filter":null`), "", ""},
		{"fractional page size", asst(`"retrievalPageSize":0.5`), "", ""},
		{"exponent page size", asst(`"retrievalPageSize":1E2`), "", ""},
		{"currentPath at limit", asst(`"currentPath":"` + long + `"`), "", ""},
		{"currentPath at limit, escaped", asst(`"currentPath":"` + strings.Repeat(`\ud83d\ude00`, maxCurrentPath) + `"`), "", ""},
		{"escaped context type", asst(`"context":[{"value":"v","type":"c\u006fde"}]`), "", ""},
		{"unknown field keys that are no known name", asst(`"FPS":1,"Message":"x","Ids":[]`), "", ""},
		{"known name in capitals", asst(`"FP":1`), "fp", `must be spelled exactly: "FP" would be read as this field by a case-insensitive JSON decoder`},
		{"known name with a long s", asst(`"meſſages":[]`), "messages", `must be spelled exactly: "me\u017f\u017fages" would be read as this field by a case-insensitive JSON decoder`},

		{"missing fp", `{"messages":[]}`, "fp", reasonRequired},
		{"missing messages", `{"fp":"f"}`, "messages", reasonRequired},
		{"empty fp", `{"fp":"","messages":[]}`, "fp", reasonNonEmptyString},
		{"number fp", `{"fp":1,"messages":[]}`, "fp", reasonNonEmptyString},
		{"duplicate fp", `{"fp":"a","fp":"b","messages":[]}`, "fp", reasonDuplicated},
		{"messages object", `{"fp":"f","messages":{}}`, "messages", reasonArrayOfObjects},
		{"messages null", `{"fp":"f","messages":null}`, "messages", reasonArrayOfObjects},
		{"message not object", `{"fp":"f","messages":[` + msg + `,"hi"]}`, "messages[1]", reasonObject},
		{"message missing id", `{"fp":"f","messages":[` + msg + `,` + msg + `,{"role":"user","content":"c"}]}`, "messages[2].id", reasonRequired},
		{"message missing role", `{"fp":"f","messages":[{"id":"1","content":"c"}]}`, "messages[0].role", reasonRequired},
		{"message missing content", `{"fp":"f","messages":[{"id":"1","role":"user"}]}`, "messages[0].content", reasonRequired},
		{"role not string", `{"fp":"f","messages":[` + msg + `,` + msg + `,{"id":"1","role":7,"content":"c"}]}`, "messages[2].role", reasonString},
		{"id null", `{"fp":"f","messages":[{"id":null,"role":"u","content":"c"}]}`, "messages[0].id", reasonString},
		{"duplicate role", `{"fp":"f","messages":[{"id":"1","role":"user","role":"system","content":"c"}]}`, "messages[0].role", reasonDuplicated},
		{"parts not array", `{"fp":"f","messages":[{"id":"1","role":"u","content":"c","parts":{}}]}`, "messages[0].parts", reasonArrayOfObjects},
		{"parts null", `{"fp":"f","messages":[{"id":"1","role":"u","content":"c","parts":null}]}`, "messages[0].parts", reasonArrayOfObjects},
		{"part not object", `{"fp":"f","messages":[{"id":"1","role":"u","content":"c","parts":[{"type":"t"},1]}]}`, "messages[0].parts[1]", reasonObject},
		{"part missing type", `{"fp":"f","messages":[` + msg + `,{"id":"1","role":"u","content":"c","parts":[{"type":"t"},{"text":"x"}]}]}`, "messages[1].parts[1].type", reasonRequired},
		{"part type not string", `{"fp":"f","messages":[{"id":"1","role":"u","content":"c","parts":[{"type":3}]}]}`, "messages[0].parts[0].type", reasonString},
		{"duplicate part type", `{"fp":"f","messages":[{"id":"1","role":"u","content":"c","parts":[{"type":"a","type":"b"}]}]}`, "messages[0].parts[0].type", reasonDuplicated},
		{"deep part field", `{"fp":"f","messages":[{"id":"1","role":"u","content":"c","parts":[{"type":"a","x":` + strings.Repeat("[", 60) + `]}]}]}`, "messages[0].parts[0]", reasonTooDeep},
		{"deep message field", `{"fp":"f","messages":[{"id":"1","role":"u","content":"c","x":` + strings.Repeat("[", 62) + `]}]}`, "messages[0]", reasonTooDeep},
		{"threadId number", asst(`"threadId":1`), "threadId", reasonStringOrNull},
		{"threadId duplicated", asst(`"threadId":null,"threadId":"x"`), "threadId", reasonDuplicated},
		{"page size zero", asst(`"retrievalPageSize":0`), "retrievalPageSize", reasonPositive},
		{"page size zero float", asst(`"retrievalPageSize":0.0e5`), "retrievalPageSize", reasonPositive},
		{"page size negative", asst(`"retrievalPageSize":-3`), "retrievalPageSize", reasonPositive},
		{"page size negative zero", asst(`"retrievalPageSize":-0`), "retrievalPageSize", reasonPositive},
		{"page size underflows to zero", asst(`"retrievalPageSize":1e-400`), "retrievalPageSize", reasonPositive},
		{"page size overflows", asst(`"retrievalPageSize":1e400`), "retrievalPageSize", "is out of range"},
		{"page size string", asst(`"retrievalPageSize":"5"`), "retrievalPageSize", reasonPositive},
		{"page size null", asst(`"retrievalPageSize":null`), "retrievalPageSize", reasonPositive},
		{"page size malformed", asst(`"retrievalPageSize":1.`), "", syntax + "expected a digit after the decimal point"},
		{"filter array", asst(`"filter":[]`), "filter", reasonObjectOrNull},
		{"filter string", asst(`"filter":"v2"`), "filter", reasonObjectOrNull},
		{"filter too deep", asst(`"filter":` + strings.Repeat(`{"a":`, MaxDepth) + `1` + strings.Repeat("}", MaxDepth)), "filter", reasonTooDeep},
		{"filter at max depth", asst(`"filter":` + strings.Repeat(`{"a":`, MaxDepth-1) + `1` + strings.Repeat("}", MaxDepth-1)), "", ""},
		{"context object", asst(`"context":{}`), "context", reasonArrayOfObjects},
		{"context null", asst(`"context":null`), "context", reasonArrayOfObjects},
		{"context element string", asst(`"context":["x"]`), "context[0]", reasonObject},
		{"context missing value", asst(`"context":[{"value":"a"},{"type":"code"}]`), "context[1].value", reasonRequired},
		{"context value number", asst(`"context":[{"value":1}]`), "context[0].value", reasonString},
		{"context bad type", asst(`"context":[{"value":"a","type":"image"}]`), "context[0].type", reasonContextType},
		{"context type wrong case", asst(`"context":[{"value":"a","type":"Code"}]`), "context[0].type", reasonContextType},
		{"context type null", asst(`"context":[{"value":"a","type":null}]`), "context[0].type", reasonContextType},
		{"context duplicate value", asst(`"context":[{"value":"a","value":"b"}]`), "context[0].value", reasonDuplicated},
		{"currentPath too long", asst(`"currentPath":"` + long + `x"`), "currentPath", "must be at most 200 characters"},
		{"currentPath too long, escaped", asst(`"currentPath":"` + strings.Repeat(`\u00e9`, maxCurrentPath+1) + `"`), "currentPath", "must be at most 200 characters"},
		{"currentPath lone surrogates count one each", asst(`"currentPath":"` + strings.Repeat(`\udc00`, maxCurrentPath+1) + `"`), "currentPath", "must be at most 200 characters"},
		{"currentPath null", asst(`"currentPath":null`), "currentPath", reasonString},
		{"messages before fp still checked", `{"messages":[{"id":1}],"fp":""}`, "messages[0].id", reasonString},
	}
}

func TestAssistantMessage(t *testing.T) {
	for _, tc := range append(assistantCases(), grammarCases...) {
		t.Run(tc.name, func(t *testing.T) { check(t, AssistantMessage, tc) })
	}
}

// TestErrorMessages pins the end-user wording.
func TestErrorMessages(t *testing.T) {
	cases := []struct {
		fn   func([]byte) error
		body string
		want string
	}{
		{AgentJob, `{}`, "prompt is required"},
		{AgentJob, `{"prompt":""}`, "prompt must be a non-empty string"},
		{AgentJob, `{"prompt":"a","prompt":"a"}`, "prompt is duplicated"},
		{AgentJob, `[]`, "body must be a JSON object"},
		{AgentJob, `{"prompt":"a"`, "body is not valid JSON: unexpected end of input"},
		{AgentJob, `{"prompt":"a"}}`, "body is not valid JSON: unexpected character '}' after the top-level value at byte 14"},
		{AgentJob, "{\"prompt\":\"\x01\"}", "body is not valid JSON: control character byte 0x01 in a string must be escaped at byte 11"},
		{AssistantMessage, `{"fp":"f","messages":[{},{},{"id":"1","role":2}]}`, "messages[0].id is required"},
		{AssistantMessage, `{"fp":"f","messages":[{"id":"1","role":"u","content":"c"},{"id":"1","role":2}]}`, "messages[1].role must be a string"},
		{AssistantMessage, asst(`"context":[{"value":"v","type":"x"}]`), `context[0].type must be "code" or "textSelection"`},
		{AssistantMessage, asst(`"currentPath":"` + strings.Repeat("a", 201) + `"`), "currentPath must be at most 200 characters"},
		{AssistantMessage, asst(`"filter":` + strings.Repeat("[", 1000)), "filter must be an object or null"},
		{AssistantMessage, asst(`"filter":` + strings.Repeat(`{"a":`, 1000)), "filter is nested too deeply (at most 64 levels of objects and arrays are allowed)"},
	}
	for _, tc := range cases {
		err := tc.fn([]byte(tc.body))
		if err == nil || err.Error() != tc.want {
			t.Errorf("body %.60s: got %v, want %q", tc.body, err, tc.want)
		}
	}
}

func TestReasonTooDeepMentionsMaxDepth(t *testing.T) {
	if !strings.Contains(reasonTooDeep, "at most 64 ") || MaxDepth != 64 {
		t.Fatalf("reasonTooDeep %q is out of step with MaxDepth %d", reasonTooDeep, MaxDepth)
	}
}

// TestNilOnValid guards against returning a typed nil *Error, which would be
// a non-nil error interface.
func TestNilOnValid(t *testing.T) {
	if err := AgentJob([]byte(`{"prompt":"a"}`)); err != nil {
		t.Fatal(err)
	}
	if err := AssistantMessage([]byte(asst(""))); err != nil {
		t.Fatal(err)
	}
}

// TestDoesNotModifyBody checks the forwarding contract: validation never
// writes to the body.
func TestDoesNotModifyBody(t *testing.T) {
	body := []byte(asst(`"currentPath":"\u00e9\ud83d\ude00","context":[{"value":"\n","type":"c\u006fde"}]`))
	orig := string(body)
	if err := AssistantMessage(body); err != nil {
		t.Fatal(err)
	}
	if string(body) != orig {
		t.Fatal("body was modified")
	}
}

func TestHostileNestingIsFast(t *testing.T) {
	body := []byte(`{"prompt":"a","x":` + strings.Repeat("[", 10<<20))
	res := testing.Benchmark(func(b *testing.B) {
		for b.Loop() {
			_ = AgentJob(body)
		}
	})
	// Rejected after MaxDepth brackets, not after 10 MiB of them: faster than a tenth of one
	// pass of bytes.IndexByte (vectorised) over the 10 MiB, measured on this machine, now (a
	// fixed number of nanoseconds fails on a loaded machine under -race).
	pass := testing.Benchmark(func(b *testing.B) {
		for b.Loop() {
			_ = bytes.IndexByte(body, 0)
		}
	})
	if per, scan := res.NsPerOp(), pass.NsPerOp(); per > scan/10 {
		t.Fatalf("hostile nesting took %d ns/op, one pass over the body %d ns", per, scan)
	} else {
		t.Logf("hostile nesting %d ns/op, one pass over the body %d ns", per, scan)
	}
}
