package h2call

import (
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
)

// The header fields of a call, as grpc-go's client writes them.

const (
	contentType = "application/grpc"
	binSuffix   = "-bin"
)

// appendBuf is an io.Writer appending to a byte slice, reused from call to
// call: what the hpack encoder and the framer write into.
type appendBuf struct{ b []byte }

func (w *appendBuf) Write(p []byte) (int, error) {
	w.b = append(w.b, p...)
	return len(p), nil
}

// reservedHeader reports whether a header is reserved by gRPC (not
// metadata), as grpc-go's isReservedHeader.
func reservedHeader(k string) bool {
	if k != "" && k[0] == ':' {
		return true
	}
	switch k {
	case "content-type", "user-agent", "grpc-message-type", "grpc-encoding",
		"grpc-message", "grpc-status", "grpc-timeout", "te":
		return true
	}
	return false
}

// validateMetadata refuses outgoing metadata that grpc-go refuses.
func validateMetadata(md metadata.MD) error {
	for k, vs := range md {
		if k == "" {
			return fmt.Errorf("there is an empty key in the header")
		}
		if k[0] == ':' {
			continue
		}
		for i := 0; i < len(k); i++ {
			r := k[i]
			if !(r >= 'a' && r <= 'z') && !(r >= '0' && r <= '9') && r != '.' && r != '-' && r != '_' {
				return fmt.Errorf("header key %q contains illegal characters not in [0-9a-z-_.]", k)
			}
		}
		if strings.HasSuffix(k, binSuffix) {
			continue
		}
		for _, v := range vs {
			for i := 0; i < len(v); i++ {
				if v[i] < 0x20 || v[i] > 0x7e {
					return fmt.Errorf("header key %q contains value with non-printable ASCII characters", k)
				}
			}
		}
	}
	return nil
}

// encodeMetadataValue is a metadata value as it is sent: base64 without
// padding for a binary header, as is otherwise.
func encodeMetadataValue(k, v string) string {
	if strings.HasSuffix(k, binSuffix) {
		return base64.RawStdEncoding.EncodeToString([]byte(v))
	}
	return v
}

// decodeMetadataValue undoes encodeMetadataValue for a received header.
func decodeMetadataValue(k, v string) (string, error) {
	if !strings.HasSuffix(k, binSuffix) {
		return v, nil
	}
	var b []byte
	var err error
	if len(v)%4 == 0 {
		b, err = base64.StdEncoding.DecodeString(v)
	} else {
		b, err = base64.RawStdEncoding.DecodeString(v)
	}
	return string(b), err
}

// appendTimeout appends the grpc-timeout value of d (positive) to b, as
// grpc-go encodes it: the smallest unit whose count, rounded up, fits in 8
// digits.
func appendTimeout(b []byte, d time.Duration) []byte {
	const maxValue = 100000000 - 1
	ceil := func(d, unit time.Duration) int64 {
		if d%unit > 0 {
			return int64(d/unit + 1)
		}
		return int64(d / unit)
	}
	for _, u := range [...]struct {
		unit time.Duration
		c    byte
	}{{time.Nanosecond, 'n'}, {time.Microsecond, 'u'}, {time.Millisecond, 'm'}, {time.Second, 'S'}, {time.Minute, 'M'}} {
		if n := ceil(d, u.unit); n <= maxValue {
			return append(strconv.AppendInt(b, n, 10), u.c)
		}
	}
	return append(strconv.AppendInt(b, ceil(d, time.Hour), 10), 'H')
}

// decodeGrpcMessage percent-decodes a grpc-message value, as grpc-go does:
// a '%' followed by two hex digits is the byte they spell; anything else
// is kept as it is.
func decodeGrpcMessage(msg string) string {
	i := strings.IndexByte(msg, '%')
	if i < 0 {
		return msg
	}
	var sb strings.Builder
	sb.Grow(len(msg))
	sb.WriteString(msg[:i])
	for ; i < len(msg); i++ {
		c := msg[i]
		if c == '%' && i+2 < len(msg) {
			if v, err := strconv.ParseUint(msg[i+1:i+3], 16, 8); err == nil {
				sb.WriteByte(byte(v))
				i += 2
				continue
			}
		}
		sb.WriteByte(c)
	}
	return sb.String()
}

// validHeaderName reports whether a received header name is a lower-case
// token, as HTTP/2 requires.
func validHeaderName(v string) bool {
	if v == "" {
		return false
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if 'A' <= c && c <= 'Z' || !httpguts.IsTokenRune(rune(c)) {
			return false
		}
	}
	return true
}

// headerBlock is what one received header block says. The decoder's emit
// function fills it field by field; it is reset at each block's start.
type headerBlock struct {
	stream    uint32 // the stream it belongs to
	ours      bool   // the call's own stream: its fields are kept
	endStream bool
	wireLen   int // the HEADERS frame's length, as grpc-go reports it

	size       uint32 // the header list size so far
	tooBig     bool   // the list exceeded maxHeaderList
	invalid    string // why a field was refused, "" when none was
	sawRegular bool
	collectMD  bool // a stats handler wants the metadata

	status      string // :status
	haveStatus  bool
	ctype       string // content-type
	haveCType   bool
	grpcStatus  string
	haveGStatus bool
	grpcMessage string
	encoding    string // grpc-encoding
	md          metadata.MD
	mdErr       string // a binary header that does not decode
}

func (b *headerBlock) reset(stream uint32, ours, endStream bool, wireLen int, collectMD bool) {
	*b = headerBlock{stream: stream, ours: ours, endStream: endStream, wireLen: wireLen, collectMD: collectMD && ours}
}

// field takes one decoded field of the block.
func (b *headerBlock) field(hf hpack.HeaderField) {
	if b.tooBig || b.invalid != "" {
		return
	}
	b.size += hf.Size()
	if b.size > maxHeaderList {
		b.tooBig = true
		return
	}
	if !b.ours {
		return // decoded only to keep the decoder's table in step
	}
	if !httpguts.ValidHeaderFieldValue(hf.Value) {
		b.invalid = fmt.Sprintf("invalid header field value for %q", hf.Name)
		return
	}
	if strings.HasPrefix(hf.Name, ":") {
		if b.sawRegular {
			b.invalid = "pseudo header field after regular header field"
			return
		}
		if hf.Name != ":status" {
			b.invalid = fmt.Sprintf("invalid pseudo-header %q", hf.Name)
			return
		}
		if b.haveStatus {
			b.invalid = "duplicate pseudo-header \":status\""
			return
		}
		b.status, b.haveStatus = hf.Value, true
		return
	}
	b.sawRegular = true
	if !validHeaderName(hf.Name) {
		b.invalid = fmt.Sprintf("invalid header field name %q", hf.Name)
		return
	}
	switch hf.Name {
	case "content-type":
		b.ctype, b.haveCType = hf.Value, true
		if b.collectMD {
			b.addMD(hf.Name, hf.Value)
		}
		return
	case "grpc-status":
		b.grpcStatus, b.haveGStatus = hf.Value, true
		return
	case "grpc-message":
		b.grpcMessage = hf.Value
		return
	case "grpc-encoding":
		b.encoding = hf.Value
		return
	}
	if !b.collectMD || reservedHeader(hf.Name) {
		return
	}
	v, err := decodeMetadataValue(hf.Name, hf.Value)
	if err != nil {
		b.mdErr = fmt.Sprintf("transport: malformed %s: %v", hf.Name, err)
		return
	}
	b.addMD(hf.Name, v)
}

func (b *headerBlock) addMD(k, v string) {
	if b.md == nil {
		b.md = metadata.MD{}
	}
	b.md[k] = append(b.md[k], v)
}

// grpcContentType reports whether a content-type names gRPC, as grpc-go's
// check: "application/grpc", or followed by '+' or ';' and anything.
func grpcContentType(ct string) bool {
	if ct == contentType {
		return true
	}
	if !strings.HasPrefix(ct, contentType) {
		return false
	}
	c := ct[len(contentType)]
	return c == '+' || c == ';'
}

// codeOf parses a grpc-status value, as grpc-go: a decimal that fits 32
// bits, taken as a code even when no code has that number.
func codeOf(v string) (codes.Code, error) {
	n, err := strconv.ParseInt(v, 10, 32)
	if err != nil {
		return 0, err
	}
	return codes.Code(uint32(n)), nil
}
