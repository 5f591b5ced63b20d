package admin

import (
	"bytes"
	"net/http"
	"net/http/pprof"
	"strings"
)

// pprofIndex serves net/http/pprof's index at /debug/pprof, the address the OpenAPI document
// gives it (a path that ends in a slash is a lint error there); /debug/pprof/ serves it too,
// as pprof.Index. Its links are relative to /debug/pprof/, which a <base> element makes them
// at this address as well.
func pprofIndex(w http.ResponseWriter, r *http.Request) {
	rec := &pageRecorder{header: w.Header()}
	r2 := r.Clone(r.Context())
	r2.URL.Path = "/debug/pprof/"
	pprof.Index(rec, r2)
	page := strings.Replace(rec.body.String(), "<head>", `<head><base href="/debug/pprof/">`, 1)
	if rec.status != 0 {
		w.WriteHeader(rec.status)
	}
	_, _ = w.Write([]byte(page))
}

// pageRecorder keeps a small page a handler writes, to change it before it is sent.
type pageRecorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (p *pageRecorder) Header() http.Header         { return p.header }
func (p *pageRecorder) Write(b []byte) (int, error) { return p.body.Write(b) }
func (p *pageRecorder) WriteHeader(status int)      { p.status = status }
