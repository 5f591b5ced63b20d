package validate

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// checkProperties is the contract both fuzz targets and the differential
// test enforce for one body:
//   - the validator returns nil or a *Error with a readable message, and
//     leaves the body untouched;
//   - acceptance implies json.Valid (equivalently: json.Valid rejecting
//     implies the validator rejects);
//   - it agrees exactly with the slow reference model in reference_test.go;
//   - an accepted body decodes into the typed structs with the rules holding;
//   - an accepted body decodes, through encoding/json into a Go upstream's structs (field
//     names matched case-insensitively), to the very values the validator checked.
func checkProperties(t *testing.T, name string, fn func([]byte) error, ref func([]byte) bool, typed, goDecode func([]byte) error, body []byte) {
	t.Helper()
	orig := bytes.Clone(body)
	err := fn(body)
	if !bytes.Equal(body, orig) {
		t.Fatalf("%s modified the body", name)
	}
	accepted := err == nil
	if err != nil {
		var ve *Error
		if !errors.As(err, &ve) || ve.Reason == "" || err.Error() == "" {
			t.Fatalf("%s(%q): error %#v is not a usable *Error", name, body, err)
		}
	}
	if accepted && !json.Valid(body) {
		t.Fatalf("%s accepted %q but json.Valid rejects it", name, body)
	}
	if want := ref(body); accepted != want {
		t.Fatalf("%s(%q) = %v, reference model says valid=%v", name, body, err, want)
	}
	if accepted {
		if err := typed(body); err != nil {
			t.Fatalf("%s accepted %q but typed decoding fails: %v", name, body, err)
		}
		if err := goDecode(body); err != nil {
			t.Fatalf("%s accepted %q but a Go upstream reads otherwise: %v", name, body, err)
		}
	}
}

func typedAgentJobErr(b []byte) error {
	_, err := decodeAgentJob(b)
	return err
}

func typedAssistantErr(b []byte) error {
	_, err := decodeAssistant(b)
	return err
}

func checkAgentJob(t *testing.T, body []byte) {
	t.Helper()
	checkProperties(t, "AgentJob", AgentJob, refAgentJob, typedAgentJobErr, goAgentJobAgrees, body)
}

func checkAssistantMessage(t *testing.T, body []byte) {
	t.Helper()
	checkProperties(t, "AssistantMessage", AssistantMessage, refAssistantMessage, typedAssistantErr, goAssistantAgrees, body)
}

// seeds returns the table-test bodies, which cover every rule, plus a
// realistic conversation.
func seeds() []string {
	var out []string
	for _, list := range [][]tcase{agentCases(), assistantCases(), grammarCases} {
		for _, tc := range list {
			if len(tc.body) < 4096 { // keep the fuzzer's seeds small
				out = append(out, tc.body)
			}
		}
	}
	out = append(out, string(conversation(3, 0)))
	return out
}

func FuzzAgentJob(f *testing.F) {
	for _, s := range seeds() {
		f.Add([]byte(s))
	}
	f.Add([]byte(`{"prompt":"a","PROMPT":1,"x":[{"y":"\ud83d\ude00"}]}`))
	f.Add([]byte(`{"prompt":"a","pRompt":""}`))
	f.Fuzz(func(t *testing.T, body []byte) { checkAgentJob(t, body) })
}

func FuzzAssistantMessage(f *testing.F) {
	for _, s := range seeds() {
		f.Add([]byte(s))
	}
	f.Add([]byte(strings.Replace(asst(`"retrievalPageSize":1e-5`), `"m1"`, `"m\u0031"`, 1)))
	f.Add([]byte(asst(`"MESSAGES":[{"id":1}]`)))
	f.Add([]byte(asst(`"meſſages":[]`)))
	f.Fuzz(func(t *testing.T, body []byte) { checkAssistantMessage(t, body) })
}
