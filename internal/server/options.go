// Package server is a Go implementation of the umbp_standalone_server
// protocol (docs/PROTOCOL.md): a gRPC control plane and an fd-handoff plane on
// two Unix sockets, a DRAM pool outside the Go heap with a byte capacity and
// LRU eviction, host regions shared by memfd, and GPU regions opened from IPC
// handles through a pluggable GPUBackend.
//
// It stands in for MORI's binary on hosts without it: the umbptest package
// and cmd/umbp-standalone-server run it.
package server

import (
	"context"
	"log/slog"
	"net"
	"time"

	"google.golang.org/grpc"
)

// Defaults and limits.
const (
	// DefaultCapacity is the DRAM pool size used when Options.Capacity is 0.
	DefaultCapacity uint64 = 1 << 30
	// DefaultFDReceiveTimeout bounds each fd-handoff connection when
	// Options.FDReceiveTimeout is 0.
	DefaultFDReceiveTimeout = 5 * time.Second
	// IPCHandleSize is the size of a HIP (or CUDA) IPC memory handle.
	IPCHandleSize = 64
)

// Reply texts of the protocol. Clients and tests compare against them.
const (
	// MsgFDRegistrationNotFound answers a RegisterMemory whose fd handoff is
	// missing (or smaller than the size asked for).
	MsgFDRegistrationNotFound = "fd handoff registration was not found"
	// MsgBadShmBuffer answers a data op whose memory does not resolve to a
	// registered region of the client.
	MsgBadShmBuffer = "unregistered or out-of-range shm buffer"
	// MsgShuttingDown answers every call that arrives while Close runs.
	MsgShuttingDown = "server is shutting down"
	// MsgGPUNeedsSSDDisabled refuses GPU IPC registration on a server whose
	// SSD tier is on (Options.DisableRangedIO).
	MsgGPUNeedsSSDDisabled = "GPU IPC registration requires SSD to be disabled (this server runs with its SSD tier on)"
	// MsgGPUUnsupported refuses GPU IPC registration when the server has no
	// GPUBackend.
	MsgGPUUnsupported = "GPU IPC registration is not supported by this server build"
)

// Options configure a Server. Only Endpoint is required.
type Options struct {
	// Endpoint is the gRPC socket: an absolute path or unix:///abs/path. The
	// fd-handoff socket path is derived from it (fdpass.SocketPaths).
	Endpoint string
	// Capacity is the DRAM pool size in bytes; 0 means DefaultCapacity.
	Capacity uint64
	// Prefault maps the whole pool at start-up, so that no store pays for
	// the kernel's first touch of a page. It commits Capacity bytes of
	// memory at once; tests leave it off.
	Prefault bool
	// Version is the protocol generation: 2 (the default when 0) serves
	// ranged I/O and GPU regions; 1 answers the v2-only methods with
	// codes.Unimplemented, ignores RegisterMemory's GPU fields and leaves
	// PingResponse.supports_ranged_io unset.
	Version int
	// DisableRangedIO makes a v2 server behave as with its SSD tier on: Ping
	// reports supports_ranged_io=false and GPU IPC registration is refused.
	// Ranged calls are still answered.
	DisableRangedIO bool
	// FDReceiveTimeout bounds each fd-handoff connection; 0 means
	// DefaultFDReceiveTimeout.
	FDReceiveTimeout time.Duration
	// Replace starts even where a live server accepts connections on the
	// endpoint's sockets, taking their paths over (the other server keeps
	// running, unreachable). Without it New refuses with ErrEndpointInUse;
	// sockets left by a server that is gone are replaced either way.
	Replace bool
	// Logger receives the server's logs; nil means slog.Default().
	Logger *slog.Logger
	// UnaryInterceptor, when set, wraps every gRPC handler (fault injection,
	// counting).
	UnaryInterceptor grpc.UnaryServerInterceptor
	// WrapConn, when set, wraps each accepted gRPC connection once its
	// peer's credentials are read (a test closes them to cut clients off
	// while the server lives on).
	WrapConn func(net.Conn) net.Conn
	// FDGate, when set, runs before each fd-handoff connection is served; a
	// non-nil error answers the registration with -1. Its context ends when
	// the server closes, and it must return then: Close waits for it.
	FDGate func(ctx context.Context) error
	// GPU opens IPC handles and copies between GPU regions and the pool. Nil
	// refuses GPU IPC registration with MsgGPUUnsupported.
	GPU GPUBackend
}

// GPUBackend is what the server needs from a GPU runtime to serve GPU_IPC
// regions. Pointers are device addresses (or, for the pool, host addresses of
// the pinned arena); device is the ordinal the client named. Every method
// must set the device it needs itself.
type GPUBackend interface {
	// OpenIPC opens a 64-byte IPC handle on device and returns the base of
	// the mapped allocation.
	OpenIPC(device int, handle []byte) (uintptr, error)
	// CloseIPC closes a pointer OpenIPC returned.
	CloseIPC(device int, ptr uintptr) error
	// Copy makes copies between GPU memory and the pool and returns once
	// every one of them is done or failed. It returns nil when all succeeded,
	// else one error per copy, nil for those that succeeded. A backend may
	// run them concurrently and in any order: copies to overlapping
	// destinations (a get whose ranges overlap in client memory) leave those
	// bytes from any one of them.
	Copy(copies []GPUCopy) []error
	// Pin page-locks the pool's arena [ptr, ptr+n) for fast DMA.
	Pin(ptr uintptr, n uint64) error
	// Unpin undoes Pin before the arena is unmapped.
	Unpin(ptr uintptr) error
}

// GPUCopy is one copy between a GPU region and the pool's arena.
type GPUCopy struct {
	// Device is the device ordinal the region was registered on.
	Device int
	// GPU is the device address, Pool the arena's host address.
	GPU, Pool uintptr
	// N is the number of bytes.
	N uint64
	// ToPool copies GPU to Pool; else Pool to GPU.
	ToPool bool
}

// Stats is a snapshot of the server's state.
type Stats struct {
	// Objects is the number of stored objects.
	Objects int
	// BytesUsed is the sum of stored (and reserved) object sizes.
	BytesUsed uint64
	// Capacity is the DRAM pool's capacity in bytes.
	Capacity uint64
	// ArenaBytes is the size of the mapped arena (Capacity rounded up to a page).
	ArenaBytes uint64
	// Evictions counts objects evicted to make room since the server started.
	Evictions uint64
	// Regions is the number of registered regions, host and GPU.
	Regions int
	// Clients is the number of client ids holding at least one region.
	Clients int
	// GPUHandles is the number of open IPC handles.
	GPUHandles int
	// FDHandoffs counts fd-handoff connections served; FDRejected those
	// answered -1, FDRegistered those answered 0 (each counted once its
	// answer is known: a handoff still being served is in neither).
	FDHandoffs, FDRejected, FDRegistered uint64
	// ClientProcesses is the number of client processes holding regions
	// and watched for their exit.
	ClientProcesses int
	// ReclaimedProcesses counts client processes that exited holding
	// regions (killed, crashed, or gone without DeregisterMemory);
	// ReclaimedRegions the regions released for them.
	ReclaimedProcesses, ReclaimedRegions uint64
}
