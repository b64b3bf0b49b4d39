package h2call

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Reading a call's answer, frame by frame: the framer reads each frame's
// header; payloads are parsed here.

// step reads one frame and acts on it. The framer reads the frame's
// header, checks its size against the limit and the order of header
// blocks; the payload is read into the connection's buffer and parsed
// here, as the framer would, without allocating a frame.
func (cc *conn) step() error {
	if cc.resumable {
		if err := cc.fill(); err != nil {
			return err
		}
	}
	fh, err := cc.fr.ReadFrameHeader()
	if err != nil {
		return cc.readError(err)
	}
	if !cc.sawSettings && (fh.Type != http2.FrameSettings || fh.Flags.Has(http2.FlagSettingsAck)) {
		return transportFailure(nil, fmt.Sprintf("connection error: the server's first frame is %v, not SETTINGS", fh.Type))
	}
	if fh.Type == http2.FrameData {
		return cc.onData(fh)
	}
	if cap(cc.payload) < int(fh.Length) {
		cc.payload = make([]byte, fh.Length)
	}
	p := cc.payload[:fh.Length]
	if _, err := io.ReadFull(cc.br, p); err != nil {
		return cc.readError(err)
	}
	id := fh.StreamID
	switch fh.Type {
	case http2.FrameHeaders:
		return cc.onHeaders(fh, p)
	case http2.FrameContinuation:
		if id == 0 {
			return connError("CONTINUATION frame with stream ID 0")
		}
		return cc.onFragment(p, fh.Flags.Has(http2.FlagContinuationEndHeaders))
	case http2.FrameRSTStream:
		if len(p) != 4 || id == 0 {
			return connError(fmt.Sprintf("RST_STREAM frame of %d bytes on stream %d", len(p), id))
		}
		cc.onRST(id, http2.ErrCode(binary.BigEndian.Uint32(p)))
	case http2.FrameSettings:
		return cc.onSettings(fh, p)
	case http2.FramePing:
		if len(p) != 8 || id != 0 {
			return connError(fmt.Sprintf("PING frame of %d bytes on stream %d", len(p), id))
		}
		if !fh.Flags.Has(http2.FlagPingAck) {
			cc.pingAck = true
			copy(cc.pingData[:], p)
		}
	case http2.FrameGoAway:
		if len(p) < 8 || id != 0 {
			return connError(fmt.Sprintf("GOAWAY frame of %d bytes on stream %d", len(p), id))
		}
		return cc.onGoAway(binary.BigEndian.Uint32(p)&(1<<31-1), http2.ErrCode(binary.BigEndian.Uint32(p[4:])))
	case http2.FrameWindowUpdate:
		if len(p) != 4 {
			return connError(fmt.Sprintf("WINDOW_UPDATE frame of %d bytes", len(p)))
		}
		return cc.onWindowUpdate(id, binary.BigEndian.Uint32(p)&(1<<31-1))
	case http2.FramePriority:
		if id == 0 {
			return connError("PRIORITY frame with stream ID 0")
		}
		if len(p) != 5 {
			return cc.streamError(id, "PRIORITY frame of %d bytes", len(p))
		}
	case http2.FramePushPromise:
		return connError("PUSH_PROMISE, with push disabled")
	}
	return nil // an unknown frame type is ignored
}

// fill reads until the next frame is whole in the read buffer, for a call
// that may pause: a read that a pause interrupts then leaves every byte
// read so far in the buffer (errPaused), and the frame is read once it is
// whole, from the buffer alone. Any other failure is left to the framer's
// read, which meets it again and reports it as it does for any call.
func (cc *conn) fill() error {
	h, err := cc.br.Peek(9)
	if err == nil {
		if n := 9 + (int(h[0])<<16 | int(h[1])<<8 | int(h[2])); n <= cc.br.Size() {
			_, err = cc.br.Peek(n)
		} // a larger frame is one the framer refuses
	}
	if err != nil && cc.paused(err) {
		return errPaused
	}
	return nil
}

// connError is a violation of the protocol that breaks the connection: the
// call is unavailable, as grpc-go's.
func connError(what string) error {
	return transportFailure(nil, "connection error: "+what)
}

// streamError is a violation of the protocol in one stream: the call's
// fails with codes.Internal; another stream's is ignored (nothing of it
// is kept).
func (cc *conn) streamError(id uint32, format string, args ...any) error {
	if id != cc.st.id || cc.st.done {
		return nil
	}
	return protocolError(format, args...)
}

// readError classifies a failure to read a frame: a frame the framer
// refused (too large, or out of a header block's order) breaks the
// connection, as does a failed read.
func (cc *conn) readError(err error) error {
	var ce http2.ConnectionError
	if errors.As(err, &ce) || errors.Is(err, http2.ErrFrameTooLarge) {
		if d := cc.fr.ErrorDetail(); d != nil {
			return failuref(codes.Unavailable, err, "connection error: %v: %v", err, d)
		}
		return transportFailure(err, "connection error")
	}
	return transportFailure(err, "error reading from server")
}

// protocolError fails the call for a violation in its own stream.
func protocolError(format string, args ...any) error {
	return failuref(codes.Internal, nil, format, args...)
}

// onData reads a DATA frame's payload: the call's message, or what is
// discarded of another stream.
func (cc *conn) onData(fh http2.FrameHeader) error {
	if fh.StreamID == 0 {
		return transportFailure(nil, "connection error: DATA frame with stream ID 0")
	}
	size := fh.Length
	cc.recvUnacked += size
	data, pad := int(size), 0
	if fh.Flags.Has(http2.FlagDataPadded) {
		if size == 0 {
			return transportFailure(nil, "connection error: padded DATA frame without a pad length")
		}
		b, err := cc.br.ReadByte()
		if err != nil {
			return cc.readError(err)
		}
		pad = int(b)
		data--
		if pad > data {
			return transportFailure(nil, "connection error: pad size larger than data payload")
		}
		data -= pad
	}
	st := &cc.st
	if fh.StreamID != st.id || st.done {
		// Another stream's (an old one's): discarded, its bytes granted
		// back to the connection's window.
		if err := cc.discard(data + pad); err != nil {
			return err
		}
		if cc.recvUnacked >= connWindow/2 {
			return cc.flush()
		}
		return nil
	}
	if int64(size) > st.recvAvail {
		return protocolError("received %d-bytes data exceeding the limit %d bytes", size, st.recvAvail)
	}
	st.recvAvail -= int64(size)
	st.recvUnacked += size
	switch {
	case st.nonGRPC != nil:
		n := min(data, nonGRPCDataMax-len(st.nonGRPCData))
		if n > 0 {
			start := len(st.nonGRPCData)
			st.nonGRPCData = append(st.nonGRPCData, make([]byte, n)...)
			if _, err := io.ReadFull(cc.br, st.nonGRPCData[start:]); err != nil {
				return cc.readError(err)
			}
		}
		if err := cc.discard(data - n + pad); err != nil {
			return err
		}
		if len(st.nonGRPCData) >= nonGRPCDataMax || fh.Flags.Has(http2.FlagDataEndStream) {
			cc.endNonGRPC()
		}
		return nil
	case !st.headers:
		return protocolError("protocol error: DATA frame before the response headers")
	}
	if err := cc.readMessage(data); err != nil {
		return err
	}
	if err := cc.discard(pad); err != nil {
		return err
	}
	if fh.Flags.Has(http2.FlagDataEndStream) {
		return protocolError("server closed the stream without sending trailers")
	}
	if st.recvUnacked >= recvWindow/4 || cc.recvUnacked >= connWindow/2 {
		return cc.flush()
	}
	return nil
}

// discard skips n bytes of a frame's payload.
func (cc *conn) discard(n int) error {
	if n == 0 {
		return nil
	}
	if _, err := cc.br.Discard(n); err != nil {
		return cc.readError(err)
	}
	return nil
}

// readMessage reads n bytes of the stream's gRPC messages: the 5-byte
// prefix, checked before anything is allocated for the message, then the
// message, into a buffer that grows with what arrives (never past
// MaxReplyBytes). A complete message is unmarshalled at once.
func (cc *conn) readMessage(n int) error {
	st := &cc.st
	for n > 0 {
		if st.prefixN < 5 {
			k := min(n, 5-st.prefixN)
			if _, err := io.ReadFull(cc.br, st.prefix[st.prefixN:st.prefixN+k]); err != nil {
				return cc.readError(err)
			}
			st.prefixN += k
			n -= k
			if st.prefixN < 5 {
				continue
			}
			if err := cc.startMessage(); err != nil {
				return err
			}
			if st.msgLen == 0 {
				if err := cc.endMessage(); err != nil {
					return err
				}
			}
			continue
		}
		k := min(n, st.msgLen-st.got)
		if need := st.got + k; need > cap(cc.reply) {
			grown := make([]byte, min(st.msgLen, max(need, 2*cap(cc.reply), 4096)))
			copy(grown, cc.reply[:st.got])
			cc.reply = grown
		}
		cc.reply = cc.reply[:cap(cc.reply)]
		if _, err := io.ReadFull(cc.br, cc.reply[st.got:st.got+k]); err != nil {
			return cc.readError(err)
		}
		st.got += k
		n -= k
		if st.got == st.msgLen {
			if err := cc.endMessage(); err != nil {
				return err
			}
		}
	}
	return nil
}

// startMessage checks a message's prefix, as grpc-go: its length against
// MaxReplyBytes first, then its format.
func (cc *conn) startMessage() error {
	st := &cc.st
	length := binary.BigEndian.Uint32(st.prefix[1:])
	if max := cc.client.maxReply; int64(length) > int64(max) {
		return failuref(codes.ResourceExhausted, nil, "grpc: received message larger than max (%d vs. %d)", length, max)
	}
	if st.msgs > 0 {
		return protocolError("cardinality violation: expected <EOF> for non server-streaming RPCs, but received another message")
	}
	switch st.prefix[0] {
	case 0:
	case 1:
		if st.encoding == "" || st.encoding == "identity" {
			return protocolError("grpc: compressed flag set with identity or empty encoding")
		}
		return protocolError("grpc: Decompressor is not installed for grpc-encoding %q", st.encoding)
	default:
		return protocolError("grpc: received unexpected payload format %d", st.prefix[0])
	}
	st.msgLen, st.got = int(length), 0
	return nil
}

// endMessage unmarshals the message just received into the call's reply.
func (cc *conn) endMessage() error {
	st := &cc.st
	st.msgDone = true
	st.msgs++
	st.prefixN = 0
	if err := proto.Unmarshal(cc.reply[:st.msgLen], st.resp); err != nil {
		return protocolError("grpc: failed to unmarshal the received message: %v", err)
	}
	if sh := cc.client.sh; sh != nil {
		sh.HandleRPC(st.ctx, &stats.InPayload{
			Client:           true,
			Payload:          st.resp,
			Length:           st.msgLen,
			CompressedLength: st.msgLen,
			WireLength:       st.msgLen + 5,
			RecvTime:         time.Now(),
		})
	}
	return nil
}

// onHeaders starts a header block.
func (cc *conn) onHeaders(fh http2.FrameHeader, p []byte) error {
	if fh.StreamID == 0 {
		return connError("HEADERS frame with stream ID 0")
	}
	pad := 0
	if fh.Flags.Has(http2.FlagHeadersPadded) {
		if len(p) < 1 {
			return connError("padded HEADERS frame without a pad length")
		}
		pad, p = int(p[0]), p[1:]
	}
	if fh.Flags.Has(http2.FlagHeadersPriority) {
		if len(p) < 5 {
			return connError("HEADERS frame too short for its priority")
		}
		p = p[5:]
	}
	if pad > len(p) {
		// Its fragment is lost: the header table can no longer be
		// trusted.
		if err := cc.streamError(fh.StreamID, "HEADERS frame with a pad longer than its payload"); err != nil {
			return err
		}
		return connError("HEADERS frame with a pad longer than its payload")
	}
	st := &cc.st
	ours := fh.StreamID == st.id && !st.done
	cc.blk.reset(fh.StreamID, ours, fh.Flags.Has(http2.FlagHeadersEndStream), int(fh.Length), cc.client.sh != nil)
	cc.blockBytes = 0
	return cc.onFragment(p[:len(p)-pad], fh.Flags.Has(http2.FlagHeadersEndHeaders))
}

// onFragment decodes a fragment of the header block being received; the
// decoder's table is the connection's, so every block is decoded, whatever
// its stream.
func (cc *conn) onFragment(frag []byte, end bool) error {
	cc.blockBytes += len(frag)
	if cc.blockBytes > 2*maxHeaderList {
		return transportFailure(nil, "connection error: header block too large")
	}
	if _, err := cc.hdec.Write(frag); err != nil {
		return failuref(codes.Unavailable, err, "connection error: header block: %v", err)
	}
	if !end {
		return nil
	}
	if err := cc.hdec.Close(); err != nil {
		return failuref(codes.Unavailable, err, "connection error: header block: %v", err)
	}
	if !cc.blk.ours {
		return nil
	}
	return cc.operateHeaders()
}

// operateHeaders acts on a header block of the call's stream, as grpc-go's
// client does: the response headers, the trailers, or an answer that is
// not gRPC.
func (cc *conn) operateHeaders() error {
	b, st := &cc.blk, &cc.st
	initial := !st.headers
	switch {
	case !initial && !b.endStream && st.nonGRPC == nil:
		return protocolError("a HEADERS frame cannot appear in the middle of a stream")
	case b.tooBig:
		return protocolError("peer header list size exceeded limit")
	case b.invalid != "":
		return protocolError("%s", b.invalid)
	}
	if st.nonGRPC != nil {
		if b.endStream {
			cc.endNonGRPC()
		}
		return nil
	}
	isGRPC := !initial
	ctErr := "malformed header: missing HTTP content-type"
	if b.haveCType {
		if grpcContentType(b.ctype) {
			isGRPC, ctErr = true, ""
		} else {
			ctErr = fmt.Sprintf("transport: received unexpected content-type %q", b.ctype)
		}
	}
	code := codes.Unknown
	if b.haveGStatus {
		c, err := codeOf(b.grpcStatus)
		if err != nil {
			return failuref(codes.Unknown, nil, "transport: malformed grpc-status: %v", err)
		}
		code = c
	}
	if !isGRPC {
		return cc.notGRPC(ctErr)
	}
	if b.mdErr != "" {
		return protocolError("%s", b.mdErr)
	}
	sh := cc.client.sh
	if !b.endStream {
		st.headers = true
		st.encoding = b.encoding
		if sh != nil {
			sh.HandleRPC(st.ctx, &stats.InHeader{Client: true, WireLength: b.wireLen, Header: b.md.Copy(), Compression: b.encoding})
		}
		return nil
	}
	if sh != nil {
		sh.HandleRPC(st.ctx, &stats.InTrailer{Client: true, WireLength: b.wireLen, Trailer: b.md.Copy()})
	}
	st.done, st.clean, st.trailer = true, true, b.md
	switch {
	case st.prefixN > 0 || (st.msgLen >= 0 && !st.msgDone):
		st.err = failure(codes.Internal, io.ErrUnexpectedEOF, io.ErrUnexpectedEOF.Error())
		st.clean = false
	case code != codes.OK:
		st.err = status.New(code, decodeGrpcMessage(b.grpcMessage)).Err()
	case !st.msgDone:
		st.err = protocolError("cardinality violation: received no response message from non-server-streaming RPC")
		st.clean = false
	}
	return nil
}

// notGRPC acts on a response header block that is not gRPC's: its HTTP
// status says what failed (informational ones are skipped), and the start
// of its body is quoted when it has one.
func (cc *conn) notGRPC(ctErr string) error {
	b, st := &cc.blk, &cc.st
	code := codes.Internal
	var errs []string
	if !b.haveStatus {
		errs = append(errs, "malformed header: missing HTTP status")
	} else {
		n, err := strconv.Atoi(b.status)
		if err != nil {
			return protocolError("transport: malformed http-status: %v", err)
		}
		if n >= 100 && n < 200 {
			if b.endStream {
				return protocolError("protocol error: informational header with status code %d must not have END_STREAM set", n)
			}
			return nil
		}
		errs = append(errs, fmt.Sprintf("unexpected HTTP status code received from server: %d (%s)", n, http.StatusText(n)))
		c, ok := httpCodes[n]
		if !ok {
			c = codes.Unknown
		}
		code = c
	}
	if ctErr != "" {
		errs = append(errs, ctErr)
	}
	s := status.New(code, strings.Join(errs, "; "))
	if b.endStream {
		st.done, st.err = true, s.Err()
		return nil
	}
	st.nonGRPC, st.headers = s, true
	return nil
}

// endNonGRPC ends the call with the status of an answer that is not gRPC,
// quoting the start of its body, as grpc-go.
func (cc *conn) endNonGRPC() {
	st := &cc.st
	st.done = true
	st.err = status.New(st.nonGRPC.Code(), fmt.Sprintf("%s\ndata: %q", st.nonGRPC.Message(), st.nonGRPCData)).Err()
}

// onRST ends the call reset by the server.
func (cc *conn) onRST(id uint32, code http2.ErrCode) {
	st := &cc.st
	if id != st.id || st.done {
		return
	}
	c, ok := rstCodes[code]
	if !ok {
		c = codes.Unknown
	}
	if c == codes.Canceled && deadlinePassed(st.ctx) {
		c = codes.DeadlineExceeded
	}
	st.done = true
	st.unprocessed = code == http2.ErrCodeRefusedStream
	st.err = status.Newf(c, "stream terminated by RST_STREAM with error code: %v", code).Err()
}

// onSettings applies the server's settings and acknowledges them at once.
func (cc *conn) onSettings(fh http2.FrameHeader, p []byte) error {
	switch {
	case fh.StreamID != 0:
		return connError("SETTINGS frame on a stream")
	case fh.Flags.Has(http2.FlagSettingsAck):
		if len(p) != 0 {
			return connError("SETTINGS ack with a payload")
		}
		return nil
	case len(p)%6 != 0:
		return connError(fmt.Sprintf("SETTINGS frame of %d bytes", len(p)))
	}
	cc.sawSettings = true
	for ; len(p) > 0; p = p[6:] {
		s := http2.Setting{ID: http2.SettingID(binary.BigEndian.Uint16(p)), Val: binary.BigEndian.Uint32(p[2:])}
		if err := s.Valid(); err != nil {
			return failuref(codes.Unavailable, err, "connection error: setting %v: %v", s, err)
		}
		switch s.ID {
		case http2.SettingMaxFrameSize:
			cc.peerMaxFrame = s.Val
		case http2.SettingInitialWindowSize:
			delta := int64(s.Val) - cc.peerInitWindow
			cc.peerInitWindow = int64(s.Val)
			if !cc.st.done {
				cc.st.sendWin += delta
			}
		case http2.SettingHeaderTableSize:
			cc.henc.SetMaxDynamicTableSizeLimit(s.Val)
		case http2.SettingMaxHeaderListSize:
			cc.peerMaxHeaders = s.Val
		}
	}
	_ = cc.fr.WriteSettingsAck()
	return cc.flush()
}

// onGoAway takes the server's GOAWAY: the connection carries no new call,
// and the call in flight fails as unprocessed when the server says it will
// not process it (then it is sent again on another connection), or goes on.
func (cc *conn) onGoAway(last uint32, _ http2.ErrCode) error {
	if last > 0 && last%2 == 0 {
		return connError(fmt.Sprintf("received goaway with non-zero even-numbered stream id: %v", last))
	}
	if cc.goAway && last > cc.goAwayID {
		return connError(fmt.Sprintf("received goaway with stream id: %v, which exceeds stream id of previous goaway: %v", last, cc.goAwayID))
	}
	cc.goAway, cc.goAwayID = true, last
	if st := &cc.st; !st.done && st.id > last {
		st.done, st.unprocessed, st.err = true, true, goAwayRefused.Err()
	}
	return nil
}

// onWindowUpdate widens a send window.
func (cc *conn) onWindowUpdate(id, inc uint32) error {
	st := &cc.st
	switch {
	case inc == 0 && id == 0:
		return connError("WINDOW_UPDATE with an increment of 0")
	case inc == 0:
		return cc.streamError(id, "WINDOW_UPDATE with an increment of 0")
	case id == 0:
		cc.sendWin = min(cc.sendWin+int64(inc), maxWindow)
	case id == st.id && !st.done:
		st.sendWin = min(st.sendWin+int64(inc), maxWindow)
	}
	return nil
}
