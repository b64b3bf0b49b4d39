// Package fdpass implements the fd-handoff half of host-memory registration
// with umbp_standalone_server: an 88-byte little-endian message carried with
// exactly one SCM_RIGHTS file descriptor (a memfd) over a Unix stream socket,
// answered by a 4-byte status.
//
// The layout (docs/PROTOCOL.md, "Registering host memory"):
//
//	offset  field
//	0       u32 magic 0x554d4250 ("UMBP")
//	4       u32 version 1
//	8       client_id, 64 bytes, NUL-terminated (at most 63 bytes of id)
//	72      u64 worker_base
//	80      u64 size (not 0)
package fdpass

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

const (
	// Magic is "UMBP" read as a little-endian u32.
	Magic uint32 = 0x554d4250
	// Version is the only message version servers accept.
	Version uint32 = 1
	// MessageSize is the exact size of a registration message.
	MessageSize = 88
	// ClientIDField is the size of the NUL-terminated client id field.
	ClientIDField = 64
	// MaxClientIDLen is the longest client id that fits with its NUL.
	MaxClientIDLen = ClientIDField - 1

	offMagic      = 0
	offVersion    = 4
	offClientID   = 8
	offWorkerBase = offClientID + ClientIDField // 72
	offSize       = offWorkerBase + 8           // 80
)

// StatusOK and StatusFailed are the two replies a server sends.
const (
	StatusOK     int32 = 0
	StatusFailed int32 = -1
)

// ErrInvalidMessage is matched by every encode and decode error.
var ErrInvalidMessage = errors.New("invalid fd-handoff registration message")

// Registration is the payload of one fd-handoff message: the client's id,
// the address at which the client mapped the memfd, and how many bytes of it
// the server should map.
type Registration struct {
	ClientID   string
	WorkerBase uint64
	Size       uint64
}

// Validate reports whether r can be encoded.
func (r Registration) Validate() error {
	switch {
	case r.ClientID == "":
		return fmt.Errorf("%w: empty client id", ErrInvalidMessage)
	case len(r.ClientID) > MaxClientIDLen:
		return fmt.Errorf("%w: client id is %d bytes, at most %d fit", ErrInvalidMessage, len(r.ClientID), MaxClientIDLen)
	case bytes.IndexByte([]byte(r.ClientID), 0) >= 0:
		return fmt.Errorf("%w: client id %q contains a NUL byte", ErrInvalidMessage, r.ClientID)
	case r.Size == 0:
		return fmt.Errorf("%w: size is 0", ErrInvalidMessage)
	}
	return nil
}

// AppendEncode appends the 88-byte encoding of r to dst.
func (r Registration) AppendEncode(dst []byte) ([]byte, error) {
	if err := r.Validate(); err != nil {
		return dst, err
	}
	var msg [MessageSize]byte
	binary.LittleEndian.PutUint32(msg[offMagic:], Magic)
	binary.LittleEndian.PutUint32(msg[offVersion:], Version)
	copy(msg[offClientID:offWorkerBase], r.ClientID) // rest stays NUL
	binary.LittleEndian.PutUint64(msg[offWorkerBase:], r.WorkerBase)
	binary.LittleEndian.PutUint64(msg[offSize:], r.Size)
	return append(dst, msg[:]...), nil
}

// Encode returns the 88-byte encoding of r.
func (r Registration) Encode() ([]byte, error) {
	return r.AppendEncode(make([]byte, 0, MessageSize))
}

// Decode parses one registration message. It accepts exactly MessageSize
// bytes with the right magic and version, a client id that is non-empty and
// NUL-terminated within its field, and a non-zero size.
func Decode(msg []byte) (Registration, error) {
	if len(msg) != MessageSize {
		return Registration{}, fmt.Errorf("%w: %d bytes, want %d", ErrInvalidMessage, len(msg), MessageSize)
	}
	if m := binary.LittleEndian.Uint32(msg[offMagic:]); m != Magic {
		return Registration{}, fmt.Errorf("%w: magic %#08x, want %#08x", ErrInvalidMessage, m, Magic)
	}
	if v := binary.LittleEndian.Uint32(msg[offVersion:]); v != Version {
		return Registration{}, fmt.Errorf("%w: version %d, want %d", ErrInvalidMessage, v, Version)
	}
	field := msg[offClientID:offWorkerBase]
	n := bytes.IndexByte(field, 0)
	if n < 0 {
		return Registration{}, fmt.Errorf("%w: client id is not NUL-terminated", ErrInvalidMessage)
	}
	if n == 0 {
		return Registration{}, fmt.Errorf("%w: empty client id", ErrInvalidMessage)
	}
	r := Registration{
		ClientID:   string(field[:n]),
		WorkerBase: binary.LittleEndian.Uint64(msg[offWorkerBase:]),
		Size:       binary.LittleEndian.Uint64(msg[offSize:]),
	}
	if r.Size == 0 {
		return Registration{}, fmt.Errorf("%w: size is 0", ErrInvalidMessage)
	}
	return r, nil
}
