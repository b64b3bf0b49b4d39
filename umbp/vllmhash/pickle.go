package vllmhash

import "encoding/binary"

// Pickle opcodes used by CPython's pickle.dumps(..., protocol=5) for the
// values vLLM hashes: bytes, str, int, None and tuples of them.
const (
	opProto           = 0x80
	opFrame           = 0x95
	opStop            = '.'
	opNone            = 'N'
	opBinInt          = 'J'
	opBinInt1         = 'K'
	opBinInt2         = 'M'
	opLong1           = 0x8a
	opShortBinUnicode = 0x8c
	opBinUnicode      = 'X'
	opBinUnicode8     = 0x8d
	opShortBinBytes   = 'C'
	opBinBytes        = 'B'
	opBinBytes8       = 0x8e
	opEmptyTuple      = ')'
	opMark            = '('
	opTuple           = 't'
	opTuple1          = 0x85
	opTuple2          = 0x86
	opTuple3          = 0x87
	opMemoize         = 0x94
	opBinGet          = 'h'
	opLongBinGet      = 'j'

	pickleProtocol = 5
	// CPython's framing: a frame is closed at the first opcode boundary
	// after it holds frameTarget bytes; a frame under frameMin bytes gets
	// no FRAME header; a bytes or str payload of frameTarget bytes or more
	// is written outside any frame.
	frameTarget = 64 * 1024
	frameHeader = 9
	frameMin    = 4
)

// pickler writes the byte stream CPython's C pickler produces for
// pickle.dumps(value, protocol=5) when value is built from bytes, str, int,
// None and tuples as vLLM's engine process builds them. It reuses its
// buffers.
//
// CPython's pickler memoises every bytes, str and tuple it writes (MEMOIZE
// gives each the next index), never an int or None, and writes an object
// it has already memoised, by identity, as a memo lookup (BINGET, or
// LONG_BINGET past index 255) in place of a second copy. So the bytes
// depend on which equal values are one object. In the values vLLM hashes,
// the parent hash and every tuple are distinct objects. The strings of the
// extra keys (LoRA name, multimodal identifiers, cache salt) reach vLLM's
// engine core process in the request's msgpack, whose strings msgspec
// decodes with PyUnicode_DecodeUTF8: that returns CPython's cached
// singletons for the empty string and for every one-character string of a
// code point up to U+00FF, and a new object for any other string. So in
// one block's extra keys, equal strings of at most one Latin-1 character
// are one object, and all other strings are distinct, equal or not (seen
// with CPython 3.11; 3.10 to 3.13 share the cache and the decoder's use of
// it). saveStr writes the first of a kind once
// per pickle and a lookup for each repeat; every other string in full.
//
// An engine run in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0) hashes the
// caller's own string objects instead: one str object passed as both LoRA
// name and salt, say, would be shared there and not here.
type pickler struct {
	buf        []byte
	frameStart int // offset of the open frame's header, or -1
	memo       int // objects memoised: the index the next one gets
	// shared holds the memo index of each shared string (see above)
	// written in this pickle.
	shared []sharedStr
}

// sharedStr is a string CPython shares and the memo index it got: key is
// its code point, or -1 for the empty string.
type sharedStr struct {
	key int32
	idx int
}

// sharedKey returns the key of a string CPython shares (the empty string,
// or one character U+0000 to U+00FF) and whether s is one.
func sharedKey(s string) (int32, bool) {
	switch {
	case s == "":
		return -1, true
	case len(s) == 1: // ASCII
		return int32(s[0]), true
	case len(s) == 2 && (s[0] == 0xc2 || s[0] == 0xc3): // U+0080 to U+00FF
		return int32(s[0]&0x1f)<<6 | int32(s[1]&0x3f), true
	}
	return 0, false
}

// begin starts a new pickle in the reused buffer.
func (p *pickler) begin() {
	p.buf = append(p.buf[:0], opProto, pickleProtocol)
	p.frameStart = -1
	p.memo = 0
	p.shared = p.shared[:0]
}

// memoize writes MEMOIZE, giving the object just written the next index.
func (p *pickler) memoize() {
	p.op(opMemoize)
	p.memo++
}

// get writes a lookup of memo entry idx, as CPython's save_get.
func (p *pickler) get(idx int) {
	p.open()
	if idx < 256 {
		p.buf = append(p.buf, opBinGet, byte(idx))
		return
	}
	p.buf = append(p.buf, opLongBinGet, byte(idx), byte(idx>>8), byte(idx>>16), byte(idx>>24))
}

// end writes STOP, closes the last frame and returns the pickle. The slice
// is valid until the next begin.
func (p *pickler) end() []byte {
	p.op(opStop)
	p.commit()
	return p.buf
}

// open starts a frame if none is open, as every framed write does.
func (p *pickler) open() {
	if p.frameStart < 0 {
		p.frameStart = len(p.buf)
		p.buf = append(p.buf, 0, 0, 0, 0, 0, 0, 0, 0, 0)
	}
}

// commit closes the open frame: its header is filled in, or removed if the
// frame is too small to be worth one.
func (p *pickler) commit() {
	if p.frameStart < 0 {
		return
	}
	n := len(p.buf) - p.frameStart - frameHeader
	if n >= frameMin {
		p.buf[p.frameStart] = opFrame
		binary.LittleEndian.PutUint64(p.buf[p.frameStart+1:], uint64(n))
	} else {
		copy(p.buf[p.frameStart:], p.buf[p.frameStart+frameHeader:])
		p.buf = p.buf[:len(p.buf)-frameHeader]
	}
	p.frameStart = -1
}

// boundary is where CPython's save() starts: a frame that has reached the
// target size is closed here.
func (p *pickler) boundary() {
	if p.frameStart >= 0 && len(p.buf)-p.frameStart-frameHeader >= frameTarget {
		p.commit()
	}
}

func (p *pickler) op(b byte) {
	p.open()
	p.buf = append(p.buf, b)
}

func (p *pickler) op2(a, b byte) {
	p.open()
	p.buf = append(p.buf, a, b)
}

// payloadHeader writes the header of a bytes or str object of n bytes; the
// caller appends the data. A large payload closes the open frame and goes
// out unframed, with its header.
func (p *pickler) payloadHeader(header []byte, n int) {
	if n >= frameTarget {
		p.commit()
	} else {
		p.open()
	}
	p.buf = append(p.buf, header...)
}

// sizedHeader returns the header for a payload of n bytes: the short opcode
// with a 1-byte length, the 4-byte form, or the 8-byte form.
func sizedHeader(dst *[9]byte, n int, short, long4, long8 byte) []byte {
	switch {
	case n <= 0xff:
		dst[0], dst[1] = short, byte(n)
		return dst[:2]
	case uint64(n) <= 0xffffffff:
		dst[0] = long4
		binary.LittleEndian.PutUint32(dst[1:], uint32(n))
		return dst[:5]
	default:
		dst[0] = long8
		binary.LittleEndian.PutUint64(dst[1:], uint64(n))
		return dst[:9]
	}
}

// saveNone writes None.
func (p *pickler) saveNone() {
	p.boundary()
	p.op(opNone)
}

// saveInt writes a Python int.
func (p *pickler) saveInt(v int64) {
	p.boundary()
	p.open()
	switch {
	case v >= 0 && v <= 0xff:
		p.buf = append(p.buf, opBinInt1, byte(v))
	case v >= 0 && v <= 0xffff:
		p.buf = append(p.buf, opBinInt2, byte(v), byte(v>>8))
	case v >= -1<<31 && v < 1<<31:
		p.buf = append(p.buf, opBinInt, byte(v), byte(v>>8), byte(v>>16), byte(v>>24))
	default:
		p.buf = appendLong1(p.buf, v)
	}
}

// appendLong1 appends LONG1 and v as CPython encodes it: little-endian
// two's complement in bit_length(|v|)/8+1 bytes, less a redundant 0xff sign
// byte for some negative values.
func appendLong1(dst []byte, v int64) []byte {
	mag := uint64(v)
	if v < 0 {
		mag = -mag
	}
	nbits := 0
	for m := mag; m != 0; m >>= 1 {
		nbits++
	}
	n := nbits/8 + 1 // at most 9
	var b [9]byte
	for i := range n {
		if i < 8 {
			b[i] = byte(uint64(v) >> (8 * i))
		} else if v < 0 {
			b[i] = 0xff
		}
	}
	if v < 0 && n > 1 && b[n-1] == 0xff && b[n-2]&0x80 != 0 {
		n--
	}
	dst = append(dst, opLong1, byte(n))
	return append(dst, b[:n]...)
}

// saveBytes writes a bytes object.
func (p *pickler) saveBytes(b []byte) {
	p.boundary()
	var h [9]byte
	p.payloadHeader(sizedHeader(&h, len(b), opShortBinBytes, opBinBytes, opBinBytes8), len(b))
	p.buf = append(p.buf, b...)
	p.memoize()
}

// saveStr writes a str object, or a lookup of the shared one already
// written (see pickler); s must be valid UTF-8.
func (p *pickler) saveStr(s string) {
	p.boundary() // CPython's save() starts here, memo lookups included
	key, shared := sharedKey(s)
	if shared {
		for _, e := range p.shared {
			if e.key == key {
				p.get(e.idx)
				return
			}
		}
		p.shared = append(p.shared, sharedStr{key: key, idx: p.memo})
	}
	var h [9]byte
	p.payloadHeader(sizedHeader(&h, len(s), opShortBinUnicode, opBinUnicode, opBinUnicode8), len(s))
	p.buf = append(p.buf, s...)
	p.memoize()
}

// startTuple begins a tuple of n elements (n > 0); the caller saves the
// elements and then calls endTuple(n).
func (p *pickler) startTuple(n int) {
	p.boundary()
	if n > 3 {
		p.op(opMark)
	}
}

// endTuple closes a tuple of n elements started by startTuple.
func (p *pickler) endTuple(n int) {
	switch n {
	case 1:
		p.op2(opTuple1, opMemoize)
	case 2:
		p.op2(opTuple2, opMemoize)
	case 3:
		p.op2(opTuple3, opMemoize)
	default:
		p.op2(opTuple, opMemoize)
	}
	p.memo++
}

// saveTokens writes tuple(tokens) for a non-empty block.
func (p *pickler) saveTokens(tokens []int32) {
	p.startTuple(len(tokens))
	for _, t := range tokens {
		// Inline saveInt for the common case: no frame to close and a
		// small value.
		if p.frameStart >= 0 && len(p.buf)-p.frameStart-frameHeader < frameTarget {
			switch {
			case t >= 0 && t <= 0xff:
				p.buf = append(p.buf, opBinInt1, byte(t))
				continue
			case t >= 0 && t <= 0xffff:
				p.buf = append(p.buf, opBinInt2, byte(t), byte(t>>8))
				continue
			}
			p.buf = append(p.buf, opBinInt, byte(t), byte(t>>8), byte(t>>16), byte(t>>24))
			continue
		}
		p.saveInt(int64(t))
	}
	p.endTuple(len(tokens))
}
