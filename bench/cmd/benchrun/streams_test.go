package main

import "testing"

func TestStampOf(t *testing.T) {
	for line, want := range map[string]int64{
		`0:"1700000000000000001 Start by creating an API key. "` + "\n":                                              1700000000000000001,
		`data: {"type":"text-delta","id":"text-1","delta":"1700000000000000002 Send it as a Bearer token. "}` + "\n": 1700000000000000002,
		`f:{"messageId":"msg-1"}` + "\n":                               -1,
		`data: {"type":"start","messageId":"msg-1"}` + "\n":            -1,
		`data: {"type":"text-delta","id":"text-1","delta":"no stamp"}`: -1,
		`0:"nostamp"` + "\n":                                           -1,
	} {
		got, ok := stampOf([]byte(line))
		if (want < 0 && ok) || (want >= 0 && (!ok || got != want)) {
			t.Errorf("%q: %d %v, want %d", line, got, ok, want)
		}
	}
}
