// Package codingtest codes HTTP answers part by part, as compressing servers do, for tests.
//
// Codingtest codes HTTP answers as a compressing server, CDN or ingress does, part by
// part, for the tests of how the gateway reads coded streams.
package codingtest

import (
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"fmt"
	"io"
	"net/http"

	"github.com/andybalholm/brotli"
	"github.com/klauspost/compress/zstd"
)

// Codings are the codings a Writer knows, by the name the tests use, each with the
// Content-Encoding it sends: rawdeflate is "deflate" as some servers send it, without the zlib
// wrapper; stacked is br over gzip; xor is x-xor, a coding only these tests know.
func Codings() map[string]string {
	return map[string]string{
		"gzip":       "gzip",
		"deflate":    "deflate",
		"rawdeflate": "deflate",
		"br":         "br",
		"zstd":       "zstd",
		"stacked":    "gzip, br",
		"xor":        "x-xor",
	}
}

// Writer codes what is written to its ResponseWriter: each Flush flushes the coder (a sync
// flush), then the connection, as a server that streams and compresses does. Close ends the
// coding.
type Writer struct {
	http.ResponseWriter
	coding string
	enc    flushCloser
}

// NewWriter codes w's answer in coding (a name of Codings).
func NewWriter(w http.ResponseWriter, coding string) *Writer {
	if _, ok := Codings()[coding]; !ok {
		panic(fmt.Sprintf("codingtest: unknown coding %q", coding))
	}
	return &Writer{ResponseWriter: w, coding: coding}
}

func (c *Writer) WriteHeader(code int) {
	if c.enc == nil {
		c.Header().Set("Content-Encoding", Codings()[c.coding])
		c.Header().Del("Content-Length")
		c.enc = newCoder(c.ResponseWriter, c.coding)
	}
	c.ResponseWriter.WriteHeader(code)
}

func (c *Writer) Write(p []byte) (int, error) {
	if c.enc == nil {
		c.WriteHeader(http.StatusOK)
	}
	return c.enc.Write(p)
}

func (c *Writer) Flush() {
	if c.enc != nil {
		_ = c.enc.Flush()
	}
	http.NewResponseController(c.ResponseWriter).Flush()
}

// Close ends the coding (a gzip trailer, a zstd frame's end).
func (c *Writer) Close() error {
	if c.enc == nil {
		return nil
	}
	return c.enc.Close()
}

type flushCloser interface {
	io.WriteCloser
	Flush() error
}

// Encode codes data whole in coding.
func Encode(coding string, data []byte) []byte {
	var b bytesBuffer
	c := newCoder(&b, coding)
	_, _ = c.Write(data)
	_ = c.Close()
	return b
}

type bytesBuffer []byte

func (b *bytesBuffer) Write(p []byte) (int, error) { *b = append(*b, p...); return len(p), nil }

func newCoder(w io.Writer, coding string) flushCloser {
	switch coding {
	case "gzip":
		return gzip.NewWriter(w)
	case "deflate":
		return zlib.NewWriter(w)
	case "rawdeflate":
		f, _ := flate.NewWriter(w, flate.DefaultCompression)
		return f
	case "br":
		return brotli.NewWriter(w)
	case "zstd":
		z, _ := zstd.NewWriter(w)
		return z
	case "stacked":
		outer := brotli.NewWriter(w)
		return stacked{gzip.NewWriter(outer), outer}
	case "xor":
		return xorWriter{w}
	}
	panic("codingtest: unknown coding " + coding)
}

// stacked is gzip inside br: "Content-Encoding: gzip, br".
type stacked struct{ inner, outer flushCloser }

func (s stacked) Write(p []byte) (int, error) { return s.inner.Write(p) }

func (s stacked) Flush() error {
	if err := s.inner.Flush(); err != nil {
		return err
	}
	return s.outer.Flush()
}

func (s stacked) Close() error {
	if err := s.inner.Close(); err != nil {
		return err
	}
	return s.outer.Close()
}

// xorWriter is x-xor: every byte xored with 0x5a.
type xorWriter struct{ w io.Writer }

func (x xorWriter) Write(p []byte) (int, error) { return x.w.Write(Xor(p)) }
func (xorWriter) Flush() error                  { return nil }
func (xorWriter) Close() error                  { return nil }

// Xor codes and decodes x-xor.
func Xor(p []byte) []byte {
	out := make([]byte, len(p))
	for i, b := range p {
		out[i] = b ^ 0x5a
	}
	return out
}

// XorReader decodes x-xor as it reads r.
func XorReader(r io.Reader) io.Reader { return xorReader{r} }

type xorReader struct{ r io.Reader }

func (x xorReader) Read(p []byte) (int, error) {
	n, err := x.r.Read(p)
	for i := range p[:n] {
		p[i] ^= 0x5a
	}
	return n, err
}
