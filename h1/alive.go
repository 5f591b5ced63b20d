package h1

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

// unasked classifies the first bytes an upstream sent on an idle connection: a 408 (HTTP/1.0
// or 1.1, "HTTP/1.x 408": 12 bytes, what the peek reads) is its idle timeout, anything else a
// desynchronised exchange.
func unasked(b []byte) idleState {
	if len(b) >= 12 && string(b[:7]) == "HTTP/1." && string(b[8:12]) == " 408" {
		return idleClosed
	}
	return idleOutOfStep
}
