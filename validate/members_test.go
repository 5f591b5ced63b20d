package validate

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// wideObject is an object of n distinct members (k0..k{n-1}) and, when dup, one more that
// repeats the first: past smallObject, checked when the object closes.
func wideObject(n int, dup bool) string {
	var b strings.Builder
	b.WriteByte('{')
	for i := range n {
		fmt.Fprintf(&b, `"k%d":%d,`, i, i)
	}
	if dup {
		b.WriteString(`"k0":true,`)
	}
	b.WriteString(`"end":null}`)
	return b.String()
}

// A member named twice is refused in every object of every body, known or not, at any
// depth, compared as encoding/json decodes names; the error names the innermost object the
// schema knows and the member.
func TestDuplicateMembers(t *testing.T) {
	const part = `{"type":"text","text":"hi"}`
	v1msg := func(extra string) string {
		return `{"fp":"f","messages":[{"id":"1","role":"user","content":"c"` + extra + `}]}`
	}
	v2msg := func(extra string) string {
		return `{"fp":"f","messages":[{"id":"1","role":"user","parts":[` + part + `]` + extra + `}]}`
	}
	v2part := func(extra string) string {
		return `{"fp":"f","messages":[{"id":"1","role":"user","parts":[{"type":"text"` + extra + `}]}]}`
	}
	type dupCase struct {
		name, body, field, member string
	}
	agent := []dupCase{
		{"top level", `{"prompt":"p","model":"a","model":"b"}`, "", "model"},
		{"escaped spelling", `{"prompt":"p","model":"a","mod\u0065l":"b"}`, "", "model"},
		{"both escaped", `{"prompt":"p","m\u006fdel":"a","mod\u0065l":"b"}`, "", "model"},
		{"lone surrogates read alike", `{"prompt":"p","\ud800":1,"\udfff":2}`, "", "\ufffd"},
		{"nested", `{"prompt":"p","metadata":{"tags":[{"a":1,"b":2,"a":3}]}}`, "", "a"},
		{"wide object", `{"prompt":"p","x":` + wideObject(40, true) + `}`, "", "k0"},
		{"wide top level", `{"prompt":"p",` + wideObject(40, true)[1:], "", "k0"},
	}
	for _, c := range agent {
		checkDuplicate(t, "AgentJob", AgentJob, c.name, c.body, c.field, c.member)
		checkDuplicate(t, "JSON", JSON, c.name, c.body, "", c.member)
	}
	assistant := []dupCase{
		{"top level", asst(`"trigger":"a","trigger":"b"`), "", "trigger"},
		{"in filter", asst(`"filter":{"v":1,"v":2}`), "filter", "v"},
		{"deep in filter", asst(`"filter":{"a":[[{"v":1,"w":{"x":1,"x":2}}]]}`), "filter", "x"},
		{"in a message", v1msg(`,"metadata":1,"metadata":2`), "messages[0]", "metadata"},
		{"nested in a message", v1msg(`,"metadata":{"u":{"n":1,"n":2}}`), "messages[0]", "n"},
		{"in a part", `{"fp":"f","messages":[{"id":"1","role":"user","content":"c","parts":[{"type":"t","x":1,"x":2}]}]}`, "messages[0].parts[0]", "x"},
		{"in a context item", asst(`"context":[{"value":"v","elementId":"a","elementId":"b"}]`), "context[0]", "elementId"},
	}
	for _, c := range assistant {
		checkDuplicate(t, "AssistantMessage", AssistantMessage, c.name, c.body, c.field, c.member)
		checkDuplicate(t, "JSON", JSON, c.name, c.body, "", c.member)
	}
	v2 := []dupCase{
		{"top level", asstV2(`"messageId":"a","messageId":"b"`), "", "messageId"},
		{"in a message", v2msg(`,"metadata":{},"metadata":{}`), "messages[0]", "metadata"},
		{"content twice", v2msg(`,"content":1,"content":2`), "messages[0]", "content"},
		{"text twice", v2part(`,"text":"a","text":"b"`), "messages[0].parts[0]", "text"},
		{"state twice", v2part(`,"state":"streaming","state":"done"`), "messages[0].parts[0]", "state"},
		{"in provider metadata", v2part(`,"providerMetadata":{"openai":{"id":1,"id":2}}`), "messages[0].parts[0]", "id"},
		{"wide part", v2part(`,"data":` + wideObject(20, true)), "messages[0].parts[0]", "k0"},
	}
	for _, c := range v2 {
		checkDuplicate(t, "AssistantMessageV2", AssistantMessageV2, c.name, c.body, c.field, c.member)
		checkDuplicate(t, "JSON", JSON, c.name, c.body, "", c.member)
	}
	// The same names in different objects, and objects wide and narrow without a duplicate,
	// are fine.
	for _, ok := range []string{
		`{"prompt":"p","a":{"a":{"a":1}},"b":[{"a":1},{"a":2}]}`,
		`{"prompt":"p","x":` + wideObject(40, false) + `,"y":` + wideObject(17, false) + `}`,
		`{"prompt":"p","k":1,"K":2,"k\u00e9":3,"ke\u0301":4}`, // names differ unless decoded to the same string
	} {
		if err := AgentJob([]byte(ok)); err != nil {
			t.Errorf("AgentJob(%s): %v", ok, err)
		}
		if err := JSON([]byte(ok)); err != nil {
			t.Errorf("JSON(%s): %v", ok, err)
		}
	}
	if err := AssistantMessageV2([]byte(v2msg(`,"metadata":{"a":1},"x":{"a":1}`))); err != nil {
		t.Errorf("the same name in two objects: %v", err)
	}
}

func checkDuplicate(t *testing.T, name string, fn func([]byte) error, what, body, field, member string) {
	t.Helper()
	var ve *Error
	if err := fn([]byte(body)); !errors.As(err, &ve) || ve.Field != field || ve.Duplicate != member ||
		ve.Reason != "has a duplicate member "+fmt.Sprintf("%+q", member) {
		t.Errorf("%s, %s: %v (%+v), want %q naming %q", name, what, err, ve, field, member)
	}
}

// An object of 100,000 members, the last repeating the first, is refused (sorted when it
// closes, not compared pair by pair), and so is one nested in an unknown field; one of
// 100,000 distinct members is accepted.
func TestDuplicateMembersInHugeObjects(t *testing.T) {
	dup, distinct := wideObject(100_000, true), wideObject(100_000, false)
	for body, want := range map[string]string{
		`{"prompt":"p","x":` + dup + `}`:      "k0",
		`{"prompt":"p",` + dup[1:]:            "k0",
		`{"prompt":"p","x":` + distinct + `}`: "",
	} {
		err := AgentJob([]byte(body))
		var ve *Error
		if want == "" && err != nil || want != "" && (!errors.As(err, &ve) || ve.Duplicate != want) {
			t.Errorf("%.40s...: %v", body, err)
		}
	}
	if err := JSON([]byte(dup)); err == nil {
		t.Error("JSON accepted the huge object with a duplicate")
	}
}

// The name a duplicate's message quotes is decoded, cut to 64 bytes and quoted in ASCII.
func TestDuplicateMessage(t *testing.T) {
	long := strings.Repeat("é", 40) // 80 bytes
	body := `{"prompt":"p","` + long + `\n":1,"` + long + `\u000a":2}`
	err := AgentJob([]byte(body))
	want := `body has a duplicate member "` + strings.Repeat(`\u00e9`, 32) + `..."`
	if err == nil || err.Error() != want {
		t.Fatalf("%v, want %s", err, want)
	}
}

// Bounds cap the messages of v1 and v2 bodies and the parts of each message, naming the
// field; zero is no bound, and the package functions apply none.
func TestBounds(t *testing.T) {
	const part = `{"type":"text","text":"hi"}`
	messages := func(n int, parts int, v2 bool) string {
		var b strings.Builder
		b.WriteString(`{"fp":"f","messages":[`)
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `{"id":"%d","role":"user"`, i)
			if !v2 {
				b.WriteString(`,"content":"c"`)
			}
			b.WriteString(`,"parts":[`)
			for j := range parts {
				if j > 0 {
					b.WriteByte(',')
				}
				b.WriteString(part)
			}
			b.WriteString(`]}`)
		}
		b.WriteString(`]}`)
		return b.String()
	}
	b := Bounds{Messages: 3, PartsPerMessage: 2}
	for _, v2 := range []bool{false, true} {
		run := b.AssistantMessageText
		if v2 {
			run = b.AssistantMessageV2Text
		}
		for _, c := range []struct {
			n, parts      int
			field, reason string
		}{
			{3, 2, "", ""},
			{4, 2, "messages", "must hold at most 3 messages"},
			{3, 3, "messages[0].parts", "must hold at most 2 parts"},
			{200, 0, "messages", "must hold at most 3 messages"},
		} {
			_, err := run([]byte(messages(c.n, c.parts, v2)))
			var ve *Error
			if c.field == "" && err != nil || c.field != "" && (!errors.As(err, &ve) || ve.Field != c.field || ve.Reason != c.reason) {
				t.Errorf("v2 %t, %d messages of %d parts: %v, want %q %q", v2, c.n, c.parts, err, c.field, c.reason)
			}
		}
		unbounded := Bounds{}.AssistantMessageText
		if v2 {
			unbounded = AssistantMessageV2Text
		}
		if _, err := unbounded([]byte(messages(20_000, 1, v2))); err != nil {
			t.Errorf("v2 %t: no bound: %v", v2, err)
		}
	}
	// A message past the bound is refused even when it is broken: nothing after it is read.
	if _, err := b.AssistantMessageText([]byte(messages(3, 0, false)[:len(messages(3, 0, false))-2] + `,{"id":`)); err == nil || err.(*Error).Field != "messages" {
		t.Errorf("a fourth, broken, message: %v", err)
	}
}

// JSON agrees with the reference reader (encoding/json's tokens, valid UTF-8, MaxDepth, no
// member twice in an object) on the seeds, the committed corpus and their mutations, which
// duplicate spans of members at every depth.
func TestJSONDifferential(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var bodies [][]byte
	for _, s := range append(seeds(), seedsV2()...) {
		bodies = append(bodies, []byte(s))
	}
	bodies = append(bodies, corpusBodies(t)...)
	accepted, refused := 0, 0
	for _, b := range bodies {
		for _, m := range append(mutate(rng, b, 100), b) {
			_, want := parseRef(m)
			if got := JSON(m) == nil; got != want {
				t.Fatalf("JSON(%q) accepts %t, the reference %t", m, got, want)
			}
			if want {
				accepted++
			} else if json.Valid(m) {
				refused++ // valid JSON the reference refuses: a duplicate (or depth)
			}
		}
	}
	if accepted < 100 || refused < 10 {
		t.Fatalf("too few cases to be meaningful: %d accepted, %d valid JSON refused", accepted, refused)
	}
}
