package h2call

import (
	"context"
	"encoding/binary"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
)

// Writing a call: its header block, its message in DATA frames as the
// windows allow, and the control frames due.

// writeField encodes one header field of the request; it returns the
// field's size for SETTINGS_MAX_HEADER_LIST_SIZE.
func (cc *conn) writeField(name, value string) uint32 {
	f := hpack.HeaderField{Name: name, Value: value}
	_ = cc.henc.WriteField(f)
	return f.Size()
}

// writeHeaders appends the request's HEADERS (and CONTINUATION) frames, as
// grpc-go writes them, to out.
func (cc *conn) writeHeaders(ctx context.Context, method string) error {
	c := cc.client
	md, _ := metadata.FromOutgoingContext(ctx)
	cc.hblk.b = cc.hblk.b[:0]
	size := cc.writeField(":method", "POST")
	size += cc.writeField(":scheme", c.scheme)
	size += cc.writeField(":path", method)
	size += cc.writeField(":authority", c.authority)
	size += cc.writeField("content-type", contentType)
	if c.userAgent != "" {
		size += cc.writeField("user-agent", c.userAgent)
	}
	size += cc.writeField("te", "trailers")
	if dl, ok := ctx.Deadline(); ok {
		d := time.Until(dl)
		if d <= 0 {
			return failure(codes.DeadlineExceeded, context.DeadlineExceeded, context.DeadlineExceeded.Error())
		}
		cc.tsBuf = appendTimeout(cc.tsBuf[:0], d)
		size += cc.writeField("grpc-timeout", string(cc.tsBuf))
	}
	for k, vs := range md {
		if reservedHeader(k) {
			continue
		}
		for _, v := range vs {
			size += cc.writeField(k, encodeMetadataValue(k, v))
		}
	}
	if cc.peerMaxHeaders != 0 && size > cc.peerMaxHeaders {
		return failuref(codes.Internal, nil, "header list size to send violates the maximum size (%d bytes) set by server", cc.peerMaxHeaders)
	}
	blk := cc.hblk.b
	for first := true; first || len(blk) > 0; first = false {
		n := min(len(blk), int(cc.peerMaxFrame))
		frag := blk[:n]
		blk = blk[n:]
		if first {
			_ = cc.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: cc.st.id, BlockFragment: frag, EndHeaders: len(blk) == 0})
		} else {
			_ = cc.fr.WriteContinuation(cc.st.id, len(blk) == 0, frag)
		}
	}
	if sh := c.sh; sh != nil {
		h := md.Copy()
		if h == nil {
			h = metadata.MD{}
		}
		if c.userAgent != "" {
			h.Set("user-agent", c.userAgent)
		}
		sh.HandleRPC(ctx, &stats.OutHeader{
			Client:     true,
			FullMethod: method,
			RemoteAddr: cc.remote,
			LocalAddr:  cc.local,
			Header:     h,
			Authority:  c.authority,
		})
	}
	return nil
}

// send writes the request message, as much as the flow-control windows
// allow at a time, reading what the server sends meanwhile when they are
// closed. It stops early when the server ends the stream first.
func (cc *conn) send(req []byte) error {
	st := &cc.st
	total := 5 + len(req)
	for st.sent < total && !st.done {
		off := st.sent
		avail := min(cc.sendWin, st.sendWin)
		if avail <= 0 {
			if err := cc.flush(); err != nil {
				return err
			}
			if err := cc.step(); err != nil {
				return err
			}
			continue
		}
		n := int(min(int64(total-off), avail))
		cc.appendData(req, off, n, off+n == total)
		cc.sendWin -= int64(n)
		st.sendWin -= int64(n)
		st.sent += n
	}
	if st.done {
		// Answered before the whole request went out: what is unsent
		// stays unsent, and our half of the stream is reset.
		if !st.endSent {
			cc.pendingRST = st.id
		}
		return nil
	}
	if err := cc.flush(); err != nil {
		return err
	}
	st.endSent = true
	return nil
}

// appendData appends DATA frames carrying bytes [off, off+n) of the
// message as it is sent (a 5-byte gRPC prefix, then req) to out; the last
// frame ends the stream when end.
func (cc *conn) appendData(req []byte, off, n int, end bool) {
	for n > 0 {
		k := min(n, int(cc.peerMaxFrame))
		var flags http2.Flags
		if end && k == n {
			flags = http2.FlagDataEndStream
		}
		id := cc.st.id
		cc.out.b = append(cc.out.b, byte(k>>16), byte(k>>8), byte(k), byte(http2.FrameData), byte(flags),
			byte(id>>24), byte(id>>16), byte(id>>8), byte(id))
		rest := k
		for rest > 0 && off < 5 {
			var p [5]byte
			p[0] = 0 // not compressed
			binary.BigEndian.PutUint32(p[1:], uint32(len(req)))
			m := min(rest, 5-off)
			cc.out.b = append(cc.out.b, p[off:off+m]...)
			off += m
			rest -= m
		}
		if rest > 0 {
			cc.out.b = append(cc.out.b, req[off-5:off-5+rest]...)
			off += rest
		}
		n -= k
	}
}

// appendControl appends the control frames due to out: a PING's ack, and
// the windows to grant back.
func (cc *conn) appendControl() {
	if cc.pendingRST != 0 {
		_ = cc.fr.WriteRSTStream(cc.pendingRST, http2.ErrCodeNo)
		cc.pendingRST = 0
	}
	if cc.pingAck {
		_ = cc.fr.WritePing(true, cc.pingData)
		cc.pingAck = false
	}
	if cc.recvUnacked >= connWindow/4 {
		_ = cc.fr.WriteWindowUpdate(0, cc.recvUnacked)
		cc.recvUnacked = 0
	}
	if st := &cc.st; !st.done && st.recvUnacked >= recvWindow/4 {
		_ = cc.fr.WriteWindowUpdate(st.id, st.recvUnacked)
		st.recvAvail += int64(st.recvUnacked)
		st.recvUnacked = 0
	}
}

// flush writes out, after the control frames due.
func (cc *conn) flush() error {
	cc.appendControl()
	if len(cc.out.b) == 0 {
		return nil
	}
	n, err := cc.w.Write(cc.out.b)
	if err != nil && cc.paused(err) {
		// What did not go out goes first when the call goes on.
		cc.out.b = cc.out.b[:copy(cc.out.b, cc.out.b[n:])]
		return errPaused
	}
	cc.out.b = cc.out.b[:0]
	if err != nil {
		return transportFailure(err, "connection error: write")
	}
	return nil
}
