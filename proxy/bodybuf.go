package proxy

import (
	"sync"
	"unsafe"
)

// bodyBuffers recycles the buffers that hold streamed requests' bodies, in power-of-two
// classes from 4 to 64 KiB. A stream's body is needed only until the upstream has it, and a
// conversation is often several KiB: allocated afresh for every stream, those bytes were the
// largest garbage a stream left, and with thousands of streams opening, garbage is what a
// process's resident memory peaks on. Larger bodies are allocated as before.
type bodyBuffers struct {
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

// get returns an empty buffer of at least n bytes' capacity, or nil when n is beyond the
// largest class.
func (b *bodyBuffers) get(n int64) []byte {
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

// put takes back a buffer from get. Its caller must hold the only reference to it. Pooling
// a pointer to the first element (as bufferPool does) keeps Put from allocating.
func (b *bodyBuffers) put(buf []byte) {
	c := bodyClass(int64(cap(buf)))
	if c < 0 || cap(buf) != bodyClassMin<<c {
		return // not one of ours (grown by append, or beyond the classes)
	}
	b.classes[c].Put(&buf[:1][0])
}
