// Package encoded sends gRPC requests that were marshalled before their
// call. A lookup is marshalled on its caller's goroutine and sent from a
// detached one that may outlive the caller; what that goroutine holds is
// the encoded bytes, never the caller's keys, which the caller may reuse as
// soon as its lookup returns.
package encoded

import (
	"errors"
	"fmt"
	"sync"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// Message is an encoded request. A call made with CallOption sends it as it
// is, once: the call takes its bytes, whose buffer is recycled once gRPC has
// written them (or when the message is Freed).
type Message struct {
	data mem.BufferSlice // nil once taken
}

// Strings encodes a message whose one set field is the repeated string
// field num holding ss, as proto.Marshal would (field by field, in order),
// in one pass over ss and without reflection: a lookup's request is
// nothing else, and its keys are most of what the caller's goroutine
// spends on it. A string that is not UTF-8 is refused, as the encoder
// refuses it, naming its index.
func Strings(num protowire.Number, ss []string) (*Message, error) {
	tag := protowire.SizeTag(num)
	size := 0
	for i, s := range ss {
		if !utf8.ValidString(s) {
			return nil, &NotUTF8Error{Index: i}
		}
		size += tag + protowire.SizeBytes(len(s))
	}
	buf := bufferFor(size)
	b := (*buf)[:0]
	for _, s := range ss {
		b = protowire.AppendTag(b, num, protowire.BytesType)
		b = protowire.AppendString(b, s)
	}
	if len(b) != size || cap(b) != cap(*buf) { // sized above: never
		panic(fmt.Sprintf("encoded: %d bytes encoded for %d computed", len(b), size))
	}
	*buf = b
	return messageOf(buf), nil
}

// NotUTF8Error is Strings' refusal of the string at Index.
type NotUTF8Error struct{ Index int }

func (e *NotUTF8Error) Error() string { return fmt.Sprintf("string %d is not UTF-8", e.Index) }

// bufferFor returns a buffer of size bytes, from buffers when it is large
// enough to be worth pooling.
func bufferFor(size int) *[]byte {
	if mem.IsBelowBufferPoolingThreshold(size) {
		b := make([]byte, size)
		return &b
	}
	return buffers.Get(size)
}

// messageOf wraps buf, which bufferFor returned and which holds an encoded
// message in full, as a message.
func messageOf(buf *[]byte) *Message {
	if mem.IsBelowBufferPoolingThreshold(len(*buf)) {
		return &Message{data: mem.BufferSlice{mem.SliceBuffer(*buf)}}
	}
	return &Message{data: mem.BufferSlice{mem.NewBuffer(buf, buffers)}}
}

// buffers recycles the buffers of encoded messages. Unlike gRPC's default
// pool it does not clear a buffer it hands out again (a megabyte cleared
// for every lookup of a thousand keys: about 11 µs): every byte of a
// message is written before it is sent.
var buffers = &bufferPool{max: maxPooledBuffer}

// maxPooledBuffer bounds what buffers keeps: a lookup of 64 Ki keys of 100
// bytes.
const maxPooledBuffer = 8 << 20

// bufferPool is a mem.BufferPool of buffers of up to max bytes.
type bufferPool struct {
	p   sync.Pool // of *[]byte
	max int
}

// Get returns a buffer of length n whose contents are not cleared.
func (p *bufferPool) Get(n int) *[]byte {
	if b, ok := p.p.Get().(*[]byte); ok {
		if cap(*b) >= n {
			*b = (*b)[:n]
			return b
		}
		p.p.Put(b) // too small for this one; kept for a smaller one
	}
	b := make([]byte, n)
	return &b
}

// Put gives b back.
func (p *bufferPool) Put(b *[]byte) {
	if cap(*b) <= p.max {
		p.p.Put(b)
	}
}

// Len is the encoded size in bytes; 0 once sent.
func (m *Message) Len() int { return m.data.Len() }

// Bytes returns the encoded bytes, for a caller that writes them itself;
// they stay the message's, valid until it is sent or freed. Nil once sent.
func (m *Message) Bytes() []byte {
	switch len(m.data) {
	case 0:
		return nil
	case 1:
		return m.data[0].ReadOnlyData()
	}
	return m.data.Materialize()
}

// Share returns a second reference to the message's bytes, to send them
// twice (a hedged call): each reference is sent or freed once, and the
// buffer goes back to the pool with the last. Nil once sent.
func (m *Message) Share() *Message {
	if m.data == nil {
		return &Message{}
	}
	m.data.Ref()
	return &Message{data: m.data}
}

// Free gives the buffer of a message that was not sent back to the pool.
// It does nothing to a message already sent. A message dropped without
// Free is left to the garbage collector.
func (m *Message) Free() {
	if m.data != nil {
		m.data.Free()
		m.data = nil
	}
}

// errSent refuses a message sent twice: its bytes went with the first call.
var errSent = errors.New("encoded message already sent")

// codec marshals a *Message as its bytes and anything else, and every reply,
// as gRPC's protobuf codec does.
type codec struct{ proto encoding.CodecV2 }

func (c codec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(*Message)
	if !ok {
		return c.proto.Marshal(v)
	}
	if m.data == nil {
		return nil, errSent
	}
	data := m.data
	m.data = nil // gRPC frees it once written
	return data, nil
}

func (c codec) Unmarshal(data mem.BufferSlice, v any) error { return c.proto.Unmarshal(data, v) }

// Name is empty so that a call keeps the content type a plain call has
// ("application/grpc", gRPC's protobuf default): the bytes on the wire are
// those of a call with the generated stub.
func (codec) Name() string { return "" }

// CallOption makes a call send a *Message as it is.
var CallOption = func() grpc.CallOption {
	pc := encoding.GetCodecV2(grpcproto.Name)
	if pc == nil {
		panic(fmt.Sprintf("encoded: gRPC's %q codec is not registered", grpcproto.Name))
	}
	return grpc.ForceCodecV2(codec{proto: pc})
}()

// Keys is a batch of keys encoded as consecutive requests, one a part.
type Keys struct {
	N     int    // keys in the batch
	Parts []Part // in order, covering [0, N)
	// At, when not nil, are the indexes of the N keys in the caller's
	// batch, some of whose keys were left out (rpc.EncodeAskable).
	At []int
}

// Part is one request of Keys: the keys [Start, End) of the batch.
type Part struct {
	Start, End int
	Msg        *Message
}

// Share returns a second reference to every part of k (Message.Share).
func (k Keys) Share() Keys {
	parts := make([]Part, len(k.Parts))
	for i, p := range k.Parts {
		parts[i] = Part{Start: p.Start, End: p.End, Msg: p.Msg.Share()}
	}
	return Keys{N: k.N, Parts: parts, At: k.At}
}

// Free frees every part not sent.
func (k Keys) Free() {
	for _, p := range k.Parts {
		p.Msg.Free()
	}
}
