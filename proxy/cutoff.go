package proxy

import (
	"context"
	"io"
	"strconv"

	"go.uber.org/zap"

	"github.com/docsgate/gateway/limits"
)

// Cutoff ends an answer in flight when its tokens would take the tenant past a tokens limit
// with cutoff: true, as a valid stream of its protocol, so that a chat client shows the end of
// the answer with an error rather than a broken connection.
//
// The budget is the limit's hold. Such a limit has a reserve, held at admission only while the
// tenant has at least that much room net of the used tokens and the other answers' holds.
// While the answer runs, the tap counts what it costs so far after each part (tokenCharge:
// the usage the stream reported, otherwise the estimate of the text that passed, as the
// settle charges it). As long as that stays within the hold, nothing is asked; when a part
// takes it past, the hold is grown (limits.Grower: one store call, atomic with every other
// decision and hold on the limit) to the running count plus another reserve, as far as the
// tenant's allowance has room net of the used tokens and the other live holds. When it cannot
// grow as far as the running count, the answer ends at that part: before it when the part came
// whole in the read at hand (it is dropped, never sent), else right after it (its beginning is
// out already); the upstream request is cancelled, the answer is charged what passed, and the
// client gets an error part and the finish parts of its protocol.
//
// So at every instant the tokens used plus the holds of the answers in flight stay within the
// allowance, except that an answer whose last part began in an earlier read than it ended in
// may run past its hold by that part: the overshoot is at most one streamed part's tokens per
// answer in flight, whatever the number of replicas, and none when parts come whole in a read
// (as a part flushed on its own does). A store call is made once per reserve of tokens an
// answer runs past its admission, never per part.

// partCheck runs after each part a tap counts; whole says the part came whole in the read at
// hand (the tap can drop it). Its answer: go on, end the read after the part, or before it
// (only when whole: the tap then forgets what it counted of the part).
type partCheck func(whole bool) cutAction

// cutAt runs a tap's check at the end of a part, at offset at of the read at hand; mark is
// where the read may end before the part (-1: nowhere) and saved the tap's counts there. When
// the check cuts, it returns where the read ends, the counts back at saved for a cut before the
// part; else it moves the mark to at.
func cutAt[T any](check partCheck, mark *int, counts, saved *T, at int) (end int, cut bool) {
	switch check(*mark >= 0) {
	case cutAfter:
		return at, true
	case cutBefore:
		*counts = *saved
		return *mark, true
	}
	*mark, *saved = at, *counts
	return 0, false
}

// cutAction is a partCheck's answer.
type cutAction uint8

const (
	goOn      cutAction = iota
	cutAfter            // the answer ends after the part
	cutBefore           // the answer ends before the part, which is dropped
)

// cutLimit is one tokens limit with cutoff whose hold an answer in flight took.
type cutLimit struct {
	hit  limits.Hit
	hold int64 // the hold's amount, as the store last granted it
}

// cutState is the cutoff of one answer.
type cutState struct {
	limits []cutLimit // the held limits with cutoff (backed by buf)
	buf    [2]cutLimit
	by     *limits.Rule // the limit that ended the answer; nil while it runs
	failed bool         // the store could not be asked (redis.on_error: deny)
	ending []byte       // what is still to be written of the answer's end once it was cut
	begun  bool         // ending was built
}

// limit is the name of the limit that ended the answer, "" when none did.
func (c *cutState) limit() string {
	if c.by == nil {
		return ""
	}
	return c.by.Name
}

// The texts of the error part that ends a cut answer: what a chat client shows.
const (
	cutMessage       = "The answer was cut off: the token budget ran out."
	cutFailedMessage = "The answer was cut off: its token budget could not be checked."
)

// keepCutoffs records, for a streamed answer, the held tokens limits that have cutoff. Call it
// after keepHeld.
func (s *scope) keepCutoffs(set *limitSet) {
	if !s.route.stream {
		return
	}
	s.cut.limits = s.cut.buf[:0]
	for _, h := range s.held {
		for _, l := range set.limits {
			if l.cutoff && l.rule == h.Rule {
				s.cut.limits = append(s.cut.limits, cutLimit{hit: h, hold: h.Rule.Reserve})
				break
			}
		}
	}
}

// cutCheck runs after each part of an answer with cutoff limits (the tap's partCheck): it
// grows the holds the answer's running count has passed, and ends the answer when one cannot
// grow that far: before the part when it came whole in this read, else after it. An answer
// whose finish passed is never cut: it has nothing more to cost.
func (g *Gateway) cutCheck(s *scope, whole bool) cutAction {
	out := s.tap.outcome()
	if out.reason != "" || s.cut.by != nil {
		return goOn
	}
	c := chargeOf(out, s.promptBytes)
	for i := range s.cut.limits {
		l := &s.cut.limits[i]
		r := l.hit.Rule
		n := c.of(r.EstimateMax, r.Reserve)
		if n <= l.hold {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), g.growTimeout)
		got, err := g.limiter.Grow(ctx, s.hold, l.hit, n+r.Reserve)
		cancel()
		failed := err != nil
		if failed {
			g.log.Warn("growing the token hold of an answer in flight failed", zap.String("route", s.route.name),
				zap.String("limit", r.Name), zap.String("request_id", s.requestID), zap.Error(err))
			if g.allowOnLimiterError {
				// redis.on_error: allow: the answer goes on; the next reserve asks again.
				l.hold = n + r.Reserve
				continue
			}
			got = l.hold
		}
		l.hold = got
		if n <= got {
			continue
		}
		s.cut.by, s.cut.failed = r, failed
		s.route.metrics.StreamCutoff(r.Name)
		if whole {
			return cutBefore
		}
		return cutAfter
	}
	return goOn
}

// cutEnding is the end of a cut answer in its protocol.
//
// The data stream (AI SDK 4): an error part, then the finish step and finish message parts
// with finishReason "error" and the tokens charged, as a server that failed mid-answer sends
// them. The UI message stream (AI SDK 5 and later): an error chunk, a finish chunk whose
// finishReason is "error" and whose messageMetadata names the limit,
// {"gateway":{"cutoff":"<limit>"}}, and the stream's end, [DONE].
func cutEnding(ui bool, limit string, failed bool, prompt, completion int64) []byte {
	msg := cutMessage
	if failed {
		msg = cutFailedMessage
	}
	// The messages are plain ASCII and limit names lower_snake_case: quoting them is JSON.
	var b []byte
	if ui {
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

// readCut is tappedBody.Read for an answer with cutoff limits: the tap stops at the part that
// ends the answer (before or after it: cutCheck); the rest of that read is dropped, the
// upstream's body closed (which ends the upstream request), and the answer's end follows.
func (b *tappedBody) readCut(p []byte) (int, error) {
	s := b.rw.scope
	if s.cut.by != nil {
		if !s.cut.begun {
			// What the answer is charged: its counts as the tap left them, the dropped part
			// forgotten.
			s.cut.begun = true
			out := s.tap.outcome()
			out.errored = true // the client gets an error part: the stream's result is error
			r := s.cut.by
			p, q, _ := chargeOf(out, s.promptBytes).split(r.EstimateMax, r.Reserve)
			if _, opaque := s.tap.(*opaqueTap); !opaque {
				// An answer in a coding the gateway cannot write just ends.
				s.cut.ending = cutEnding(s.tap == &s.uiTap, r.Name, s.cut.failed, p, q)
			}
		}
		n := copy(p, s.cut.ending)
		s.cut.ending = s.cut.ending[n:]
		if len(s.cut.ending) > 0 {
			return n, nil
		}
		b.rw.ended.Store(true) // see tappedBody.Read
		return n, io.EOF
	}
	n, err := b.ReadCloser.Read(p)
	if n == 0 {
		return n, err
	}
	k := b.tap.feed(p[:n])
	if s.cut.by == nil {
		if err == io.EOF {
			b.rw.ended.Store(true)
		}
		return n, err
	}
	_ = b.ReadCloser.Close() // the upstream request ends now
	if k == 0 {
		return b.readCut(p) // the part was the read's first: the end follows at once
	}
	return k, nil
}
