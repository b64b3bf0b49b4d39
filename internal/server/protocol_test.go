package server

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/umbp-go/umbp-go/internal/fdpass"
	"github.com/umbp-go/umbp-go/proto/umbppb"
)

func TestNewValidatesOptions(t *testing.T) {
	dir := shortDir(t)
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"empty endpoint", Options{}},
		{"relative path", Options{Endpoint: "unix://rel/x.grpc.sock"}},
		{"path too long", Options{Endpoint: "/" + strings.Repeat("a", 120)}},
		{"bad version", Options{Endpoint: dir + "/v.grpc.sock", Version: 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if s, err := New(tc.opts); err == nil {
				_ = s.Close()
				t.Fatal("New succeeded")
			}
		})
	}
}

func TestSocketsCreatedAndRemoved(t *testing.T) {
	dir := shortDir(t)
	for _, tc := range []struct {
		name  string
		sub   string // created by the server when not empty
		stale bool   // sockets no server listens on stand at the socket paths
	}{
		{name: "parent directories created", sub: "a/b"},
		{name: "stale sockets replaced", stale: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			base := filepath.Join(dir, tc.sub)
			grpcPath := filepath.Join(base, "n.grpc.sock")
			fdPath := filepath.Join(base, "n.fd.sock")
			if tc.stale {
				for _, p := range []string{grpcPath, fdPath} {
					ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
					if err != nil {
						t.Fatal(err)
					}
					ln.SetUnlinkOnClose(false)
					_ = ln.Close() // the socket file stays, with no listener
				}
			}
			srv, err := New(Options{Endpoint: "unix://" + grpcPath, Logger: testLogger(), Capacity: 1 << 20})
			if err != nil {
				t.Fatal(err)
			}
			if got, want := srv.Endpoint(), "unix://"+grpcPath; got != want {
				t.Errorf("Endpoint() = %q, want %q", got, want)
			}
			if srv.FDSocketPath() != fdPath {
				t.Errorf("FDSocketPath() = %q, want %q", srv.FDSocketPath(), fdPath)
			}
			if tc.sub != "" {
				for _, d := range []string{filepath.Join(dir, "a"), base} {
					st, err := os.Stat(d)
					if err != nil {
						t.Fatal(err)
					}
					if st.Mode().Perm()&0o077 != 0 {
						t.Errorf("%s: mode %v, want 0700", d, st.Mode().Perm())
					}
				}
			}
			for _, p := range []string{grpcPath, fdPath} {
				st, err := os.Lstat(p)
				if err != nil {
					t.Fatal(err)
				}
				if st.Mode()&os.ModeSocket == 0 || st.Mode().Perm() != 0o600 {
					t.Errorf("%s: mode %v, want a 0600 socket", p, st.Mode())
				}
			}
			cc, c := dial(t, srv.Endpoint())
			defer cc.Close()
			if _, err := c.Ping(ctxT(t), &umbppb.Empty{}); err != nil {
				t.Fatal(err)
			}
			if err := srv.Close(); err != nil {
				t.Fatal(err)
			}
			if err := srv.Close(); err != nil {
				t.Fatalf("second Close: %v", err)
			}
			for _, p := range []string{grpcPath, fdPath} {
				if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("%s still exists after Close: %v", p, err)
				}
			}
		})
	}
}

func TestCloseLeavesAnotherServersSockets(t *testing.T) {
	dir := shortDir(t)
	ep := dir + "/same.sock"
	a, err := New(Options{Endpoint: ep, Logger: testLogger(), Capacity: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	b, err := New(Options{Endpoint: ep, Logger: testLogger(), Capacity: 1 << 20, Replace: true})
	if err != nil {
		_ = a.Close()
		t.Fatal(err)
	}
	defer b.Close()
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if b.FDSocketPath() != ep+".fd.sock" {
		t.Errorf("fd path %q", b.FDSocketPath())
	}
	for _, p := range []string{ep, ep + ".fd.sock"} {
		if _, err := os.Lstat(p); err != nil {
			t.Errorf("%s: the first server's Close removed the second's socket: %v", p, err)
		}
	}
}

func TestPing(t *testing.T) {
	for _, tc := range []struct {
		name   string
		opts   Options
		ranged bool
	}{
		{"v2", Options{}, true},
		{"v2 explicit", Options{Version: 2}, true},
		{"v2 ssd", Options{DisableRangedIO: true}, false},
		{"v1", Options{Version: 1}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.opts.Capacity = 1 << 20
			h := newHarness(t, tc.opts)
			r, err := h.c.Ping(ctxT(t), &umbppb.Empty{})
			if err != nil {
				t.Fatal(err)
			}
			if !r.Ready || r.DeploymentMode != umbppb.StandaloneBackendMode_STANDALONE_BACKEND_LOCAL || r.SupportsRangedIo != tc.ranged {
				t.Fatalf("Ping = %v", r)
			}
		})
	}
}

func TestRegisterHost(t *testing.T) {
	h := newHarness(t, Options{Capacity: 1 << 20})
	ctx := ctxT(t)
	m := newMemfd(t, 64<<10)
	reg := func(client string, base, size uint64) *umbppb.BoolResponse {
		r, err := h.c.RegisterMemory(ctx, &umbppb.RegisterMemoryRequest{
			ClientId: client, WorkerBase: base, Size: size, Kind: umbppb.MemoryKind_MEMORY_KIND_HOST_SHM,
			WorkerNodeId: "node0", WorkerNodeAddress: "local", Tags: []string{"a"},
		})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	wantFail(t, "before handoff", reg("c1", m.base, 4096), MsgFDRegistrationNotFound)
	if err := h.handoff(t, "c1", m, m.base, 32<<10); err != nil {
		t.Fatal(err)
	}
	wantOK(t, "same size", reg("c1", m.base, 32<<10))
	wantOK(t, "smaller size", reg("c1", m.base, 4096))
	wantFail(t, "larger size", reg("c1", m.base, 32<<10+1), MsgFDRegistrationNotFound)
	wantFail(t, "other base", reg("c1", m.base+4096, 4096), MsgFDRegistrationNotFound)
	wantFail(t, "other client", reg("c2", m.base, 4096), MsgFDRegistrationNotFound)
	wantFail(t, "empty client", reg("", m.base, 4096), MsgFDRegistrationNotFound)

	// A client claiming more than its memfd holds is refused (no SIGBUS later).
	if err := h.handoff(t, "c1", m, m.base+1, 64<<10+1); !errors.Is(err, fdpass.ErrRejected) {
		t.Fatalf("lying size: %v, want ErrRejected", err)
	}
	wantFail(t, "lying size", reg("c1", m.base+1, 4096), MsgFDRegistrationNotFound)

	// A descriptor that is not a regular file is refused.
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	err := fdpass.Send(ctx, h.srv.FDSocketPath(), p[0], fdpass.Registration{ClientID: "c1", WorkerBase: 7, Size: 1}, nil)
	if !errors.Is(err, fdpass.ErrRejected) {
		t.Fatalf("pipe: %v, want ErrRejected", err)
	}

	// A read-only descriptor cannot be mapped read-write.
	ro, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", m.fd), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ro)
	err = fdpass.Send(ctx, h.srv.FDSocketPath(), ro, fdpass.Registration{ClientID: "c1", WorkerBase: 9, Size: 4096}, nil)
	if !errors.Is(err, fdpass.ErrRejected) {
		t.Fatalf("read-only memfd: %v, want ErrRejected", err)
	}
	if st := h.srv.Stats(); st.Regions != 1 || st.Clients != 1 || st.FDRejected != 3 {
		t.Fatalf("stats %+v", st)
	}
}

func TestPutGetRoundTrip(t *testing.T) {
	h := newHarness(t, Options{Capacity: 1 << 20})
	m := newMemfd(t, 64<<10)
	h.register(t, "c", m)
	fill(m.mem[:8192], 1)
	wantOK(t, "put", h.put(t, "c", "k", m.base, 0, 8192))
	if !h.exists(t, "k") {
		t.Fatal("Exists after Put is false")
	}
	wantOK(t, "get", h.get(t, "c", "k", m.base, 16384, 8192))
	wantBytes(t, "get", m.mem[16384:16384+8192], pattern(8192, 1))
	// Size differs from the stored size: false, no text.
	wantFail(t, "get other size", h.get(t, "c", "k", m.base, 0, 4096), "")
	// Missing key: false, no text.
	wantFail(t, "get missing", h.get(t, "c", "nope", m.base, 0, 4096), "")
	r, err := h.c.Exists(ctxT(t), &umbppb.KeyRequest{Key: "nope"})
	if err != nil || r.Ok || r.Error != "" {
		t.Fatalf("Exists(missing) = %v, %v; want ok=false, empty error", r, err)
	}
	if st := h.srv.Stats(); st.Objects != 1 || st.BytesUsed != 8192 || st.Capacity != 1<<20 {
		t.Fatalf("stats %+v", st)
	}
}

func TestFirstWriterWins(t *testing.T) {
	h := newHarness(t, Options{Capacity: 1 << 20})
	m := newMemfd(t, 64<<10)
	h.register(t, "c", m)
	fill(m.mem[:4096], 1)
	fill(m.mem[4096:12288], 2)
	wantOK(t, "first", h.put(t, "c", "k", m.base, 0, 4096))
	wantOK(t, "second, other size", h.put(t, "c", "k", m.base, 4096, 8192))
	wantFail(t, "get second size", h.get(t, "c", "k", m.base, 16384, 8192), "")
	wantOK(t, "get first size", h.get(t, "c", "k", m.base, 16384, 4096))
	wantBytes(t, "kept value", m.mem[16384:16384+4096], pattern(4096, 1))
}

func TestUnresolvableBuffers(t *testing.T) {
	h := newHarness(t, Options{Capacity: 1 << 20})
	m := newMemfd(t, 16<<10)
	h.register(t, "c", m)
	fill(m.mem, 3)
	wantOK(t, "stored", h.put(t, "c", "k", m.base, 0, 4096))
	size := uint64(len(m.mem))
	for _, tc := range []struct {
		name                   string
		client                 string
		base, off, n           uint64
		alsoBadWithoutBaseZero bool
	}{
		{name: "unknown client", client: "x", base: m.base, n: 4096},
		{name: "unknown region", client: "c", base: m.base + 4096, n: 4096},
		{name: "past the end", client: "c", base: m.base, off: size - 4095, n: 4096},
		{name: "size 0", client: "c", base: m.base, n: 0},
		{name: "offset overflow", client: "c", base: m.base, off: math.MaxUint64 - 10, n: 4096},
		{name: "size overflow", client: "c", base: m.base, off: 4096, n: math.MaxUint64},
		{name: "base 0 no fit", client: "c", base: 0, off: size, n: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantFail(t, "put", h.put(t, tc.client, "new", tc.base, tc.off, tc.n), MsgBadShmBuffer)
			wantFail(t, "get", h.get(t, tc.client, "k", tc.base, tc.off, tc.n), MsgBadShmBuffer)
		})
	}
	if h.exists(t, "new") {
		t.Fatal("a refused put stored its key")
	}
}

func TestRegionBaseZeroFirstFit(t *testing.T) {
	h := newHarness(t, Options{Capacity: 1 << 20})
	small := newMemfd(t, 4096)
	big := newMemfd(t, 64<<10)
	h.register(t, "c", small)
	h.register(t, "c", big)
	fill(small.mem, 1)
	fill(big.mem, 2)
	// Fits the first region: taken from it.
	wantOK(t, "put small", h.put(t, "c", "a", 0, 0, 4096))
	// Only fits the second.
	wantOK(t, "put big", h.put(t, "c", "b", 0, 8192, 4096))
	wantOK(t, "get a", h.get(t, "c", "a", big.base, 32768, 4096))
	wantBytes(t, "a came from the first region", big.mem[32768:32768+4096], small.mem)
	wantOK(t, "get b", h.get(t, "c", "b", big.base, 40960, 4096))
	wantBytes(t, "b came from the second region", big.mem[40960:40960+4096], pattern(64<<10, 2)[8192:8192+4096])
	// Batches with empty region_bases resolve the same way.
	r, err := h.c.BatchGet(ctxT(t), &umbppb.BatchDataRequest{Keys: []string{"a", "b"}, ClientId: "c", ShmOffsets: []uint64{0, 49152}, Sizes: []uint64{4096, 4096}})
	if err != nil {
		t.Fatal(err)
	}
	wantBools(t, "batch get", r.Ok, true, true)
	wantBytes(t, "batch a", small.mem, pattern(4096, 1))
	wantBytes(t, "batch b", big.mem[49152:49152+4096], pattern(64<<10, 2)[8192:8192+4096])
}

func TestMultiRegionAndClients(t *testing.T) {
	h := newHarness(t, Options{Capacity: 1 << 20})
	a1, a2, b := newMemfd(t, 8192), newMemfd(t, 8192), newMemfd(t, 8192)
	h.register(t, "A", a1)
	h.register(t, "A", a2)
	h.register(t, "B", b)
	fill(a1.mem, 5)
	wantOK(t, "put", h.put(t, "A", "k", a1.base, 0, 8192))
	wantOK(t, "get into a2", h.get(t, "A", "k", a2.base, 0, 8192))
	wantBytes(t, "a2", a2.mem, a1.mem)
	wantOK(t, "other client reads", h.get(t, "B", "k", b.base, 0, 8192))
	wantBytes(t, "b", b.mem, a1.mem)
	// A region of another client is not ours.
	wantFail(t, "B names A's region", h.get(t, "B", "k", a1.base, 0, 8192), MsgBadShmBuffer)
	if st := h.srv.Stats(); st.Regions != 3 || st.Clients != 2 {
		t.Fatalf("stats %+v", st)
	}
}

func TestReplaceRegion(t *testing.T) {
	h := newHarness(t, Options{Capacity: 1 << 20})
	first, second := newMemfd(t, 8192), newMemfd(t, 16384)
	h.register(t, "c", first)
	fill(first.mem, 1)
	fill(second.mem, 2)
	// The second memfd is sent for the first one's worker_base.
	if err := h.handoff(t, "c", second, first.base, 16384); err != nil {
		t.Fatal(err)
	}
	r, err := h.c.RegisterMemory(ctxT(t), &umbppb.RegisterMemoryRequest{ClientId: "c", WorkerBase: first.base, Size: 16384})
	if err != nil {
		t.Fatal(err)
	}
	wantOK(t, "re-register", r)
	wantOK(t, "put 16K", h.put(t, "c", "k", first.base, 0, 16384))
	wantOK(t, "get", h.get(t, "c", "k", first.base, 0, 16384))
	wantBytes(t, "replacement mapping used", second.mem, pattern(16384, 2))
	wantBytes(t, "old memory untouched", first.mem, pattern(8192, 1))
	if st := h.srv.Stats(); st.Regions != 1 {
		t.Fatalf("regions %d, want 1", st.Regions)
	}
}

func TestDeregisterKeepsKeys(t *testing.T) {
	h := newHarness(t, Options{Capacity: 1 << 20})
	ctx := ctxT(t)
	m1, m2 := newMemfd(t, 8192), newMemfd(t, 8192)
	h.register(t, "c", m1)
	h.register(t, "c", m2)
	fill(m1.mem, 9)
	wantOK(t, "put", h.put(t, "c", "k", m1.base, 0, 8192))
	if _, err := h.c.DeregisterMemory(ctx, &umbppb.DeregisterMemoryRequest{ClientId: "c"}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.c.DeregisterMemory(ctx, &umbppb.DeregisterMemoryRequest{ClientId: "never-seen"}); err != nil {
		t.Fatalf("unknown client: %v", err)
	}
	if _, err := h.c.DeregisterMemory(ctx, &umbppb.DeregisterMemoryRequest{}); err != nil {
		t.Fatalf("empty client: %v", err)
	}
	if st := h.srv.Stats(); st.Regions != 0 || st.Clients != 0 || st.Objects != 1 {
		t.Fatalf("stats after deregister %+v", st)
	}
	if !h.exists(t, "k") {
		t.Fatal("deregistration dropped a stored key")
	}
	wantFail(t, "get after deregister", h.get(t, "c", "k", m2.base, 0, 8192), MsgBadShmBuffer)
	r, err := h.c.RegisterMemory(ctx, &umbppb.RegisterMemoryRequest{ClientId: "c", WorkerBase: m2.base, Size: 8192})
	if err != nil {
		t.Fatal(err)
	}
	wantFail(t, "RegisterMemory after deregister", r, MsgFDRegistrationNotFound)
	h.register(t, "c", m2)
	wantOK(t, "get after re-register", h.get(t, "c", "k", m2.base, 0, 8192))
	wantBytes(t, "value", m2.mem, pattern(8192, 9))
}

func (h *harness) batchPut(tb testing.TB, client string, keys []string, offs, sizes, bases []uint64) []bool {
	tb.Helper()
	r, err := h.c.BatchPut(ctxT(tb), &umbppb.BatchDataRequest{Keys: keys, ClientId: client, ShmOffsets: offs, Sizes: sizes, RegionBases: bases})
	if err != nil {
		tb.Fatal(err)
	}
	return r.Ok
}

func (h *harness) batchGet(tb testing.TB, client string, keys []string, offs, sizes, bases []uint64) []bool {
	tb.Helper()
	r, err := h.c.BatchGet(ctxT(tb), &umbppb.BatchDataRequest{Keys: keys, ClientId: client, ShmOffsets: offs, Sizes: sizes, RegionBases: bases})
	if err != nil {
		tb.Fatal(err)
	}
	return r.Ok
}

func TestBatches(t *testing.T) {
	h := newHarness(t, Options{Capacity: 1 << 20})
	ctx := ctxT(t)
	m := newMemfd(t, 64<<10)
	h.register(t, "c", m)
	fill(m.mem[:16384], 4)
	b := m.base
	wantBools(t, "batch put", h.batchPut(t, "c", []string{"a", "b", "c"}, []uint64{0, 4096, 8192}, []uint64{4096, 4096, 8192}, []uint64{b, b, b}), true, true, true)
	wantBools(t, "empty batch", h.batchPut(t, "c", nil, nil, nil, nil))
	wantBools(t, "batch get", h.batchGet(t, "c", []string{"c", "x", "a", "b"},
		[]uint64{32768, 0, 16384, 20480}, []uint64{8192, 4096, 4096, 1}, []uint64{b, b, b, b}), true, false, true, false)
	wantBytes(t, "c", m.mem[32768:32768+8192], pattern(16384, 4)[8192:])
	wantBytes(t, "a", m.mem[16384:16384+4096], pattern(16384, 4)[:4096])

	ex, err := h.c.BatchExists(ctx, &umbppb.BatchKeysRequest{Keys: []string{"a", "x", "c", "b", ""}})
	if err != nil {
		t.Fatal(err)
	}
	wantBools(t, "batch exists", ex.Ok, true, false, true, true, false)
	for _, tc := range []struct {
		keys []string
		want uint64
	}{
		{[]string{"a", "b", "c"}, 3},
		{[]string{"a", "b", "x", "c"}, 2},
		{[]string{"x", "a"}, 0},
		{nil, 0},
	} {
		n, err := h.c.BatchExistsConsecutive(ctx, &umbppb.BatchKeysRequest{Keys: tc.keys})
		if err != nil {
			t.Fatal(err)
		}
		if n.Count != tc.want {
			t.Errorf("BatchExistsConsecutive(%q) = %d, want %d", tc.keys, n.Count, tc.want)
		}
	}

	dr, err := h.c.BatchPutWithDepth(ctx, &umbppb.BatchDataWithDepthRequest{
		Keys: []string{"d1", "d2"}, ClientId: "c", ShmOffsets: []uint64{0, 4096}, Sizes: []uint64{4096, 4096},
		Depths: []int32{1, 2}, RegionBases: []uint64{b, b},
	})
	if err != nil {
		t.Fatal(err)
	}
	wantBools(t, "with depth", dr.Ok, true, true)
	dr, err = h.c.BatchPutWithDepth(ctx, &umbppb.BatchDataWithDepthRequest{
		Keys: []string{"d3", "d4"}, ClientId: "c", ShmOffsets: []uint64{0, 4096}, Sizes: []uint64{4096, 4096}, Depths: []int32{1},
	})
	if err != nil {
		t.Fatal(err)
	}
	wantBools(t, "with depth, depths short", dr.Ok, false, false)
	if h.exists(t, "d3") {
		t.Fatal("d3 stored by an all-false batch")
	}
}

func TestBatchAnyBadEntryFailsAll(t *testing.T) {
	h := newHarness(t, Options{Capacity: 1 << 20})
	m := newMemfd(t, 16<<10)
	h.register(t, "c", m)
	fill(m.mem, 6)
	wantOK(t, "seed", h.put(t, "c", "seed", m.base, 0, 4096))
	b := m.base
	keys := []string{"g1", "g2"}
	for _, tc := range []struct {
		name               string
		client             string
		offs, sizes, bases []uint64
	}{
		{"offsets short", "c", []uint64{0}, []uint64{4096, 4096}, []uint64{b, b}},
		{"sizes long", "c", []uint64{0, 4096}, []uint64{4096, 4096, 1}, []uint64{b, b}},
		{"bases short", "c", []uint64{0, 4096}, []uint64{4096, 4096}, []uint64{b}},
		{"one out of range", "c", []uint64{0, 16384}, []uint64{4096, 4096}, []uint64{b, b}},
		{"one size 0", "c", []uint64{0, 4096}, []uint64{4096, 0}, []uint64{b, b}},
		{"one unknown region", "c", []uint64{0, 4096}, []uint64{4096, 4096}, []uint64{b, b + 1}},
		{"unknown client", "z", []uint64{0, 4096}, []uint64{4096, 4096}, []uint64{b, b}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantBools(t, "put", h.batchPut(t, tc.client, keys, tc.offs, tc.sizes, tc.bases), false, false)
			for _, k := range keys {
				if h.exists(t, k) {
					t.Fatalf("%s stored by an all-false batch", k)
				}
			}
			gk := []string{"seed", "seed"}
			wantBools(t, "get", h.batchGet(t, tc.client, gk, tc.offs, tc.sizes, tc.bases), false, false)
		})
	}
}

func TestBatchSameKeyTwice(t *testing.T) {
	h := newHarness(t, Options{Capacity: 1 << 20})
	m := newMemfd(t, 64<<10)
	h.register(t, "c", m)
	fill(m.mem[:4096], 1)
	fill(m.mem[4096:12288], 2)
	b := m.base
	// Within one batch the later value wins (whatever its size).
	wantBools(t, "dup", h.batchPut(t, "c", []string{"k", "k"}, []uint64{0, 4096}, []uint64{4096, 8192}, []uint64{b, b}), true, true)
	wantFail(t, "first size", h.get(t, "c", "k", b, 16384, 4096), "")
	wantOK(t, "later size", h.get(t, "c", "k", b, 16384, 8192))
	wantBytes(t, "later value", m.mem[16384:16384+8192], pattern(8192, 2))
	// A key stored before the batch keeps its first value.
	wantBools(t, "existing", h.batchPut(t, "c", []string{"k", "k"}, []uint64{0, 0}, []uint64{4096, 4096}, []uint64{b, b}), true, true)
	wantOK(t, "still later size", h.get(t, "c", "k", b, 16384, 8192))
	if st := h.srv.Stats(); st.Objects != 1 || st.BytesUsed != 8192 {
		t.Fatalf("stats %+v", st)
	}
}

func TestEvictionLRU(t *testing.T) {
	const obj = 4096
	h := newHarness(t, Options{Capacity: 4 * obj})
	m := newMemfd(t, 64<<10)
	h.register(t, "c", m)
	for i := range 4 {
		fill(m.mem[i*obj:(i+1)*obj], byte(i))
		wantOK(t, "put", h.put(t, "c", fmt.Sprint("k", i), m.base, uint64(i*obj), obj))
	}
	// Use k0 (Get) and k1 (Exists): k2 is now least recently used, then k3.
	wantOK(t, "get k0", h.get(t, "c", "k0", m.base, 32768, obj))
	if !h.exists(t, "k1") {
		t.Fatal("k1 missing")
	}
	wantOK(t, "put k4", h.put(t, "c", "k4", m.base, 0, obj))
	want := map[string]bool{"k0": true, "k1": true, "k2": false, "k3": true, "k4": true}
	for k, w := range want {
		if got := h.exists(t, k); got != w {
			t.Errorf("Exists(%s) = %v, want %v", k, got, w)
		}
	}
	// Batch exists touches too: k3 before k0 before k4 before k1.
	if _, err := h.c.BatchExists(ctxT(t), &umbppb.BatchKeysRequest{Keys: []string{"k1", "k4", "k0", "k3"}}); err != nil {
		t.Fatal(err)
	}
	// Two objects' room needed: k1 and k4 go.
	wantOK(t, "put big", h.put(t, "c", "big", m.base, 0, 2*obj))
	for k, w := range map[string]bool{"k1": false, "k4": false, "k0": true, "k3": true, "big": true} {
		if got := h.exists(t, k); got != w {
			t.Errorf("after big: Exists(%s) = %v, want %v", k, got, w)
		}
	}
	st := h.srv.Stats()
	if st.Evictions != 3 || st.Objects != 3 || st.BytesUsed != 4*obj {
		t.Fatalf("stats %+v", st)
	}
	wantOK(t, "get k3", h.get(t, "c", "k3", m.base, 32768, obj))
	wantBytes(t, "k3 intact", m.mem[32768:32768+obj], pattern(obj, 3))
}

func TestOversizeObjectRefused(t *testing.T) {
	h := newHarness(t, Options{Capacity: 8192})
	m := newMemfd(t, 64<<10)
	h.register(t, "c", m)
	wantOK(t, "small", h.put(t, "c", "s", m.base, 0, 4096))
	r := h.put(t, "c", "huge", m.base, 0, 16384)
	if r.Ok || r.Error == "" {
		t.Fatalf("oversize put = %v, want false with a reason", r)
	}
	if h.exists(t, "huge") {
		t.Fatal("oversize object stored")
	}
	wantBools(t, "batch with oversize", h.batchPut(t, "c", []string{"a", "huge"}, []uint64{0, 0}, []uint64{4096, 16384}, nil), true, false)
	// An object exactly the capacity fits.
	wantOK(t, "exact", h.put(t, "c", "exact", m.base, 0, 8192))
	if st := h.srv.Stats(); st.Objects != 1 || st.BytesUsed != 8192 {
		t.Fatalf("stats %+v", st)
	}
}

func TestOddSizedObjects(t *testing.T) {
	h := newHarness(t, Options{Capacity: 1000})
	m := newMemfd(t, 8192)
	h.register(t, "c", m)
	fill(m.mem, 8)
	for i := range 10 {
		wantOK(t, "put", h.put(t, "c", fmt.Sprint("o", i), m.base, uint64(i), 333))
	}
	st := h.srv.Stats()
	if st.Objects != 3 || st.BytesUsed != 999 {
		t.Fatalf("stats %+v", st)
	}
	wantOK(t, "get newest", h.get(t, "c", "o9", m.base, 4096, 333))
	wantBytes(t, "o9", m.mem[4096:4096+333], pattern(8192, 8)[9:9+333])
}

func TestClearAndFlush(t *testing.T) {
	h := newHarness(t, Options{Capacity: 1 << 20})
	ctx := ctxT(t)
	m := newMemfd(t, 8192)
	h.register(t, "c", m)
	wantOK(t, "put", h.put(t, "c", "k", m.base, 0, 4096))
	r, err := h.c.Clear(ctx, &umbppb.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	wantOK(t, "clear", r)
	if h.exists(t, "k") {
		t.Fatal("Clear kept a key")
	}
	if st := h.srv.Stats(); st.Objects != 0 || st.BytesUsed != 0 || st.Regions != 1 {
		t.Fatalf("stats %+v", st)
	}
	wantOK(t, "put after clear", h.put(t, "c", "k", m.base, 0, 4096))
	r, err = h.c.Flush(ctx, &umbppb.Empty{})
	if err != nil {
		t.Fatal(err)
	}
	wantOK(t, "flush", r)
}

func TestExternalKV(t *testing.T) {
	h := newHarness(t, Options{Capacity: 1 << 20})
	ctx := ctxT(t)
	mut := &umbppb.StandaloneExternalKvMutationRequest{Hashes: []string{"h1", "h2"}, Tier: umbppb.TierType_TIER_HBM, ClientId: "c"}
	for name, call := range map[string]func() (*umbppb.BoolResponse, error){
		"report": func() (*umbppb.BoolResponse, error) { return h.c.ReportExternalKvBlocks(ctx, mut) },
		"revoke": func() (*umbppb.BoolResponse, error) { return h.c.RevokeExternalKvBlocks(ctx, mut) },
		"revoke all": func() (*umbppb.BoolResponse, error) {
			return h.c.RevokeAllExternalKvBlocksAtTier(ctx, &umbppb.StandaloneExternalKvTierRequest{Tier: umbppb.TierType_TIER_DRAM})
		},
	} {
		r, err := call()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		wantOK(t, name, r)
	}
	mr, err := h.c.MatchExternalKv(ctx, &umbppb.StandaloneMatchExternalKvRequest{Hashes: []string{"h1"}, CountAsHit: true})
	if err != nil || len(mr.Matches) != 0 {
		t.Fatalf("MatchExternalKv = %v, %v; want no matches", mr, err)
	}
	hr, err := h.c.GetExternalKvHitCounts(ctx, &umbppb.StandaloneExternalKvHitCountsRequest{Hashes: []string{"h1", "h2"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range hr.Entries {
		if e.HitCountTotal != 0 {
			t.Fatalf("hit counts %v", hr)
		}
	}
}

func TestV1Server(t *testing.T) {
	h := newHarness(t, Options{Capacity: 1 << 20, Version: 1, GPU: newFakeGPU()})
	ctx := ctxT(t)
	for name, call := range map[string]func() error{
		"BatchPutRanges": func() error {
			_, err := h.c.BatchPutRanges(ctx, &umbppb.BatchRangeDataRequest{Keys: []string{"k"}})
			return err
		},
		"BatchGetRanges": func() error {
			_, err := h.c.BatchGetRanges(ctx, &umbppb.BatchRangeDataRequest{Keys: []string{"k"}})
			return err
		},
	} {
		if code := status.Code(call()); code != codes.Unimplemented {
			t.Errorf("%s: code %v, want Unimplemented", name, code)
		}
	}
	// GPU fields are ignored: the registration is looked up as host memory.
	gpuReq := &umbppb.RegisterMemoryRequest{
		ClientId: "c", WorkerBase: 0x1000, Size: 4096, Kind: umbppb.MemoryKind_MEMORY_KIND_GPU_IPC,
		DeviceId: 0, IpcHandle: make([]byte, 64), IpcOffset: 0, AllocBase: 0x1000,
	}
	r, err := h.c.RegisterMemory(ctx, gpuReq)
	if err != nil {
		t.Fatal(err)
	}
	wantFail(t, "v1 GPU registration", r, MsgFDRegistrationNotFound)
	m := newMemfd(t, 8192)
	if err := h.handoff(t, "c", m, 0x1000, 8192); err != nil {
		t.Fatal(err)
	}
	r, err = h.c.RegisterMemory(ctx, gpuReq)
	if err != nil {
		t.Fatal(err)
	}
	wantOK(t, "v1 with an fd registration", r)
	// Contiguous calls work.
	fill(m.mem, 2)
	wantOK(t, "put", h.put(t, "c", "k", 0x1000, 0, 8192))
	wantOK(t, "get", h.get(t, "c", "k", 0x1000, 0, 8192))
}

// TestShuttingDown: a call that reaches its handler after Close began is
// answered "server is shutting down", and Close waits for it.
func TestShuttingDown(t *testing.T) {
	entered := make(chan string, 8)
	release := make(chan struct{})
	h := newHarness(t, Options{
		Capacity: 1 << 20,
		UnaryInterceptor: func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			if !strings.HasSuffix(info.FullMethod, "/Ping") {
				entered <- info.FullMethod
				<-release
			}
			return handler(ctx, req)
		},
	})
	ctx := ctxT(t)
	type result struct {
		put *umbppb.BoolResponse
		ex  *umbppb.BatchBoolResponse
		err error
	}
	res := make(chan result, 2)
	go func() {
		r, err := h.c.Put(ctx, &umbppb.PutRequest{Key: "k", ClientId: "c", Size: 1})
		res <- result{put: r, err: err}
	}()
	go func() {
		r, err := h.c.BatchExists(ctx, &umbppb.BatchKeysRequest{Keys: []string{"a", "b"}})
		res <- result{ex: r, err: err}
	}()
	<-entered
	<-entered
	closed := make(chan error, 1)
	go func() { closed <- h.srv.Close() }()
	if !waitFor(5*time.Second, h.srv.ops.isClosing) {
		t.Fatal("Close did not begin")
	}
	close(release)
	for range 2 {
		r := <-res
		if r.err != nil {
			t.Fatalf("call in flight failed: %v", r.err)
		}
		if r.put != nil {
			wantFail(t, "put while shutting down", r.put, MsgShuttingDown)
		} else {
			wantBools(t, "batch exists while shutting down", r.ex.Ok, false, false)
		}
	}
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close hung")
	}
	if _, err := h.c.Ping(ctx, &umbppb.Empty{}, grpc.WaitForReady(false)); err == nil {
		t.Fatal("Ping answered after Close")
	}
}

// TestMemfdShrunkAfterRegistration: a client that truncates its memfd after
// registering makes the server's copies fault; they must fail the op, not
// crash the server.
func TestMemfdShrunkAfterRegistration(t *testing.T) {
	h := newHarness(t, Options{Capacity: 1 << 20})
	m := newMemfd(t, 16384)
	h.register(t, "c", m)
	fill(m.mem, 1)
	wantOK(t, "put before", h.put(t, "c", "before", m.base, 0, 16384))
	if err := unix.Ftruncate(m.fd, 0); err != nil {
		t.Fatal(err)
	}
	r := h.put(t, "c", "after", m.base, 0, 16384)
	if r.Ok || !strings.Contains(r.Error, "fault") {
		t.Fatalf("put from a truncated memfd = %v, want a fault", r)
	}
	if h.get(t, "c", "before", m.base, 0, 16384).Ok {
		t.Fatal("get into a truncated memfd succeeded")
	}
	if h.exists(t, "after") {
		t.Fatal("faulted put stored its key")
	}
	if st := h.srv.Stats(); st.BytesUsed != 16384 {
		t.Fatalf("faulted put leaked pool bytes: %+v", st)
	}
	if _, err := h.c.Ping(ctxT(t), &umbppb.Empty{}); err != nil {
		t.Fatal(err)
	}
}

// TestMemfdShrunkUnderParallelCopy: a batch large enough for the parallel
// host copy, from a memfd whose upper half was truncated, stores the
// objects of the lower half and fails the others without leaking pool
// bytes.
func TestMemfdShrunkUnderParallelCopy(t *testing.T) {
	const n, size = 8, 1 << 20
	h := newHarness(t, Options{Capacity: 64 << 20})
	m := newMemfd(t, n*size)
	h.register(t, "c", m)
	fill(m.mem, 1)
	if err := unix.Ftruncate(m.fd, n/2*size); err != nil {
		t.Fatal(err)
	}
	keys := make([]string, n)
	offs, sizes, bases := make([]uint64, n), make([]uint64, n), make([]uint64, n)
	for i := range keys {
		keys[i] = fmt.Sprint("obj", i)
		offs[i], sizes[i], bases[i] = uint64(i*size), size, m.base
	}
	got := h.batchPut(t, "c", keys, offs, sizes, bases)
	for i, ok := range got {
		if ok != (i < n/2) {
			t.Errorf("object %d stored %v, want %v (the memfd ends after object %d)", i, ok, i < n/2, n/2-1)
		}
	}
	if st := h.srv.Stats(); st.BytesUsed != n/2*size {
		t.Fatalf("faulted copies leaked pool bytes: %d used, want %d", st.BytesUsed, n/2*size)
	}
}

// TestConcurrentUse hammers one small pool from many goroutines: puts,
// gets (checking every byte), eviction, Clear, and region replacement and
// deregistration underneath. Run it with -race.
func TestConcurrentUse(t *testing.T) {
	const obj = 8192
	h := newHarness(t, Options{Capacity: 6 * obj})
	ctx := ctxT(t)
	const workers = 6
	var wg sync.WaitGroup
	errs := make(chan error, workers+1)
	for w := range workers {
		client := fmt.Sprint("w", w)
		src := newMemfd(t, obj)
		dst := newMemfd(t, obj)
		h.register(t, client, src)
		h.register(t, client, dst)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 60 {
				key := fmt.Sprint("key", i%12)
				seed := byte(i % 12)
				fill(src.mem, seed)
				if _, err := h.c.Put(ctx, &umbppb.PutRequest{Key: key, ClientId: client, Size: obj, RegionBase: src.base}); err != nil {
					errs <- err
					return
				}
				r, err := h.c.Get(ctx, &umbppb.GetRequest{Key: fmt.Sprint("key", (i+5)%12), ClientId: client, Size: obj, RegionBase: dst.base})
				if err != nil {
					errs <- err
					return
				}
				if r.Ok {
					want := pattern(obj, byte((i+5)%12))
					if string(dst.mem) != string(want) {
						errs <- fmt.Errorf("worker %s: wrong bytes for key%d", client, (i+5)%12)
						return
					}
				}
				if i%20 == 0 {
					if _, err := h.c.BatchExists(ctx, &umbppb.BatchKeysRequest{Keys: []string{"key1", "key2"}}); err != nil {
						errs <- err
						return
					}
				}
			}
		}()
	}
	// A client whose regions come and go while it transfers.
	churn := newMemfd(t, obj)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 30 {
			if err := h.handoff(t, "churn", churn, churn.base, obj); err != nil {
				errs <- err
				return
			}
			if _, err := h.c.Get(ctx, &umbppb.GetRequest{Key: "key3", ClientId: "churn", Size: obj, RegionBase: churn.base}); err != nil {
				errs <- err
				return
			}
			if i%3 == 0 {
				if _, err := h.c.DeregisterMemory(ctx, &umbppb.DeregisterMemoryRequest{ClientId: "churn"}); err != nil {
					errs <- err
					return
				}
			}
			if i%10 == 0 {
				if _, err := h.c.Clear(ctx, &umbppb.Empty{}); err != nil {
					errs <- err
					return
				}
			}
		}
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	st := h.srv.Stats()
	if st.BytesUsed > 6*obj || st.Objects > 6 {
		t.Fatalf("stats %+v", st)
	}
}
