package stream

// Charge is what an answer costs, before each tokens limit's own caps (see Of). A stream whose
// finish passed with a usage report costs that usage. Any other answer (cut, closed by its
// client, or never begun) costs an estimate, because the usage comes last and a client that
// closes early must not be charged 0; and never less than what the stream reported before it
// ended, so an early report cannot lower the charge. The estimate's prompt is a token per 4
// bytes of the request's conversation text (not of its body: a filter or any other field a
// client fills at will is no prompt), its completion a token per 4 bytes of the answer text
// that passed, both rounded up.
type Charge struct {
	final bool // the finish passed with a usage report: reported is the charge
	// reported is the usage reported so far, prompt and completion.
	reportedPrompt, reportedCompletion int64
	prompt, completion                 int64 // the estimate; prompt not yet capped
	text                               bool  // answer text passed
}

// ChargeOf reads what an answer costs: out is nil when no stream began (the client went away
// before the upstream's headers, or the answer is no stream).
func ChargeOf(out *Outcome, promptBytes int) Charge {
	c := Charge{prompt: ceilQuarter(int64(promptBytes))}
	if out == nil {
		return c
	}
	c.completion, c.text = ceilQuarter(out.TextBytes), out.TextBytes > 0
	if out.Usage {
		c.reportedPrompt, c.reportedCompletion = out.Prompt, out.Completion
		c.final = out.Reason != ""
	}
	return c
}

// Of is what one tokens limit is charged: estimateMax caps the estimated prompt, and an answer
// none of whose text passed costs at most that prompt, at most reserve when the limit held one
// (0: it held none).
func (c Charge) Of(estimateMax, reserve int64) int64 {
	p, q, _ := c.Split(estimateMax, reserve)
	return p + q
}

// Split is Of as prompt and completion tokens, for the metrics, and whether they are the
// estimate rather than what the stream reported.
func (c Charge) Split(estimateMax, reserve int64) (prompt, completion int64, estimated bool) {
	if c.final {
		return c.reportedPrompt, c.reportedCompletion, false
	}
	p, q := min(c.prompt, max(estimateMax, 0)), c.completion
	if !c.text {
		if reserve > 0 {
			p = min(p, reserve)
		}
		q = 0
	}
	if c.reportedPrompt+c.reportedCompletion >= p+q && (c.reportedPrompt > 0 || c.reportedCompletion > 0) {
		return c.reportedPrompt, c.reportedCompletion, false
	}
	return p, q, true
}

func ceilQuarter(n int64) int64 { return (n + 3) / 4 }
