package fdpass

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultTimeout bounds a Send whose context has no deadline. Servers drop a
// connection that stays silent for 5 s, so a longer bound buys nothing.
const DefaultTimeout = 5 * time.Second

var (
	// ErrRejected means the server answered the registration with a failure
	// status. The server gives no reason.
	ErrRejected = errors.New("fd-handoff registration refused by the server")
	// ErrBadReply means the server's reply was not a valid status.
	ErrBadReply = errors.New("fd-handoff reply is not a valid status")
)

// PeerCheck inspects the connected fd socket before the descriptor leaves the
// process; a non-nil error aborts the send.
type PeerCheck func(conn *net.UnixConn) error

// Send registers fd with the server listening on the fd-handoff socket at
// path: it connects, sends the encoded reg with fd attached in ONE sendmsg,
// and reads the server's int32 status. Everything is bounded by ctx, or by
// DefaultTimeout when ctx has no deadline. check, when not nil, runs on the
// connected socket before anything is sent.
func Send(ctx context.Context, path string, fd int, reg Registration, check PeerCheck) error {
	msg, err := reg.Encode()
	if err != nil {
		return err
	}
	if fd < 0 {
		return fmt.Errorf("invalid file descriptor %d", fd)
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	deadline, _ := ctx.Deadline()

	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", path, ctxErr(ctx, err))
	}
	conn := c.(*net.UnixConn)
	defer conn.Close()
	if err := conn.SetDeadline(deadline); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	// The context may end before the deadline: a deadline in the past then
	// unblocks the write or read. Set after the deadline above, so that a
	// cancel in between is not overwritten.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if check != nil {
		if err := check(conn); err != nil {
			return err
		}
	}
	n, oobn, err := conn.WriteMsgUnix(msg, unix.UnixRights(fd), nil)
	if err != nil {
		return fmt.Errorf("send registration to %s: %w", path, ctxErr(ctx, err))
	}
	if n != len(msg) || oobn == 0 {
		return fmt.Errorf("send registration to %s: short write (%d of %d bytes)", path, n, len(msg))
	}
	var reply [4]byte
	if _, err := io.ReadFull(conn, reply[:]); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return fmt.Errorf("%s closed without a status: %w", path, ErrBadReply)
		}
		return fmt.Errorf("read status from %s: %w", path, ctxErr(ctx, err))
	}
	switch status := int32(binary.LittleEndian.Uint32(reply[:])); status {
	case StatusOK:
		return nil
	case StatusFailed:
		return fmt.Errorf("%s: client %q base %#x size %d: %w", path, reg.ClientID, reg.WorkerBase, reg.Size, ErrRejected)
	default:
		return fmt.Errorf("%s: status %d: %w", path, status, ErrBadReply)
	}
}

// ctxErr reports a socket deadline, which always comes from ctx, as the
// context's error.
func ctxErr(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return fmt.Errorf("%w (%w)", cerr, err)
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("%w (%w)", context.DeadlineExceeded, err)
	}
	return err
}

// oobSpace holds the control data of two descriptors, so that a message
// carrying more than one is seen (and its descriptors closed) rather than
// truncated silently.
var oobSpace = unix.CmsgSpace(2 * 4)

// Receive reads one registration from conn, the server's side of Send. It
// returns the decoded message and the one descriptor that came with it; the
// caller owns the file. Every descriptor it does not return is closed. It
// rejects a short or long message, truncated control data, a message with no
// descriptor or more than one, and anything Decode rejects. The read is
// bounded by deadline.
func Receive(conn *net.UnixConn, deadline time.Time) (Registration, *os.File, error) {
	if err := conn.SetReadDeadline(deadline); err != nil {
		return Registration{}, nil, err
	}
	buf := make([]byte, MessageSize+1)
	oob := make([]byte, oobSpace)
	n, oobn, flags, _, err := conn.ReadMsgUnix(buf, oob)
	fds, perr := parseRights(oob[:oobn])
	keep := false
	defer func() {
		if !keep {
			closeAll(fds)
		}
	}()
	if err != nil {
		return Registration{}, nil, fmt.Errorf("receive registration: %w", err)
	}
	if flags&unix.MSG_CTRUNC != 0 {
		return Registration{}, nil, fmt.Errorf("%w: control data truncated (more than one descriptor?)", ErrInvalidMessage)
	}
	if perr != nil {
		return Registration{}, nil, fmt.Errorf("%w: %w", ErrInvalidMessage, perr)
	}
	// A stream may deliver the message in pieces; the descriptor travels with
	// the first. Read the rest, bounded by the same deadline.
	if n > 0 && n < MessageSize {
		m, err := io.ReadFull(conn, buf[n:MessageSize])
		n += m
		if err != nil {
			return Registration{}, nil, fmt.Errorf("%w: truncated after %d bytes: %w", ErrInvalidMessage, n, err)
		}
	}
	if n != MessageSize {
		return Registration{}, nil, fmt.Errorf("%w: %d bytes, want %d", ErrInvalidMessage, n, MessageSize)
	}
	switch len(fds) {
	case 0:
		return Registration{}, nil, fmt.Errorf("%w: no file descriptor attached", ErrInvalidMessage)
	case 1:
	default:
		return Registration{}, nil, fmt.Errorf("%w: %d file descriptors attached, want 1", ErrInvalidMessage, len(fds))
	}
	reg, err := Decode(buf[:MessageSize])
	if err != nil {
		return Registration{}, nil, err
	}
	keep = true
	return reg, os.NewFile(uintptr(fds[0]), "memfd:"+reg.ClientID), nil
}

// Reply sends the int32 status that ends a registration, bounded by deadline.
func Reply(conn *net.UnixConn, status int32, deadline time.Time) error {
	if err := conn.SetWriteDeadline(deadline); err != nil {
		return err
	}
	var b [4]byte
	binary.LittleEndian.PutUint32(b[:], uint32(status))
	if _, err := conn.Write(b[:]); err != nil {
		return fmt.Errorf("send status: %w", err)
	}
	return nil
}

// parseRights returns every descriptor in the control data, even when some
// message in it is malformed, so that none leaks.
func parseRights(oob []byte) ([]int, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("control data: %w", err)
	}
	var fds []int
	var firstErr error
	for i := range msgs {
		got, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			if firstErr == nil {
				firstErr = fmt.Errorf("control message %d: %w", i, err)
			}
			continue
		}
		fds = append(fds, got...)
	}
	return fds, firstErr
}

func closeAll(fds []int) {
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
}
