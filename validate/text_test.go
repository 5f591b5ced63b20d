package validate

import (
	"strings"
	"testing"
)

// The conversation's text is what a prompt's tokens are estimated from: the fields a client
// fills at will (filter, unknown members, other parts) must not count.
func TestConversationText(t *testing.T) {
	big := strings.Repeat("x", 10_000)
	for _, c := range []struct {
		name string
		v2   bool
		body string
		want int
	}{
		{"v1 content", false, `{"fp":"f","messages":[{"id":"1","role":"user","content":"hello"},{"id":"2","role":"assistant","content":"hi"}]}`, 7},
		{"v1 filter is no text", false, `{"fp":"f","filter":{"p":"` + big + `"},"messages":[{"id":"1","role":"user","content":"hello"}]}`, 5},
		{"v1 unknown fields are no text", false, `{"fp":"f","x":"` + big + `","messages":[{"id":"1","role":"user","content":"abc","y":"` + big + `","parts":[{"type":"text","text":"abc"}]}]}`, 3},
		{"v1 context", false, `{"fp":"f","messages":[{"id":"1","role":"user","content":"ab"}],"context":[{"value":"0123456789","type":"code"}]}`, 12},
		{"v1 escapes count as sent", false, `{"fp":"f","messages":[{"id":"1","role":"user","content":"\u00e9\n"}]}`, 8},
		{"v2 text parts", true, `{"fp":"f","messages":[{"id":"1","role":"user","parts":[{"type":"text","text":"hello"},{"type":"reasoning","text":"why"}]}]}`, 8},
		{"v2 other parts and fields are no text", true, `{"fp":"f","filter":{"p":"` + big + `"},"messages":[{"id":"1","role":"user","content":"` + big + `","parts":[{"type":"file","url":"` + big + `"},{"type":"text","text":"ok","providerMetadata":{"a":"` + big + `"}},{"type":"data-x","text":{"n":"` + big + `"}}]}]}`, 2},
		{"v2 context", true, `{"fp":"f","messages":[{"id":"1","role":"user","parts":[]}],"context":[{"value":"abcd"}]}`, 4},
	} {
		text, err := AssistantMessageText([]byte(c.body))
		if c.v2 {
			text, err = AssistantMessageV2Text([]byte(c.body))
		}
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if text != c.want {
			t.Errorf("%s: text %d bytes, want %d", c.name, text, c.want)
		}
	}
	if n, err := AssistantMessageText([]byte(`{"fp":"f","messages":[{"id":"1","role":"user"}]}`)); err == nil || n != 0 {
		t.Fatalf("an invalid body: %d, %v", n, err)
	}
}
