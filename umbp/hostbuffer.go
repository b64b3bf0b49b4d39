package umbp

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// MemoryLocation says where a [Buffer]'s bytes live.
type MemoryLocation int

const (
	// LocationAuto detects the location: host memory from a [HostBuffer],
	// else GPU memory by the runtime's pointer attributes.
	LocationAuto MemoryLocation = iota
	// LocationHost is host memory; it must come from a [HostBuffer].
	LocationHost
	// LocationGPU is GPU memory, shared with the server by IPC handle.
	LocationGPU
)

// String returns "auto", "host" or "gpu".
func (l MemoryLocation) String() string {
	switch l {
	case LocationAuto:
		return "auto"
	case LocationHost:
		return "host"
	case LocationGPU:
		return "gpu"
	}
	return fmt.Sprintf("MemoryLocation(%d)", int(l))
}

// Buffer names memory to register with the server: Size bytes at Ptr.
// Device is the GPU ordinal of GPU memory.
type Buffer struct {
	Ptr      uintptr
	Size     uint64
	Location MemoryLocation
	Device   int
}

// HostBuffer is host memory the server can map: a memfd mapped MAP_SHARED
// into this process. Only such memory can be registered as host memory,
// since the server maps the same pages from the descriptor.
//
// A HostBuffer registered with a worker handle cannot be closed until the
// handle has deregistered it: Close answers ErrBuffersInUse, or
// ErrBuffersAbandoned while a closed handle still waits for transfers that
// hold it, and leaves the memory mapped, so the server can never write into
// memory that was let go.
type HostBuffer struct {
	fd   int
	mem  []byte // the whole mapping
	size int    // as asked
	// own marks a buffer the package made for itself (a staging buffer):
	// no caller may register it, on any handle.
	own bool

	mu        sync.Mutex
	users     int // registrations holding the buffer, abandoned ones included
	abandoned int // registrations of closed handles still waiting for transfers
	closed    bool
}

// NewHostBuffer creates a zeroed, shareable host buffer of size bytes. The
// mapping is rounded up to whole pages; Bytes returns exactly size bytes.
func NewHostBuffer(size int) (*HostBuffer, error) {
	b, err := newHostBuffer(size, false)
	return b, opError("host buffer", "", err)
}

// newHostBuffer makes a HostBuffer of size bytes; own marks one the package
// makes for itself.
func newHostBuffer(size int, own bool) (*HostBuffer, error) {
	if size <= 0 {
		return nil, fmt.Errorf("size %d must be positive", size)
	}
	page := os.Getpagesize()
	mapped := (size + page - 1) / page * page
	if mapped < size { // overflow
		return nil, fmt.Errorf("%d bytes are more than any address space", size)
	}
	if limit := hostMemory(); limit > 0 && uint64(mapped) > limit {
		return nil, fmt.Errorf("%d bytes are more than this host's memory and swap (%d bytes)", size, limit)
	}
	fd, err := unix.MemfdCreate("umbp-host-buffer", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(mapped)); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ftruncate to %d bytes: %w", mapped, err)
	}
	mem, err := unix.Mmap(fd, 0, mapped, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("mmap of %d bytes: %w", mapped, err)
	}
	b := &HostBuffer{fd: fd, mem: mem, size: size, own: own}
	hostBuffers.add(b)
	return b, nil
}

// hostMemory returns the host's RAM and swap in bytes, 0 when unknown: no
// larger host buffer could ever be backed.
func hostMemory() uint64 {
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) != nil {
		return 0
	}
	return (uint64(si.Totalram) + uint64(si.Totalswap)) * uint64(si.Unit)
}

// prefault allocates the buffer's pages now rather than at their first
// touch: MADV_POPULATE_WRITE, or a write to each page where the kernel
// lacks it.
func (b *HostBuffer) prefault() {
	if unix.Madvise(b.mem, unix.MADV_POPULATE_WRITE) == nil {
		return
	}
	page := os.Getpagesize()
	for i := 0; i < len(b.mem); i += page {
		b.mem[i] = 0
	}
}

// Bytes returns the buffer's memory, or nil after Close succeeded.
func (b *HostBuffer) Bytes() []byte {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.mem == nil {
		return nil
	}
	return b.mem[:b.size:b.size]
}

// Buffer describes the buffer for [WorkerHandle.RegisterBuffers]; after
// Close succeeded it is the zero Buffer.
func (b *HostBuffer) Buffer() Buffer {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.mem == nil {
		return Buffer{}
	}
	return Buffer{Ptr: b.base(), Size: uint64(b.size), Location: LocationHost}
}

func (b *HostBuffer) base() uintptr { return uintptr(unsafe.Pointer(&b.mem[0])) }

// mappedSize is what registration hands the server: the whole mapping.
func (b *HostBuffer) mappedSize() uint64 { return uint64(len(b.mem)) }

// Close unmaps the buffer and closes its descriptor. It refuses while a
// worker handle still has the buffer registered.
func (b *HostBuffer) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case b.closed:
		return nil
	case b.abandoned > 0:
		return opError("close host buffer", "", fmt.Errorf("%d bytes at %#x: a closed worker handle still waits for transfers that use it: %w", b.size, b.base(), ErrBuffersAbandoned))
	case b.users > 0:
		return opError("close host buffer", "", fmt.Errorf("%d bytes at %#x are registered with %s: %w", b.size, b.base(), plural(b.users, "worker handle"), ErrBuffersInUse))
	}
	hostBuffers.remove(b)
	b.closed = true
	errU := unix.Munmap(b.mem)
	errC := unix.Close(b.fd)
	b.mem = nil
	return opError("close host buffer", "", errors.Join(errU, errC))
}

// acquire marks the buffer registered; it fails on a closed buffer.
func (b *HostBuffer) acquire() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return errors.New("host buffer is closed")
	}
	b.users++
	return nil
}

// release undoes acquire once the server no longer holds the buffer.
func (b *HostBuffer) release() {
	b.mu.Lock()
	b.users--
	b.mu.Unlock()
}

// abandon marks a registration whose handle closed while transfers still
// held the buffer: it stays pinned until reclaim.
func (b *HostBuffer) abandon() {
	b.mu.Lock()
	b.abandoned++
	b.mu.Unlock()
}

// reclaim ends an abandoned registration: those transfers have ended and
// the handle deregistered the buffer.
func (b *HostBuffer) reclaim() {
	b.mu.Lock()
	b.abandoned--
	b.users--
	b.mu.Unlock()
}

// hostBuffers finds the live HostBuffer that holds an address.
var hostBuffers hostBufferSet

type hostBufferSet struct {
	mu   sync.Mutex
	bufs []*HostBuffer // sorted by base
}

func (s *hostBufferSet) add(b *HostBuffer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := sort.Search(len(s.bufs), func(i int) bool { return s.bufs[i].base() > b.base() })
	s.bufs = append(s.bufs, nil)
	copy(s.bufs[i+1:], s.bufs[i:])
	s.bufs[i] = b
}

func (s *hostBufferSet) remove(b *HostBuffer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, x := range s.bufs {
		if x == b {
			s.bufs = append(s.bufs[:i], s.bufs[i+1:]...)
			return
		}
	}
}

// at returns the buffer whose mapping holds the address ptr, or nil.
func (s *hostBufferSet) at(ptr uintptr) *HostBuffer { return s.find(ptr, 1) }

// find returns the buffer whose mapping holds [ptr, ptr+size), or nil.
func (s *hostBufferSet) find(ptr uintptr, size uint64) *HostBuffer {
	s.mu.Lock()
	defer s.mu.Unlock()
	i := sort.Search(len(s.bufs), func(i int) bool { return s.bufs[i].base() > ptr })
	if i == 0 {
		return nil
	}
	b := s.bufs[i-1]
	off := uint64(ptr - b.base())
	if off <= b.mappedSize() && size <= b.mappedSize()-off {
		return b
	}
	return nil
}
