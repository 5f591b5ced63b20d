package stream

import (
	"io"
	"strconv"

	"github.com/docsgate/gateway/limits"
)

// Cutoff ends an answer in flight when its tokens would take the tenant past a tokens limit
// with cutoff: true, as a valid stream of its protocol, so that a chat client shows the end of
// the answer with an error rather than a broken connection.
//
// The budget is the limit's hold. Such a limit has a reserve, held at admission only while the
// tenant has at least that much room net of the used tokens and the other answers' holds.
// While the answer runs, the tap counts what it costs so far after each part (Charge: the usage
// the stream reported, otherwise the estimate of the text that passed, as the settle charges
// it). As long as that stays within the hold, nothing is asked; when a part takes it past, the
// hold is grown (Grower: one store call, atomic with every other decision and hold on the
// limit) to the running count plus another reserve, as far as the tenant's allowance has room
// net of the used tokens and the other live holds. When it cannot grow as far as the running
// count, the answer ends at that part: before it when the part came whole in the read at hand
// (it is dropped, never sent), else right after it (its beginning is out already); the
// upstream request is cancelled, the answer is charged what passed, and the client gets an
// error part and the finish parts of its protocol.
//
// So at every instant the tokens used plus the holds of the answers in flight stay within the
// allowance, except that an answer whose last part began in an earlier read than it ended in
// may run past its hold by that part: the overshoot is at most one streamed part's tokens per
// answer in flight, whatever the number of replicas, and none when parts come whole in a read
// (as a part flushed on its own does). A store call is made once per reserve of tokens an
// answer runs past its admission, never per part.
type Cutoff struct {
	limits []CutLimit // the held limits with cutoff (backed by buf)
	buf    [2]CutLimit
	grower Grower
	by     *limits.Rule // the limit that ended the answer; nil while it runs
	// allowOnError: a hold that cannot be grown (the store out of reach) lets the answer go
	// on (redis.on_error: allow); else the answer ends there.
	allowOnError bool
	failed       bool // the store could not be asked
}

// CutLimit is one tokens limit with cutoff whose hold an answer in flight took.
type CutLimit struct {
	Hit  limits.Hit
	Hold int64 // the hold's amount, as the store last granted it
}

// Grower grows an answer's hold on h to want tokens, as far as the tenant's allowance has
// room net of the used tokens and the other live holds, and returns the hold it has now. An
// error says the store could not be asked.
type Grower interface {
	Grow(h limits.Hit, want int64) (int64, error)
}

// Reset makes c the cutoff of a new answer, with no limits yet; g grows its holds.
func (c *Cutoff) Reset(g Grower, allowOnError bool) {
	*c = Cutoff{grower: g, allowOnError: allowOnError}
	c.limits = c.buf[:0]
}

// Add makes h, a tokens limit with cutoff whose reserve the answer holds, end the answer at
// its budget.
func (c *Cutoff) Add(h limits.Hit) {
	if c.limits == nil {
		c.limits = c.buf[:0]
	}
	c.limits = append(c.limits, CutLimit{Hit: h, Hold: h.Rule.Reserve})
}

// Len is how many limits can end the answer.
func (c *Cutoff) Len() int { return len(c.limits) }

// Limit is the name of the limit that ended the answer, "" when none did.
func (c *Cutoff) Limit() string {
	if c.by == nil {
		return ""
	}
	return c.by.Name
}

// check runs after each part of an answer with cutoff limits, out being what its tap counted
// so far: it grows the holds the answer's running count has passed, and ends the answer when
// one cannot grow that far: before the part when it came whole in this read, else after it.
// An answer whose finish passed is never cut: it has nothing more to cost.
func (c *Cutoff) check(out *Outcome, promptBytes int, whole bool) Action {
	if out.Reason != "" || c.by != nil {
		return GoOn
	}
	ch := ChargeOf(out, promptBytes)
	for i := range c.limits {
		l := &c.limits[i]
		r := l.Hit.Rule
		n := ch.Of(r.EstimateMax, r.Reserve)
		if n <= l.Hold {
			continue
		}
		got, err := c.grower.Grow(l.Hit, n+r.Reserve)
		if err != nil {
			if c.allowOnError {
				l.Hold = n + r.Reserve // the answer goes on; the next reserve asks again
				continue
			}
			got = l.Hold
		}
		l.Hold = got
		if n <= got {
			continue
		}
		c.by, c.failed = r, err != nil
		if whole {
			return CutBefore
		}
		return CutAfter
	}
	return GoOn
}

// Checker runs after each part a tap counts; whole says the part came whole in the read at
// hand (the tap can drop it). Its answer: go on, end the read after the part, or before it
// (only when whole: the tap then forgets what it counted of the part).
type Checker interface {
	CheckPart(whole bool) Action
}

// CheckFunc is a function as a Checker.
type CheckFunc func(whole bool) Action

// CheckPart calls f.
func (f CheckFunc) CheckPart(whole bool) Action { return f(whole) }

// Action is a Checker's answer.
type Action uint8

// The Actions.
const (
	GoOn      Action = iota
	CutAfter         // the answer ends after the part
	CutBefore        // the answer ends before the part, which is dropped
)

// cutAt runs a tap's check at the end of a part, at offset at of the read at hand; mark is
// where the read may end before the part (-1: nowhere) and saved the tap's counts there. When
// the check cuts, it returns where the read ends, the counts back at saved for a cut before the
// part; else it moves the mark to at.
func cutAt[T any](check Checker, mark *int, counts, saved *T, at int) (end int, cut bool) {
	switch check.CheckPart(*mark >= 0) {
	case CutAfter:
		return at, true
	case CutBefore:
		*counts = *saved
		return *mark, true
	}
	*mark, *saved = at, *counts
	return 0, false
}

// CheckPart is the check of an answer with a Cutoff (see Reset): its taps call it after each
// part.
func (b *Body) CheckPart(whole bool) Action {
	return b.cut.check(b.tap.Outcome(), b.promptBytes, whole)
}

// The texts of the error part that ends a cut answer: what a chat client shows.
const (
	cutMessage       = "The answer was cut off: the token budget ran out."
	cutFailedMessage = "The answer was cut off: its token budget could not be checked."
)

// Ending is the end of an answer tap reads, cut by limit, in its protocol (nil for an answer
// the gateway cannot read: nothing can be added in a coding it cannot write); failed says the
// budget could not be checked.
//
// The data stream (AI SDK 4): an error part, then the finish step and finish message parts
// with finishReason "error" and the tokens charged, as a server that failed mid-answer sends
// them. The UI message stream (AI SDK 5 and later): an error chunk, a finish chunk whose
// finishReason is "error" and whose messageMetadata names the limit,
// {"gateway":{"cutoff":"<limit>"}}, and the stream's end, [DONE].
func Ending(tap Tap, limit string, failed bool, prompt, completion int64) []byte {
	msg := cutMessage
	if failed {
		msg = cutFailedMessage
	}
	// The messages are plain ASCII and limit names lower_snake_case: quoting them is JSON.
	var b []byte
	switch tap.(type) {
	case *Opaque:
		return nil
	case *UIMessageStream:
		b = append(b, `data: {"type":"error","errorText":`...)
		b = strconv.AppendQuote(b, msg)
		b = append(b, "}\n\n"...)
		b = append(b, `data: {"type":"finish","finishReason":"error","messageMetadata":{"gateway":{"cutoff":`...)
		b = strconv.AppendQuote(b, limit)
		b = append(b, "}}}\n\ndata: [DONE]\n\n"...)
		return b
	}
	usage := func(b []byte) []byte {
		b = append(b, `"usage":{"promptTokens":`...)
		b = strconv.AppendInt(b, prompt, 10)
		b = append(b, `,"completionTokens":`...)
		b = strconv.AppendInt(b, completion, 10)
		return append(b, '}')
	}
	b = append(b, "3:"...)
	b = strconv.AppendQuote(b, msg)
	b = append(b, "\ne:{\"finishReason\":\"error\","...)
	b = usage(b)
	b = append(b, ",\"isContinued\":false}\nd:{\"finishReason\":\"error\","...)
	b = usage(b)
	return append(b, "}\n"...)
}

// readCut is Body.Read for an answer with cutoff limits: the tap stops at the part that ends
// the answer (before or after it: check); the rest of that read is dropped, the upstream's body
// closed (which ends the upstream request), and the answer's end follows.
func (b *Body) readCut(p []byte) (int, error) {
	c := b.cut
	if c.by != nil {
		if b.ending == nil { // the first read after the cut: its end is not built yet
			// What the answer is charged: its counts as the tap left them, the dropped part
			// forgotten.
			out := b.tap.Outcome()
			out.Errored = true // the client gets an error part: the stream's result is error
			r := c.by
			p, q, _ := ChargeOf(out, b.promptBytes).Split(r.EstimateMax, r.Reserve)
			if b.ending = Ending(b.tap, r.Name, c.failed, p, q); b.ending == nil {
				b.ending = []byte{} // an answer the gateway cannot write in ends as it is
			}
		}
		n := copy(p, b.ending)
		b.ending = b.ending[n:]
		if len(b.ending) > 0 {
			return n, nil
		}
		b.markEnded() // see Read
		return n, io.EOF
	}
	n, err := b.ReadCloser.Read(p)
	if n == 0 {
		return n, err
	}
	k := b.feed(p[:n])
	if c.by == nil {
		if err == io.EOF {
			b.markEnded()
		}
		return n, err
	}
	_ = b.ReadCloser.Close() // the upstream request ends now
	if k == 0 {
		return b.readCut(p) // the part was the read's first: the end follows at once
	}
	return k, nil
}
