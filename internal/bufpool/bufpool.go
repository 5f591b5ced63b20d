// Package bufpool recycles byte buffers without the allocation a []byte in a sync.Pool costs per Put.
package bufpool

import (
	"sync"
	"unsafe"
)

// Classes recycles the buffers that hold streamed requests' bodies, in power-of-two
// classes from 4 to 64 KiB. A stream's body is needed only until the upstream has it, and a
// conversation is often several KiB: allocated afresh for every stream, those bytes were the
// largest garbage a stream left, and with thousands of streams opening, garbage is what a
// process's resident memory peaks on. Larger bodies are allocated as before.
type Classes struct {
	classes [bodyClasses]sync.Pool // *byte: first element of a (bodyClassMin << i)-byte buffer
}

const (
	bodyClassMin = 4 << 10
	bodyClasses  = 5 // 4, 8, 16, 32 and 64 KiB
)

// class is the smallest class holding n bytes, or -1 when none does.
func bodyClass(n int64) int {
	for i := range bodyClasses {
		if n <= int64(bodyClassMin)<<i {
			return i
		}
	}
	return -1
}

// Get returns an empty buffer of at least n bytes' capacity, or nil when n is beyond the
// largest class.
func (b *Classes) Get(n int64) []byte {
	c := bodyClass(n)
	if c < 0 {
		return nil
	}
	size := bodyClassMin << c
	if p, ok := b.classes[c].Get().(*byte); ok {
		return unsafe.Slice(p, size)[:0]
	}
	return make([]byte, 0, size)
}

// Put takes back a buffer from Get. Its caller must hold the only reference to it. Pooling
// a pointer to the first element (as Fixed does) keeps Put from allocating.
func (b *Classes) Put(buf []byte) {
	c := bodyClass(int64(cap(buf)))
	if c < 0 || cap(buf) != bodyClassMin<<c {
		return // not one of ours (grown by append, or beyond the classes)
	}
	b.classes[c].Put(&buf[:1][0])
}

// Fixed reuses buffers of one size (httputil.ReverseProxy's copy buffers: a BufferPool). It
// pools pointers to the buffers' first element, so Put gets the pointer back from the slice
// without allocating a box for it (a []byte in a sync.Pool costs one per Put). An interior
// pointer keeps its whole allocation alive, so unsafe.Slice over size bytes from it is sound.
type Fixed struct {
	p    sync.Pool
	size int
}

// NewFixed is a pool of buffers of size bytes.
func NewFixed(size int) *Fixed {
	b := &Fixed{size: size}
	b.p.New = func() any { return &make([]byte, size)[0] }
	return b
}

// Get returns a buffer of the pool's size.
func (b *Fixed) Get() []byte { return unsafe.Slice(b.p.Get().(*byte), b.size) }

// Put takes back a buffer from Get.
func (b *Fixed) Put(p []byte) {
	if cap(p) >= b.size {
		b.p.Put(&p[:1][0])
	}
}
