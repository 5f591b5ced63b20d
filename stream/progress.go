package stream

import "sync/atomic"

// Progress is what an answer in flight has passed so far, published after each read of it for
// a reader on another goroutine: the refresh of the answer's token holds, which leaves it in
// the store so that an answer whose gateway dies is charged what it passed (see
// limits.Refresher). Two atomic stores per read of an answer that holds tokens; none for the
// others.
type Progress struct {
	promptBytes int          // the request's conversation text (Start)
	text        atomic.Int64 // the answer text's bytes (Outcome.TextBytes)
	reported    atomic.Int64 // the prompt and completion tokens the stream reported so far
}

// Start readies p for the answer to a request with promptBytes of conversation text; call it
// before p is handed to a reader or a Body.
func (p *Progress) Start(promptBytes int) { p.promptBytes = promptBytes }

// note publishes what the tap has counted after a read.
func (p *Progress) note(o *Outcome) {
	p.text.Store(o.TextBytes)
	if o.Usage {
		p.reported.Store(o.Prompt + o.Completion)
	}
}

// Passed is what the answer has passed so far of one tokens limit (estimateMax and reserve:
// its caps): its charge had it ended at the last read, as an answer whose client went away
// (Charge.Of); 0 while neither answer text nor a usage report has passed.
func (p *Progress) Passed(estimateMax, reserve int64) int64 {
	text, reported := p.text.Load(), p.reported.Load()
	if text == 0 && reported == 0 {
		return 0
	}
	o := Outcome{TextBytes: text, Usage: reported > 0, Prompt: reported}
	return ChargeOf(&o, p.promptBytes).Of(estimateMax, reserve)
}
