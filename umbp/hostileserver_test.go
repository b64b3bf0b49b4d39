package umbp_test

import (
	"context"
	"encoding/binary"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc"

	"github.com/umbp-go/umbp-go/internal/fdpass"
	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// hostileBatch answers a batch of n keys with n+delta results (at least
// none), result i being bit i%8 of bits.
type hostileBatch struct {
	how   uint8
	delta int8
	bits  uint8
}

func (b hostileBatch) reply(n int) (*umbppb.BatchBoolResponse, error) {
	if err, isNil := hostileErr(b.how); err != nil || isNil {
		return nil, err
	}
	ok := make([]bool, max(n+int(b.delta), 0))
	for i := range ok {
		ok[i] = b.bit(i)
	}
	return &umbppb.BatchBoolResponse{Ok: ok}, nil
}

func (b hostileBatch) bit(i int) bool { return b.bits>>(i%8)&1 == 1 }

// valid reports whether the reply to n keys is a well-formed one.
func (b hostileBatch) valid() bool { return b.how == howOK && b.delta == 0 }

// hostileBool answers a BoolResponse.
type hostileBool struct {
	how uint8
	ok  bool
	msg string // may not be UTF-8: the server then fails to send it
}

func (b hostileBool) reply() (*umbppb.BoolResponse, error) {
	if err, isNil := hostileErr(b.how); err != nil || isNil {
		return nil, err
	}
	return &umbppb.BoolResponse{Ok: b.ok, Error: b.msg}, nil
}

// yes reports whether the reply is a well-formed ok=true. A reason that is
// not UTF-8 cannot be marshalled: the client gets codes.Internal instead.
func (b hostileBool) yes() bool { return b.how == howOK && b.ok && utf8.ValidString(b.msg) }

// hostileCount answers BatchExistsConsecutive: count, or keys+count
// (wrapping) when relative.
type hostileCount struct {
	how      uint8
	relative bool
	count    uint64
}

func (c hostileCount) value(n int) uint64 {
	if c.relative {
		return uint64(n) + c.count
	}
	return c.count
}

// fd-handoff replies.
const (
	fdStatus = iota // receive, then write the 4-byte status
	fdShort         // receive, then write 2 bytes of it
	fdSilent        // receive, then close without a status
	fdHangUp        // close before receiving anything
	fdLong          // receive, then write the status and 4 bytes more
	fdUnread        // write the status without receiving, then close
	fdModeCount
)

type hostileFD struct {
	mode   uint8
	status uint32
}

// accepts reports whether the handoff's reply is a clean StatusOK.
func (f hostileFD) accepts() bool { return (f.mode == fdStatus || f.mode == fdLong) && f.status == 0 }

// hostileScript is every reply the hostile server makes, and which of
// the checks run under it.
type hostileScript struct {
	plain      bool  // Ping without ranged I/O, for handles attached under it
	oneLayer   bool  // the fresh worker's plans have one range each
	bulk       bool  // StoreBlocks and LoadBlocks instead of Store and Load
	parts      uint8 // the checks: partsAll, or one of them alone
	exists     hostileBatch
	count      hostileCount
	clear      hostileBool
	put, get   hostileBatch // ranged or not
	flush      hostileBool
	register   hostileBool
	deregister uint8 // how
	fd         hostileFD
}

// Which checks a script runs: all of them (every named case), or one, so
// that the fuzzer spends each input on one kind of call and tries more
// inputs a second.
const (
	partsAll       = 0
	partsLookups   = 1 // the long-lived scheduler's calls
	partsTransfers = 2 // the long-lived worker's store and load
	partsFresh     = 3 // a worker attached, registered and closed under the script
)

// goodScript answers like a healthy server that holds nothing.
var goodScript = hostileScript{
	clear:    hostileBool{ok: true},
	put:      hostileBatch{bits: 0xff},
	get:      hostileBatch{bits: 0xff},
	flush:    hostileBool{ok: true},
	register: hostileBool{ok: true},
}

// Fuzz input: the script's fields in order, one byte per small field, eight
// (little-endian) per count or status, a length byte then the bytes for a
// string. Missing bytes read as zero.
type hostileReader struct{ b []byte }

func (r *hostileReader) u8() byte {
	if len(r.b) == 0 {
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

func (r *hostileReader) u64() uint64 {
	var v uint64
	for i := range 8 {
		v |= uint64(r.u8()) << (8 * i)
	}
	return v
}

func (r *hostileReader) str() string {
	n := min(int(r.u8()%48), len(r.b))
	s := string(r.b[:n])
	r.b = r.b[n:]
	return s
}

func (r *hostileReader) batch() hostileBatch {
	return hostileBatch{how: r.u8() % howCount, delta: int8(r.u8()), bits: r.u8()}
}

func (r *hostileReader) boolean() hostileBool {
	return hostileBool{how: r.u8() % howCount, ok: r.u8()&1 == 1, msg: r.str()}
}

func decodeHostile(data []byte) hostileScript {
	r := &hostileReader{b: data}
	var s hostileScript
	flags := r.u8()
	s.plain, s.oneLayer, s.bulk = flags&1 == 1, flags&2 == 2, flags&4 == 4
	s.parts = flags >> 3 & 3
	s.exists = r.batch()
	s.count = hostileCount{how: r.u8() % howCount, relative: r.u8()&1 == 1, count: r.u64()}
	s.clear = r.boolean()
	s.put = r.batch()
	s.get = r.batch()
	s.flush = r.boolean()
	s.register = r.boolean()
	s.deregister = r.u8() % howCount
	s.fd = hostileFD{mode: r.u8() % fdModeCount, status: uint32(r.u64())}
	return s
}

func encodeHostile(s hostileScript) []byte {
	var b []byte
	u8 := func(v byte) { b = append(b, v) }
	bit := func(v bool) byte {
		if v {
			return 1
		}
		return 0
	}
	u64 := func(v uint64) { b = binary.LittleEndian.AppendUint64(b, v) }
	str := func(v string) { u8(byte(len(v))); b = append(b, v...) }
	batch := func(v hostileBatch) { u8(v.how); u8(byte(v.delta)); u8(v.bits) }
	boolean := func(v hostileBool) { u8(v.how); u8(bit(v.ok)); str(v.msg) }
	u8(bit(s.plain) | bit(s.oneLayer)<<1 | bit(s.bulk)<<2 | s.parts<<3)
	batch(s.exists)
	u8(s.count.how)
	u8(bit(s.count.relative))
	u64(s.count.count)
	boolean(s.clear)
	batch(s.put)
	batch(s.get)
	boolean(s.flush)
	boolean(s.register)
	u8(s.deregister)
	u8(s.fd.mode)
	u64(uint64(s.fd.status))
	return b
}

// hostileServer serves the script over gRPC and the fd-handoff socket.
type hostileServer struct {
	umbppb.UnimplementedUMBPStandaloneServer

	mu     sync.Mutex
	script hostileScript

	grpc *grpc.Server
	fdLn *net.UnixListener
	wg   sync.WaitGroup
}

func (h *hostileServer) set(s hostileScript) {
	h.mu.Lock()
	h.script = s
	h.mu.Unlock()
}

func (h *hostileServer) get() hostileScript {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.script
}

func (h *hostileServer) Ping(context.Context, *umbppb.Empty) (*umbppb.PingResponse, error) {
	return &umbppb.PingResponse{
		Ready:            true,
		DeploymentMode:   umbppb.StandaloneBackendMode_STANDALONE_BACKEND_LOCAL,
		SupportsRangedIo: !h.get().plain,
	}, nil
}

func (h *hostileServer) BatchExists(_ context.Context, req *umbppb.BatchKeysRequest) (*umbppb.BatchBoolResponse, error) {
	return h.get().exists.reply(len(req.GetKeys()))
}

func (h *hostileServer) BatchExistsConsecutive(_ context.Context, req *umbppb.BatchKeysRequest) (*umbppb.CountResponse, error) {
	c := h.get().count
	if err, isNil := hostileErr(c.how); err != nil || isNil {
		return nil, err
	}
	return &umbppb.CountResponse{Count: c.value(len(req.GetKeys()))}, nil
}

func (h *hostileServer) Clear(context.Context, *umbppb.Empty) (*umbppb.BoolResponse, error) {
	return h.get().clear.reply()
}

func (h *hostileServer) Flush(context.Context, *umbppb.Empty) (*umbppb.BoolResponse, error) {
	return h.get().flush.reply()
}

func (h *hostileServer) BatchPut(_ context.Context, req *umbppb.BatchDataRequest) (*umbppb.BatchBoolResponse, error) {
	return h.get().put.reply(len(req.GetKeys()))
}

func (h *hostileServer) BatchGet(_ context.Context, req *umbppb.BatchDataRequest) (*umbppb.BatchBoolResponse, error) {
	return h.get().get.reply(len(req.GetKeys()))
}

func (h *hostileServer) BatchPutRanges(_ context.Context, req *umbppb.BatchRangeDataRequest) (*umbppb.BatchBoolResponse, error) {
	return h.get().put.reply(len(req.GetKeys()))
}

func (h *hostileServer) BatchGetRanges(_ context.Context, req *umbppb.BatchRangeDataRequest) (*umbppb.BatchBoolResponse, error) {
	return h.get().get.reply(len(req.GetKeys()))
}

func (h *hostileServer) RegisterMemory(context.Context, *umbppb.RegisterMemoryRequest) (*umbppb.BoolResponse, error) {
	return h.get().register.reply()
}

func (h *hostileServer) DeregisterMemory(context.Context, *umbppb.DeregisterMemoryRequest) (*umbppb.Empty, error) {
	if err, isNil := hostileErr(h.get().deregister); err != nil || isNil {
		return nil, err
	}
	return &umbppb.Empty{}, nil
}

func (h *hostileServer) serveFD() {
	for {
		c, err := h.fdLn.AcceptUnix()
		if err != nil {
			return
		}
		h.wg.Go(func() { h.handoff(c) })
	}
}

// handoff answers one fd-handoff connection as the script says.
func (h *hostileServer) handoff(c *net.UnixConn) {
	defer c.Close()
	fd := h.get().fd
	deadline := time.Now().Add(2 * time.Second)
	if fd.mode != fdHangUp && fd.mode != fdUnread {
		_, f, err := fdpass.Receive(c, deadline)
		if err != nil {
			return
		}
		_ = f.Close()
	}
	var reply []byte
	switch fd.mode {
	case fdStatus, fdUnread:
		reply = binary.LittleEndian.AppendUint32(nil, fd.status)
	case fdShort:
		reply = binary.LittleEndian.AppendUint32(nil, fd.status)[:2]
	case fdLong:
		reply = binary.LittleEndian.AppendUint32(nil, fd.status)
		reply = append(reply, 0xde, 0xad, 0xbe, 0xef)
	}
	if len(reply) > 0 {
		_ = c.SetWriteDeadline(deadline)
		_, _ = c.Write(reply)
	}
}

// startHostileServer listens on a gRPC socket and its fd-handoff socket in
// a short temporary directory and returns the endpoint. stop ends it.
func startHostileServer(tb testing.TB) (h *hostileServer, endpoint string, stop func()) {
	tb.Helper()
	dir, err := os.MkdirTemp("", "umbp")
	if err != nil {
		tb.Fatal(err)
	}
	endpoint = filepath.Join(dir, "hostile.grpc.sock")
	grpcPath, fdPath, err := fdpass.SocketPaths(endpoint)
	if err != nil {
		tb.Fatal(err)
	}
	listen := func(path string) *net.UnixListener {
		ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
		if err != nil {
			tb.Fatal(err)
		}
		if err := os.Chmod(path, 0o600); err != nil {
			tb.Fatal(err)
		}
		return ln
	}
	gln := listen(grpcPath)
	h = &hostileServer{script: goodScript, grpc: grpc.NewServer(), fdLn: listen(fdPath)}
	umbppb.RegisterUMBPStandaloneServer(h.grpc, h)
	h.wg.Go(func() { _ = h.grpc.Serve(gln) })
	h.wg.Go(h.serveFD)
	var once sync.Once
	stop = func() {
		once.Do(func() {
			h.grpc.Stop()
			_ = h.fdLn.Close()
			h.wg.Wait()
			_ = os.RemoveAll(dir)
		})
	}
	return h, endpoint, stop
}

const (
	hostileTimeout       = 2 * time.Second
	hostileLookupTimeout = time.Second
	hostileMargin        = time.Second
	hostileBlocks        = 4
)

var hostileKeys = []string{"hostile/0", "hostile/1", "hostile/2", "hostile/3", "hostile/4"}
