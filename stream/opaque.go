package stream

// Opaque reads an answer in a content coding the gateway cannot decode. Nothing of it can be
// read, so it is never charged a reported usage: every byte that passes counts as answer text
// for the estimate (a token per 4 bytes, as for a client that left early), and with a check
// each read is a part, dropped whole when it would take the tenant past its budget (the answer
// then ends where the previous read did: nothing can be added in a coding the gateway cannot
// write).
type Opaque struct {
	out   Outcome
	check Checker
}

var _ Tap = (*Opaque)(nil)

// NewOpaque is an Opaque tap; check, when not nil, runs after each read.
func NewOpaque(check Checker) *Opaque { return &Opaque{check: check} }

// Feed counts p as answer text, unless the check drops it.
func (t *Opaque) Feed(b []byte) int {
	saved := t.out
	t.out.TextBytes += int64(len(b))
	if t.check != nil && t.check.CheckPart(true) == CutBefore {
		t.out = saved
		return 0
	}
	return len(b)
}

// Outcome is what passed: text alone.
func (t *Opaque) Outcome() *Outcome { return &t.out }
