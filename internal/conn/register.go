package conn

import (
	"context"
	"errors"
	"fmt"
	"math"

	"golang.org/x/sys/unix"

	"github.com/umbp-go/umbp-go/internal/errdefs"
	"github.com/umbp-go/umbp-go/internal/fdpass"
	"github.com/umbp-go/umbp-go/internal/rpc"
	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// IPCHandleSize is the size of a HIP (or CUDA) IPC memory handle.
const IPCHandleSize = 64

// RegisterHost registers size bytes of host memory mapped at base from the
// memfd fd (MAP_SHARED, read-write): the fd handoff, then RegisterMemory.
// fd must be a regular file opened read-write holding at least size bytes:
// the server maps size bytes without checking, so a larger claim could crash
// it. Registering the same base again replaces the server's mapping. A
// rejected handoff or a false answer is an error wrapping ErrRefused. The
// descriptor leaves the process only when the fd-handoff socket and the
// process serving it pass the trust check; otherwise nothing is sent and the
// error wraps ErrUntrustedServer.
func (c *Conn) RegisterHost(ctx context.Context, fd int, base uintptr, size uint64) error {
	const op = "RegisterHost"
	if err := c.usable(op); err != nil {
		return err
	}
	if err := checkHostFD(op, fd, uint64(base), size); err != nil {
		return err
	}
	// A socket file that fails the trust check is not even connected to;
	// the check runs again, with the peer's, on the connected socket.
	if err := c.trust.checkFile(c.fdPath); errors.Is(err, errdefs.ErrUntrustedServer) {
		return c.handoffError(ctx, err)
	}
	reg := fdpass.Registration{ClientID: c.clientID, WorkerBase: uint64(base), Size: size}
	if err := fdpass.Send(ctx, c.fdPath, fd, reg, c.check); err != nil {
		return c.handoffError(ctx, err)
	}
	return c.registerMemory(ctx, &umbppb.RegisterMemoryRequest{
		ClientId:   c.clientID,
		WorkerBase: uint64(base),
		Size:       size,
		Kind:       umbppb.MemoryKind_MEMORY_KIND_HOST_SHM,
	})
}

// checkHostFD refuses what the server must never be sent: a descriptor that
// is not a regular file opened read-write, or a size beyond the file's.
func checkHostFD(op string, fd int, base, size uint64) error {
	switch {
	case fd < 0:
		return rpc.Invalid(op, "invalid file descriptor %d", fd)
	case base == 0:
		return rpc.Invalid(op, "base address is 0")
	case size == 0:
		return rpc.Invalid(op, "size is 0")
	case base > math.MaxUint64-size:
		return rpc.Invalid(op, "base %#x + size %d overflows", base, size)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return rpc.Invalid(op, "fd %d: %v", fd, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return rpc.Invalid(op, "fd %d is not a regular file (a memfd)", fd)
	}
	if st.Size < 0 || uint64(st.Size) < size {
		return rpc.Invalid(op, "fd %d holds %d bytes, fewer than the %d to register", fd, st.Size, size)
	}
	flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return rpc.Invalid(op, "fd %d: %v", fd, err)
	}
	if flags&unix.O_ACCMODE != unix.O_RDWR {
		return rpc.Invalid(op, "fd %d is not open read-write", fd)
	}
	return nil
}

// GPURegion is GPU memory to register by IPC handle (v2): Size bytes at Base
// on Device, inside the allocation at AllocBase whose IPC handle is Handle;
// IPCOffset is Base-AllocBase.
type GPURegion struct {
	Device    int
	Base      uintptr
	Size      uint64
	Handle    [IPCHandleSize]byte
	IPCOffset uint64
	AllocBase uintptr
}

// RegisterGPU registers GPU memory by IPC handle (v2; no fd handoff). The
// server refuses, as an error wrapping ErrRefused with its reason, when it
// cannot open the handle or its SSD tier is on; a v1 server refuses with
// "fd handoff registration was not found". The handle travels over a gRPC
// connection, which the trust check vetted when it was made.
func (c *Conn) RegisterGPU(ctx context.Context, r GPURegion) error {
	const op = "RegisterGPU"
	if err := c.usable(op); err != nil {
		return err
	}
	base, alloc := uint64(r.Base), uint64(r.AllocBase)
	switch {
	case r.Device < 0 || r.Device > math.MaxInt32:
		return rpc.Invalid(op, "device %d", r.Device)
	case base == 0 || alloc == 0:
		return rpc.Invalid(op, "base %#x or allocation base %#x is 0", base, alloc)
	case r.Size == 0:
		return rpc.Invalid(op, "size is 0")
	case base > math.MaxUint64-r.Size:
		return rpc.Invalid(op, "base %#x + size %d overflows", base, r.Size)
	case base < alloc || base-alloc != r.IPCOffset:
		return rpc.Invalid(op, "IPC offset %d is not base %#x - allocation base %#x", r.IPCOffset, base, alloc)
	}
	handle := r.Handle
	return c.registerMemory(ctx, &umbppb.RegisterMemoryRequest{
		ClientId:   c.clientID,
		WorkerBase: base,
		Size:       r.Size,
		Kind:       umbppb.MemoryKind_MEMORY_KIND_GPU_IPC,
		DeviceId:   int32(r.Device),
		IpcHandle:  handle[:],
		IpcOffset:  r.IPCOffset,
		AllocBase:  alloc,
	})
}

// registerMemory completes req with the worker identity and sends it.
func (c *Conn) registerMemory(ctx context.Context, req *umbppb.RegisterMemoryRequest) error {
	const op = "RegisterMemory"
	req.WorkerNodeId = c.nodeID
	req.WorkerNodeAddress = c.nodeAddr
	req.Tags = c.tags
	resp, err := c.raw.RegisterMemory(ctx, req)
	if err != nil {
		return c.rpcError(ctx, op, err)
	}
	if !resp.GetOk() {
		return refused(op, resp.GetError())
	}
	c.log.Debug("registered memory with the UMBP server", "kind", req.Kind.String(), "base", fmt.Sprintf("%#x", req.WorkerBase), "size", req.Size)
	return nil
}

// Deregister drops every region this client registered; stored keys stay.
// Call it only when no transfer naming those regions is outstanding.
func (c *Conn) Deregister(ctx context.Context) error { return c.DeregisterClient(ctx, c.clientID) }

// DeregisterClient is Deregister for another connection's client id: a
// connection whose transport was lost (it never redials) is deregistered
// through another one to the same path, in case the same server lives on.
func (c *Conn) DeregisterClient(ctx context.Context, clientID string) error {
	const op = "DeregisterMemory"
	if err := c.usable(op); err != nil {
		return err
	}
	if _, err := c.raw.DeregisterMemory(ctx, &umbppb.DeregisterMemoryRequest{ClientId: clientID}); err != nil {
		return c.rpcError(ctx, op, err)
	}
	return nil
}
