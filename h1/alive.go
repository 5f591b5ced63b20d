package h1

import "bytes"

// idleState is what a look at an idle connection found.
type idleState int

const (
	// idleOpen: open, nothing sent: it can take a request.
	idleOpen idleState = iota
	// idleClosed: closed by the upstream (end of stream, reset) or told so by a 408, as some
	// servers do on their idle timeout: what the pool learns the upstream's idle clock from.
	idleClosed
	// idleOutOfStep: bytes nobody asked for (a second answer, a stray line): the exchange
	// before it was out of step. It says nothing of how long the upstream keeps connections.
	idleOutOfStep
)

// timeout408 is how a 408 answer starts: the longest prefix a peek needs.
var timeout408 = []byte("HTTP/1.1 408")

// unasked classifies the first bytes an upstream sent on an idle connection: a 408 is its idle
// timeout, anything else a desynchronised exchange.
func unasked(b []byte) idleState {
	b = b[:min(len(b), len(timeout408))]
	if len(b) == len(timeout408) && bytes.Equal(b[:7], timeout408[:7]) && bytes.Equal(b[8:], timeout408[8:]) {
		return idleClosed // HTTP/1.0 or 1.1
	}
	return idleOutOfStep
}
