package fwdauth

import (
	"bytes"
	"net/http"
)

// HeaderError carries a refusal's JSON error body in a header too: nginx's auth_request keeps
// the auth answer's headers (auth_request_set) but never its body, so an nginx config answers
// the client with this header's value as its body.
const HeaderError = "X-Gateway-Error"

// maxErrorHeader bounds the body copied into HeaderError (the gateway's error bodies are a few
// hundred bytes).
const maxErrorHeader = 4 << 10

// refusalWriter holds back a refusal's status until its body is written, so the body can go
// into HeaderError first. 2xx answers pass straight through.
type refusalWriter struct {
	http.ResponseWriter
	status int // held back; 0 once written (or never held)
}

// Unwrap lets http.ResponseController reach the connection.
func (w *refusalWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *refusalWriter) WriteHeader(code int) {
	if code < 300 || w.status != 0 {
		w.ResponseWriter.WriteHeader(code)
		return
	}
	w.status = code
}

func (w *refusalWriter) Write(p []byte) (int, error) {
	if w.status != 0 {
		if body := bytes.TrimSpace(p); len(body) <= maxErrorHeader && !bytes.ContainsAny(body, "\r\n") {
			w.Header().Set(HeaderError, string(body))
		}
		w.flush()
	}
	return w.ResponseWriter.Write(p)
}

// flush writes a status still held back (a refusal without a body).
func (w *refusalWriter) flush() {
	if w.status != 0 {
		code := w.status
		w.status = 0
		w.ResponseWriter.WriteHeader(code)
	}
}
