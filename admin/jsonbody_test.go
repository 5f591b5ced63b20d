package admin

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/docsgate/gateway/notify"
)

// A body naming a member twice, at any depth, is refused before anything is done: 400
// invalid_request naming the member. POST /notifications/drop with two keys members would
// otherwise drop what the second names.
func TestDuplicateMembersRefused(t *testing.T) {
	box := notify.NewMemory(1000)
	dead1, dead2, pending := seedOutbox(t, box)
	srv, _ := notificationsServer(t, box, protectToken)
	hdr := map[string]string{"Authorization": "Bearer " + protectToken, "Content-Type": "application/json"}
	for path, body := range map[string]string{
		"/notifications/drop":  `{"keys":["evt_nope/billing"],"keys":["` + dead1 + `","` + dead2 + `","` + pending + `"]}`,
		"/notifications/retry": `{"keys":["evt_nope/billing"],"k\u0065ys":["` + dead1 + `"]}`,
	} {
		a := do(t, srv, "POST", path, hdr, body)
		var e struct{ Error, Code, Field string }
		_ = json.Unmarshal([]byte(a.body), &e)
		if a.status != 400 || e.Code != "invalid_request" || e.Field != "keys" || e.Error != `Invalid "keys": given twice: send each member once.` {
			t.Errorf("POST %s %s: %d %s", path, body, a.status, a.body)
		}
	}
	if p, d, err := box.Count(context.Background()); p != 1 || d != 2 || err != nil {
		t.Fatalf("after the refusals: %d pending, %d dead (%v), want the outbox untouched", p, d, err)
	}
	// Once each, the same body is served.
	if a := do(t, srv, "POST", "/notifications/drop", hdr, `{"keys":["`+dead1+`"]}`); a.status != 200 {
		t.Fatalf("drop: %d %s", a.status, a.body)
	}
}

func TestUniqueMembers(t *testing.T) {
	for body, want := range map[string]*fieldError{
		`{"a":1,"b":[{"c":1},{"c":2}]}`:   nil,
		`{"a":1,"a":2}`:                   {"a", msgGivenTwice},
		`{"a":{"b":1,"b":2}}`:             {"b", msgGivenTwice},
		`{"reason":"x","reason\u0000":1}`: nil,
		"{\"a\":\"\xff\"}":                {"body", "is not valid JSON: invalid UTF-8 at byte 6"},
	} {
		got := uniqueMembers([]byte(body))
		if (got == nil) != (want == nil) || got != nil && *got != *want {
			t.Errorf("uniqueMembers(%q) = %+v, want %+v", body, got, want)
		}
	}
}
