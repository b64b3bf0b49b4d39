package server

import (
	"context"
	"errors"
	"fmt"
	"math"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// service implements umbp.UMBPStandalone. Every handler answers with gRPC
// status OK and puts failures in the reply, as MORI's server does; the only
// exception is a v1 server's codes.Unimplemented for the v2-only methods.
type service struct {
	umbppb.UnimplementedUMBPStandaloneServer
	s *Server
}

func boolReply(err error) *umbppb.BoolResponse {
	if err != nil {
		return &umbppb.BoolResponse{Error: err.Error()}
	}
	return &umbppb.BoolResponse{Ok: true}
}

func failReply(msg string) *umbppb.BoolResponse { return &umbppb.BoolResponse{Error: msg} }

func okReply() *umbppb.BoolResponse { return &umbppb.BoolResponse{Ok: true} }

// Ping reports readiness, the LOCAL deployment mode and, on v2, whether
// ranged I/O is served.
func (v *service) Ping(context.Context, *umbppb.Empty) (*umbppb.PingResponse, error) {
	s := v.s
	return &umbppb.PingResponse{
		Ready:            !s.ops.isClosing(),
		DeploymentMode:   umbppb.StandaloneBackendMode_STANDALONE_BACKEND_LOCAL,
		SupportsRangedIo: s.rangedIO(),
	}, nil
}

// one serves a Put or Get of one object: it resolves the client's memory and
// runs do on it while the op is tracked and the region leased.
func (s *Server) one(client string, base, off, size uint64, do func(l loc) *umbppb.BoolResponse) *umbppb.BoolResponse {
	if !s.ops.begin() {
		return failReply(MsgShuttingDown)
	}
	defer s.ops.end()
	var out [1]loc
	l, ok := s.regs.resolve(client, []uint64{base}, []uint64{off}, []uint64{size}, false, out[:])
	if !ok {
		return failReply(MsgBadShmBuffer)
	}
	defer l.release()
	return do(out[0])
}

// Put stores one object from client memory; an existing key keeps its value.
func (v *service) Put(_ context.Context, req *umbppb.PutRequest) (*umbppb.BoolResponse, error) {
	return v.s.one(req.GetClientId(), req.GetRegionBase(), req.GetShmOffset(), req.GetSize(), func(l loc) *umbppb.BoolResponse {
		return boolReply(v.s.store(req.GetKey(), l, req.GetSize(), 0))
	}), nil
}

// store copies size bytes at l into a new object under key unless the key is
// stored already (first writer wins; batch lets a later entry of the same
// batch replace an earlier one).
func (s *Server) store(key string, l loc, size, batch uint64) error {
	if !s.pool.wants(key, batch) {
		return nil
	}
	o, err := s.pool.reserve(size, batch)
	if err != nil {
		return err
	}
	if err := s.toPool(l, o, 0, size); err != nil {
		s.pool.abort(o)
		s.log.Warn("umbp server: put", "key", key, "client", l.r.client, "err", err)
		return err
	}
	s.pool.publish(key, o)
	return nil
}

// Get copies one object to client memory; a missing key or another size is
// false with no text.
func (v *service) Get(_ context.Context, req *umbppb.GetRequest) (*umbppb.BoolResponse, error) {
	return v.s.one(req.GetClientId(), req.GetRegionBase(), req.GetShmOffset(), req.GetSize(), func(l loc) *umbppb.BoolResponse {
		return &umbppb.BoolResponse{Ok: v.s.fetch(req.GetKey(), l, req.GetSize())}
	}), nil
}

// fetch copies the object stored under key to l if it is size bytes.
func (s *Server) fetch(key string, l loc, size uint64) bool {
	o := s.pool.acquire(key)
	if o == nil {
		return false
	}
	defer s.pool.release(o)
	if o.size != size {
		return false
	}
	if err := s.fromPool(o, 0, l, size); err != nil {
		s.log.Warn("umbp server: get", "key", key, "client", l.r.client, "err", err)
		return false
	}
	return true
}

// batchShape reports whether a contiguous batch of n keys has one offset
// and size a key, and no region bases or one a key (none: every entry goes
// to the first region that fits).
func batchShape(n int, offs, sizes, bases []uint64) bool {
	return len(offs) == n && len(sizes) == n && (len(bases) == 0 || len(bases) == n)
}

// batchPut stores every entry, or nothing when any entry is malformed.
func (s *Server) batchPut(keys []string, client string, offs, sizes, bases []uint64) []bool {
	res := make([]bool, len(keys))
	if !batchShape(len(keys), offs, sizes, bases) || len(keys) == 0 {
		return res
	}
	locs := make([]loc, len(keys))
	l, ok := s.regs.resolve(client, bases, offs, sizes, false, locs)
	if !ok {
		return res
	}
	defer l.release()
	pb := s.newPutBatch("batch put", client, keys, res, s.pool.newBatch(), len(keys))
	defer pb.release()
	for i, k := range keys {
		if !s.pool.wants(k, pb.batch) {
			res[i] = true // stored already: the first value stays
			continue
		}
		if o, item, ok := pb.reserve(i, sizes[i]); ok {
			pb.copies.toPool(item, locs[i], o, 0, sizes[i])
		}
	}
	pb.finish()
	return res
}

// BatchPut stores objects from client memory; see batchPut.
func (v *service) BatchPut(_ context.Context, req *umbppb.BatchDataRequest) (*umbppb.BatchBoolResponse, error) {
	s := v.s
	if !s.ops.begin() {
		return &umbppb.BatchBoolResponse{Ok: make([]bool, len(req.GetKeys()))}, nil
	}
	defer s.ops.end()
	return &umbppb.BatchBoolResponse{Ok: s.batchPut(req.GetKeys(), req.GetClientId(), req.GetShmOffsets(), req.GetSizes(), req.GetRegionBases())}, nil
}

// BatchPutWithDepth is BatchPut with per-key depths, which a local DRAM tier
// ignores; depths must be empty or one per key.
func (v *service) BatchPutWithDepth(_ context.Context, req *umbppb.BatchDataWithDepthRequest) (*umbppb.BatchBoolResponse, error) {
	s := v.s
	n := len(req.GetKeys())
	if !s.ops.begin() {
		return &umbppb.BatchBoolResponse{Ok: make([]bool, n)}, nil
	}
	defer s.ops.end()
	if d := len(req.GetDepths()); d != 0 && d != n {
		return &umbppb.BatchBoolResponse{Ok: make([]bool, n)}, nil
	}
	return &umbppb.BatchBoolResponse{Ok: s.batchPut(req.GetKeys(), req.GetClientId(), req.GetShmOffsets(), req.GetSizes(), req.GetRegionBases())}, nil
}

// BatchGet copies objects to client memory, or nothing when any entry is
// malformed.
func (v *service) BatchGet(_ context.Context, req *umbppb.BatchDataRequest) (*umbppb.BatchBoolResponse, error) {
	s := v.s
	keys := req.GetKeys()
	res := make([]bool, len(keys))
	if !s.ops.begin() {
		return &umbppb.BatchBoolResponse{Ok: res}, nil
	}
	defer s.ops.end()
	offs, sizes, bases := req.GetShmOffsets(), req.GetSizes(), req.GetRegionBases()
	if !batchShape(len(keys), offs, sizes, bases) || len(keys) == 0 {
		return &umbppb.BatchBoolResponse{Ok: res}, nil
	}
	locs := make([]loc, len(keys))
	l, ok := s.regs.resolve(req.GetClientId(), bases, offs, sizes, false, locs)
	if !ok {
		return &umbppb.BatchBoolResponse{Ok: res}, nil
	}
	defer l.release()
	gb := s.newGetBatch("batch get", req.GetClientId(), keys, res, len(keys))
	for i, k := range keys {
		o := s.pool.acquire(k)
		if o == nil {
			continue
		}
		if o.size != sizes[i] {
			s.pool.release(o)
			continue
		}
		gb.copies.fromPool(gb.add(i, o), o, 0, locs[i], o.size)
	}
	gb.finish()
	return &umbppb.BatchBoolResponse{Ok: res}, nil
}

// BatchPutRanges stores objects gathered from ranges of client memory (v2).
func (v *service) BatchPutRanges(_ context.Context, req *umbppb.BatchRangeDataRequest) (*umbppb.BatchBoolResponse, error) {
	return v.ranged("BatchPutRanges", req, v.s.batchPutRanges)
}

// BatchGetRanges scatters ranges of stored objects to client memory (v2).
func (v *service) BatchGetRanges(_ context.Context, req *umbppb.BatchRangeDataRequest) (*umbppb.BatchBoolResponse, error) {
	return v.ranged("BatchGetRanges", req, v.s.batchGetRanges)
}

// ranged serves a v2 ranged batch with op: Unimplemented on a v1 server,
// all-false while shutting down.
func (v *service) ranged(method string, req *umbppb.BatchRangeDataRequest, op func(*umbppb.BatchRangeDataRequest) []bool) (*umbppb.BatchBoolResponse, error) {
	s := v.s
	if s.version < 2 {
		return nil, status.Error(codes.Unimplemented, "method "+method+" not implemented")
	}
	if !s.ops.begin() {
		return &umbppb.BatchBoolResponse{Ok: make([]bool, len(req.GetKeys()))}, nil
	}
	defer s.ops.end()
	return &umbppb.BatchBoolResponse{Ok: op(req)}, nil
}

// Exists reports whether key is stored; a missing key is ok=false with no text.
func (v *service) Exists(_ context.Context, req *umbppb.KeyRequest) (*umbppb.BoolResponse, error) {
	s := v.s
	if !s.ops.begin() {
		return failReply(MsgShuttingDown), nil
	}
	defer s.ops.end()
	return &umbppb.BoolResponse{Ok: s.pool.contains(req.GetKey())}, nil
}

// BatchExists answers Exists for every key, in order.
func (v *service) BatchExists(_ context.Context, req *umbppb.BatchKeysRequest) (*umbppb.BatchBoolResponse, error) {
	s := v.s
	if !s.ops.begin() {
		return &umbppb.BatchBoolResponse{Ok: make([]bool, len(req.GetKeys()))}, nil
	}
	defer s.ops.end()
	found, _ := s.pool.containsAll(req.GetKeys(), false)
	return &umbppb.BatchBoolResponse{Ok: found}, nil
}

// BatchExistsConsecutive counts the leading stored keys.
func (v *service) BatchExistsConsecutive(_ context.Context, req *umbppb.BatchKeysRequest) (*umbppb.CountResponse, error) {
	s := v.s
	if !s.ops.begin() {
		return &umbppb.CountResponse{}, nil
	}
	defer s.ops.end()
	_, n := s.pool.containsAll(req.GetKeys(), true)
	return &umbppb.CountResponse{Count: uint64(n)}, nil
}

// Clear drops every stored object; registrations stay.
func (v *service) Clear(context.Context, *umbppb.Empty) (*umbppb.BoolResponse, error) {
	s := v.s
	if !s.ops.begin() {
		return failReply(MsgShuttingDown), nil
	}
	defer s.ops.end()
	s.pool.clear()
	return okReply(), nil
}

// Flush has nothing to persist on a DRAM-only server.
func (v *service) Flush(context.Context, *umbppb.Empty) (*umbppb.BoolResponse, error) {
	if v.s.ops.isClosing() {
		return failReply(MsgShuttingDown), nil
	}
	return okReply(), nil
}

// RegisterMemory confirms a host region registered by fd handoff, or (v2)
// opens a GPU region from its IPC handle.
func (v *service) RegisterMemory(ctx context.Context, req *umbppb.RegisterMemoryRequest) (*umbppb.BoolResponse, error) {
	s := v.s
	if !s.ops.begin() {
		return failReply(MsgShuttingDown), nil
	}
	defer s.ops.end()
	kind := req.GetKind()
	if s.version < 2 {
		kind = umbppb.MemoryKind_MEMORY_KIND_HOST_SHM // v1 ignores fields 7-11
	}
	switch kind {
	case umbppb.MemoryKind_MEMORY_KIND_HOST_SHM:
		if !s.regs.hasHost(req.GetClientId(), req.GetWorkerBase(), req.GetSize()) {
			return failReply(MsgFDRegistrationNotFound), nil
		}
		return okReply(), nil
	case umbppb.MemoryKind_MEMORY_KIND_GPU_IPC:
		return boolReply(s.registerGPU(ctx, req)), nil
	default:
		return failReply(fmt.Sprintf("unknown memory kind %d", int32(kind))), nil
	}
}

// registerGPU validates a GPU_IPC registration and opens it, owned by the
// calling process when its pid is known.
func (s *Server) registerGPU(ctx context.Context, req *umbppb.RegisterMemoryRequest) error {
	if s.opts.DisableRangedIO {
		return errors.New(MsgGPUNeedsSSDDisabled)
	}
	const prefix = "invalid GPU IPC registration: "
	switch {
	case req.GetClientId() == "":
		return errors.New(prefix + "empty client_id")
	case req.GetWorkerBase() == 0:
		return errors.New(prefix + "worker_base is 0")
	case req.GetSize() == 0:
		return errors.New(prefix + "size is 0")
	case req.GetAllocBase() == 0:
		return errors.New(prefix + "alloc_base is 0")
	case len(req.GetIpcHandle()) != IPCHandleSize:
		return fmt.Errorf(prefix+"ipc_handle is %d bytes, want %d", len(req.GetIpcHandle()), IPCHandleSize)
	case req.GetDeviceId() < 0:
		return fmt.Errorf(prefix+"device_id %d", req.GetDeviceId())
	case req.GetIpcOffset() > math.MaxUint64-req.GetSize():
		return fmt.Errorf(prefix+"ipc_offset %d + size %d overflows", req.GetIpcOffset(), req.GetSize())
	}
	if s.gpu == nil {
		return errors.New(MsgGPUUnsupported)
	}
	g := gpuRegistration{
		client:    req.GetClientId(),
		base:      req.GetWorkerBase(),
		size:      req.GetSize(),
		device:    int(req.GetDeviceId()),
		ipcOffset: req.GetIpcOffset(),
		allocBase: req.GetAllocBase(),
	}
	copy(g.handle[:], req.GetIpcHandle())
	var p *proc
	if pid := callerPid(ctx); pid > 0 {
		var err error
		p, err = openProc(pid)
		if errors.Is(err, errPeerGone) {
			return err // nobody is left to use the region
		}
		if err != nil {
			s.log.Warn("umbp server: cannot watch the registering process; its GPU region stays until deregistered",
				"client", g.client, "pid", pid, "err", err)
		}
	}
	if err := s.regs.addGPU(g, p); err != nil {
		s.log.Warn("umbp server: GPU registration refused", "client", g.client, "device", g.device, "err", err)
		return err
	}
	s.log.Debug("umbp server: GPU region registered", "client", g.client, "device", g.device,
		"worker_base", g.base, "size", g.size, "alloc_base", g.allocBase, "ipc_offset", g.ipcOffset)
	return nil
}

// DeregisterMemory drops every region of the client; stored objects stay.
func (v *service) DeregisterMemory(_ context.Context, req *umbppb.DeregisterMemoryRequest) (*umbppb.Empty, error) {
	s := v.s
	if !s.ops.begin() {
		return &umbppb.Empty{}, nil
	}
	defer s.ops.end()
	if n := s.regs.dropClient(req.GetClientId()); n > 0 {
		s.log.Debug("umbp server: client deregistered", "client", req.GetClientId(), "regions", n)
	}
	return &umbppb.Empty{}, nil
}

// The external-KV calls are in externalkv.go.
