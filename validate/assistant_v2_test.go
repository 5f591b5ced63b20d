package validate

import (
	"strings"
	"testing"
)

// msgV2 is a valid AI SDK 5+ message, used to build v2 bodies.
const msgV2 = `{"id":"u1","role":"user","parts":[{"type":"text","text":"How do I rotate a key?"}]}`

// asstV2 builds a v2 body from a fragment of extra top-level members.
func asstV2(extra string) string {
	body := `{"fp":"anonymous","id":"chat1","messages":[` + msgV2 + `],"trigger":"submit-message"`
	if extra != "" {
		body += "," + extra
	}
	return body + "}"
}

// sdkBodies are bodies as the real clients send them: what DefaultChatTransport of ai
// 5.0.277 and 7.0.173 posts with body: {fp} (captured from both; they are the same), a
// follow-up carrying the assistant's answer as readUIMessageStream built it (step-start,
// a done text part, the metadata of the finish chunk), and a regenerate.
var sdkBodies = []string{
	`{"fp":"anonymous","id":"chat1","messages":[{"id":"u1","role":"user","parts":[{"type":"text","text":"How do I rotate a key?"}]}],"trigger":"submit-message"}`,
	`{"fp":"user-42","threadId":"thread_ab12","retrievalPageSize":5,"currentPath":"/guides/keys","id":"chat1","messages":[` +
		`{"id":"u1","role":"user","parts":[{"type":"text","text":"How do I rotate a key?"}]},` +
		`{"id":"msg-9f2c","role":"assistant","metadata":{"threadId":"thread_ab12","usage":{"inputTokens":52,"outputTokens":61}},"parts":[{"type":"step-start"},{"type":"text","text":"Open the dashboard.","state":"done"}]},` +
		`{"id":"u2","role":"user","parts":[{"type":"text","text":"And in Go?"},{"type":"file","mediaType":"text/plain","url":"data:text/plain;base64,aGk="}]}` +
		`],"trigger":"submit-message"}`,
	`{"fp":"anonymous","id":"chat1","messages":[{"id":"u1","role":"user","parts":[{"type":"text","text":"hi"}]}],"trigger":"regenerate-message","messageId":"msg-9f2c"}`,
}

func assistantV2Cases() []tcase {
	long := strings.Repeat("é", maxCurrentPath)
	cases := []tcase{
		{"minimal", `{"fp":"f","messages":[{"id":"1","role":"user","parts":[]}]}`, "", ""},
		{"empty fp is a string", `{"fp":"","messages":[` + msgV2 + `]}`, "", ""},
		{"content beside parts is free", `{"fp":"f","messages":[{"id":"1","role":"user","content":7,"parts":[{"type":"text"}]}]}`, "", ""},
		{"content twice", `{"fp":"f","messages":[{"id":"1","role":"user","content":7,"parts":[{"type":"text"}],"content":null}]}`, "messages[0]", `has a duplicate member "content"`},
		{"v1 fields", asstV2(`"threadId":null,"retrievalPageSize":5,"filter":{"v":[1]},"context":[{"value":"x","type":"code"}],"currentPath":"` + long + `"`), "", ""},
		{"tool part", `{"fp":"f","messages":[{"id":"1","role":"assistant","parts":[{"type":"tool-search","toolCallId":"c1","state":"output-available","input":{"q":"k"},"output":[1]}]}]}`, "", ""},
		{"escaped names", `{"f\u0070":"x","messages":[{"i\u0064":"1","r\u006fle":"u","p\u0061rts":[{"typ\u0065":"t"}]}]}`, "", ""},

		{"missing fp", `{"messages":[` + msgV2 + `]}`, "fp", reasonRequired},
		{"fp number", `{"fp":1,"messages":[` + msgV2 + `]}`, "fp", reasonString},
		{"fp null", `{"fp":null,"messages":[` + msgV2 + `]}`, "fp", reasonString},
		{"duplicate fp", `{"fp":"a","fp":"b","messages":[` + msgV2 + `]}`, "fp", reasonDuplicated},
		{"missing messages", `{"fp":"f"}`, "messages", reasonRequired},
		{"empty messages", `{"fp":"f","messages":[]}`, "messages", reasonNonEmptyArrayOfObjects},
		{"empty messages, spaced", `{"fp":"f","messages":[ ]}`, "messages", reasonNonEmptyArrayOfObjects},
		{"messages object", `{"fp":"f","messages":{}}`, "messages", reasonNonEmptyArrayOfObjects},
		{"messages null", `{"fp":"f","messages":null}`, "messages", reasonNonEmptyArrayOfObjects},
		{"message not object", `{"fp":"f","messages":[` + msgV2 + `,"hi"]}`, "messages[1]", reasonObject},
		{"v4 message", `{"fp":"f","messages":[{"id":"1","role":"user","content":"How do I rotate a key?"}]}`, "messages[0].parts", reasonRequired},
		{"v4 message after a v2 one", `{"fp":"f","messages":[` + msgV2 + `,{"id":"2","role":"user","content":"c"}]}`, "messages[1].parts", reasonRequired},
		{"missing id", `{"fp":"f","messages":[{"role":"user","parts":[]}]}`, "messages[0].id", reasonRequired},
		{"missing role", `{"fp":"f","messages":[{"id":"1","parts":[]}]}`, "messages[0].role", reasonRequired},
		{"id number", `{"fp":"f","messages":[{"id":1,"role":"user","parts":[]}]}`, "messages[0].id", reasonString},
		{"role null", `{"fp":"f","messages":[{"id":"1","role":null,"parts":[]}]}`, "messages[0].role", reasonString},
		{"parts object", `{"fp":"f","messages":[{"id":"1","role":"user","parts":{"type":"text"}}]}`, "messages[0].parts", reasonArrayOfObjects},
		{"parts null", `{"fp":"f","messages":[{"id":"1","role":"user","parts":null}]}`, "messages[0].parts", reasonArrayOfObjects},
		{"part string", `{"fp":"f","messages":[{"id":"1","role":"user","parts":["hi"]}]}`, "messages[0].parts[0]", reasonObject},
		{"part without type", `{"fp":"f","messages":[{"id":"1","role":"user","parts":[{"text":"hi"}]}]}`, "messages[0].parts[0].type", reasonRequired},
		{"part type number", `{"fp":"f","messages":[{"id":"1","role":"user","parts":[{"type":1}]}]}`, "messages[0].parts[0].type", reasonString},
		{"duplicate parts", `{"fp":"f","messages":[{"id":"1","role":"user","parts":[],"parts":[]}]}`, "messages[0].parts", reasonDuplicated},
		{"parts in capitals", `{"fp":"f","messages":[{"id":"1","role":"user","parts":[],"PARTS":[1]}]}`, "messages[0].parts", `must be spelled exactly: "PARTS" would be read as this field by a case-insensitive JSON decoder`},
		{"fp in capitals", asstV2(`"FP":1`), "fp", `must be spelled exactly: "FP" would be read as this field by a case-insensitive JSON decoder`},
		{"threadId number", asstV2(`"threadId":1`), "threadId", reasonStringOrNull},
		{"page size zero", asstV2(`"retrievalPageSize":0`), "retrievalPageSize", reasonPositive},
		{"filter array", asstV2(`"filter":[]`), "filter", reasonObjectOrNull},
		{"context bad type", asstV2(`"context":[{"value":"a","type":"image"}]`), "context[0].type", reasonContextType},
		{"currentPath too long", asstV2(`"currentPath":"` + long + `x"`), "currentPath", "must be at most 200 characters"},
	}
	for i, b := range sdkBodies {
		cases = append(cases, tcase{"sdk body " + string(rune('0'+i)), b, "", ""})
	}
	return cases
}

func TestAssistantMessageV2(t *testing.T) {
	for _, tc := range append(assistantV2Cases(), grammarCases...) {
		t.Run(tc.name, func(t *testing.T) { check(t, AssistantMessageV2, tc) })
	}
}

// The bodies of the real SDK 5+ clients are refused by v1's rules (no content) and the
// v1 body by v2's (no parts): each route gets its own rules.
func TestVersionsDoNotMix(t *testing.T) {
	for _, b := range sdkBodies {
		if err := AssistantMessage([]byte(b)); err == nil || !strings.HasSuffix(err.(*Error).Field, ".content") {
			t.Errorf("v1 accepted an SDK 5+ body or refused it for another reason: %v", err)
		}
	}
	if err := AssistantMessageV2([]byte(asst(""))); err == nil || err.(*Error).Field != "messages[0].parts" {
		t.Errorf("v2 on a v1 body: %v, want messages[0].parts is required", err)
	}
}

func TestErrorMessagesV2(t *testing.T) {
	for body, want := range map[string]string{
		`{"fp":"f","messages":[]}`:                                       "messages must be a non-empty array of objects",
		`{"fp":"f","messages":[{"id":"1","role":"user","content":"c"}]}`: "messages[0].parts is required",
		`{"fp":2,"messages":[]}`:                                         "fp must be a string",
	} {
		if err := AssistantMessageV2([]byte(body)); err == nil || err.Error() != want {
			t.Errorf("%s: %v, want %q", body, err, want)
		}
	}
}
