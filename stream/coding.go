package stream

import (
	"bufio"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"errors"
	"fmt"
	"io"
	"net/textproto"
	"strings"

	"github.com/andybalholm/brotli"
	"github.com/klauspost/compress/zstd"
)

// The gateway reads streamed answers (their finish, usage and text) to charge and cut them,
// so it must see their bytes in clear: an answer in gzip would otherwise pass whole and cost
// its prompt estimate alone, whatever the client's budget. The gateway asks the upstream for
// identity, and an answer that comes encoded all the same (an upstream, CDN or ingress that
// compresses regardless) is decoded on its way (NewDecoder): the tap reads the text, the client
// gets that same text without the coding (every HTTP client takes identity), and a cut answer
// still ends as a valid stream. An answer in a coding the gateway cannot decode passes as it
// came; its tap counts every byte as answer text (Opaque).

// Coding is a content coding the gateway decodes.
type Coding uint8

const (
	codingGzip Coding = iota + 1
	codingDeflate
	codingBrotli
	codingZstd
)

// encodingLabels are the values of gateway_stream_encoded_total's encoding label: the codings
// the gateway decodes, in Coding's order, and "other" for an answer it cannot.
var encodingLabels = [...]string{"gzip", "deflate", "br", "zstd", "other"}

// EncodingLabels are the values an Encoding's String gives.
func EncodingLabels() []string { return encodingLabels[:] }

func (c Coding) String() string { return encodingLabels[c-1] }

// Encoding is an answer's encoding label (a byte, so that a request's state keeps its size):
// 0 for none, else encodingLabels[e-1].
type Encoding uint8

// EncodingOther labels an answer in a coding the gateway cannot read.
const EncodingOther = Encoding(len(encodingLabels))

func (e Encoding) String() string {
	if e == 0 {
		return ""
	}
	return encodingLabels[e-1]
}

// maxCodings bounds the codings of one answer the gateway undoes; an answer with more is
// read as one it cannot decode.
const maxCodings = 2

// Codings reads the values of a Content-Encoding: the codings applied, in the order they were,
// and the label of the answer (its outermost coding, EncodingOther when one cannot be decoded,
// 0 when it names none but identity). ok is false when the answer cannot be decoded.
func Codings(values []string) (cs []Coding, label Encoding, ok bool) {
	for _, v := range values {
		for tok := range strings.SplitSeq(v, ",") {
			var c Coding
			switch tok = textproto.TrimString(tok); {
			case tok == "", strings.EqualFold(tok, "identity"):
				continue
			case strings.EqualFold(tok, "gzip"), strings.EqualFold(tok, "x-gzip"):
				c = codingGzip
			case strings.EqualFold(tok, "deflate"):
				c = codingDeflate
			case strings.EqualFold(tok, "br"):
				c = codingBrotli
			case strings.EqualFold(tok, "zstd"):
				c = codingZstd
			default:
				return nil, EncodingOther, false
			}
			if len(cs) == maxCodings {
				return nil, EncodingOther, false
			}
			cs = append(cs, c)
		}
	}
	if len(cs) == 0 {
		return nil, 0, true
	}
	return cs, Encoding(cs[len(cs)-1]), true
}

// NewDecoder is raw, an answer's body in codings cs, undone of them.
func NewDecoder(raw io.ReadCloser, cs []Coding) io.ReadCloser {
	return &decodingBody{raw: raw, codings: cs}
}

// decodingBody is an answer's body undone of its content codings. The decoders start at the
// first read, not before: a gzip or zstd reader reads its header at once, which would hold the
// response's headers back until the upstream's first part. Each decoder returns what the
// upstream flushed (a sync flush, a block's end) as soon as it arrived, so a part reaches the
// client as it would have in clear.
type decodingBody struct {
	raw     io.ReadCloser
	codings []Coding
	r       io.Reader   // the decoded answer, once open
	closers []io.Closer // the decoders that hold resources
	err     error       // opening failed
	closed  bool
}

func (d *decodingBody) Read(p []byte) (int, error) {
	if d.r == nil {
		if d.err == nil {
			d.err = d.open()
		}
		if d.err != nil {
			return 0, d.err
		}
	}
	return d.r.Read(p)
}

// open stacks a decoder per coding, the last applied undone first. An empty body is an
// empty answer in any coding, as clients read it (an upstream may send one with the coding
// header of its non-empty answers).
func (d *decodingBody) open() error {
	raw := bufio.NewReader(d.raw) // an io.ByteReader: flate reads it without a buffer of its own
	if _, err := raw.Peek(1); err != nil {
		return err
	}
	var r io.Reader = raw
	for i := len(d.codings) - 1; i >= 0; i-- {
		c := d.codings[i]
		var err error
		switch c {
		case codingGzip:
			var z *gzip.Reader
			if z, err = gzip.NewReader(r); err == nil {
				r, d.closers = z, append(d.closers, z)
			}
		case codingDeflate:
			r, err = openDeflate(r)
			if rc, ok := r.(io.Closer); ok && err == nil {
				d.closers = append(d.closers, rc)
			}
		case codingBrotli:
			r = brotli.NewReader(r)
		case codingZstd:
			// One goroutine-free decoder per answer, its window bounded (a stream's is small; the
			// bound stops a hostile frame from taking memory without end).
			var z *zstd.Decoder
			z, err = zstd.NewReader(r, zstd.WithDecoderConcurrency(1), zstd.WithDecoderLowmem(true), zstd.WithDecoderMaxWindow(maxZstdWindow))
			if err == nil {
				r, d.closers = z, append(d.closers, zstdCloser{z})
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) {
				return io.EOF // an empty answer
			}
			return fmt.Errorf("decoding the answer's %s: %w", c, err)
		}
	}
	d.r = r
	return nil
}

// maxZstdWindow bounds a zstd answer's window (its decoder's memory).
const maxZstdWindow = 8 << 20

// openDeflate reads "deflate" as clients do: the zlib format RFC 9110 names, or the raw
// deflate some servers send instead, told apart by the zlib header (method 8, check bits).
func openDeflate(r io.Reader) (io.Reader, error) {
	br, ok := r.(*bufio.Reader)
	if !ok {
		br = bufio.NewReaderSize(r, 64) // see open
	}
	h, err := br.Peek(2)
	if err != nil {
		if len(h) == 0 && err == io.EOF {
			return nil, io.EOF
		}
		return nil, err
	}
	if h[0]&0x0f == 8 && (uint16(h[0])<<8|uint16(h[1]))%31 == 0 {
		return zlib.NewReader(br)
	}
	return flate.NewReader(br), nil
}

// zstdCloser frees a zstd decoder (its Close returns nothing).
type zstdCloser struct{ z *zstd.Decoder }

func (c zstdCloser) Close() error { c.z.Close(); return nil }

// Close frees the decoders and closes the upstream's body; a second Close does nothing.
func (d *decodingBody) Close() error {
	if d.closed {
		return nil
	}
	d.closed = true
	for _, c := range d.closers {
		_ = c.Close()
	}
	return d.raw.Close()
}
