package h1

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net/http"
)

// buffered reports whether res's whole body is already in br.
func buffered(res *http.Response, br *bufio.Reader) bool {
	return res.Body == http.NoBody || (res.ContentLength >= 0 && len(res.TransferEncoding) == 0 && int64(br.Buffered()) >= res.ContentLength)
}

// maxInterim bounds the interim 1xx answers skipped before the final one (net/http's number).
const maxInterim = 5

// readResponse reads the response to req, skipping interim 1xx responses (100 Continue, 103
// Early Hints). A protocol switch is an error: the gateway never asks for one. doubt says
// the answer's framing is not to be trusted with the connection's next exchange: it came
// with both Transfer-Encoding and Content-Length (read by Transfer-Encoding, RFC 9112 6.3,
// which http.ReadResponse does silently), or with a head too large to be checked for that.
func readResponse(br *bufio.Reader, req *http.Request) (res *http.Response, doubt bool, err error) {
	for interim := 0; ; interim++ {
		head := peekHead(br)
		res, err := http.ReadResponse(br, req)
		if err != nil {
			return nil, false, err
		}
		switch {
		case res.StatusCode == http.StatusSwitchingProtocols:
			return nil, false, errors.New("unexpected 101 Switching Protocols")
		case res.StatusCode >= 100 && res.StatusCode < 200:
			if interim == maxInterim {
				return nil, false, fmt.Errorf("more than %d interim 1xx answers", maxInterim)
			}
			continue
		}
		return res, len(res.TransferEncoding) > 0 && (head == nil || hasField(head, "Content-Length")), nil
	}
}

// peekHead returns the head of the response at the start of br (status line and header
// fields, up to the blank line) without consuming it, waiting for its bytes as
// http.ReadResponse would; nil when it does not fit in br's buffer or the connection fails
// first (http.ReadResponse then says why).
func peekHead(br *bufio.Reader) []byte {
	for scanned := 0; ; {
		if br.Buffered() <= scanned {
			if _, err := br.Peek(scanned + 1); err != nil {
				return nil
			}
		}
		b, _ := br.Peek(br.Buffered())
		if i := headEnd(b, max(scanned-2, 0)); i >= 0 {
			return b[:i]
		}
		scanned = len(b)
	}
}

// headEnd returns the length of the head in b (through the line feed that ends its last
// line), looking from index from on; -1 when b holds no blank line. Bare line feeds end lines
// too, as http.ReadResponse reads them.
func headEnd(b []byte, from int) int {
	for i := from; i < len(b); i++ {
		if b[i] != '\n' {
			continue
		}
		switch {
		case i+1 < len(b) && b[i+1] == '\n':
			return i + 1
		case i+2 < len(b) && b[i+1] == '\r' && b[i+2] == '\n':
			return i + 1
		}
	}
	return -1
}

// hasField reports whether head has a header field named name (in any case).
func hasField(head []byte, name string) bool {
	_, fields, _ := bytes.Cut(head, []byte("\n")) // past the status line
	for len(fields) > 0 {
		var line []byte
		line, fields, _ = bytes.Cut(fields, []byte("\n"))
		if k, _, ok := bytes.Cut(line, []byte(":")); ok && bytes.EqualFold(bytes.TrimSpace(k), []byte(name)) {
			return true
		}
	}
	return false
}
