package conn

// The conformance suite: the Conn against the Go server (internal/server)
// through every rule of docs/PROTOCOL.md, with real memfd regions.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/umbp-go/umbp-go/internal/errdefs"
	"github.com/umbp-go/umbp-go/internal/fdpass"
	"github.com/umbp-go/umbp-go/internal/rpc"
	"github.com/umbp-go/umbp-go/internal/server"
	"github.com/umbp-go/umbp-go/proto/umbppb"
)

func startServer(t testing.TB, opts server.Options) *server.Server {
	t.Helper()
	opts.Endpoint = "unix://" + filepath.Join(shortDir(t), "n.grpc.sock")
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	srv, err := server.New(opts)
	if err != nil {
		t.Fatalf("server.New: %v", err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	return srv
}

// region is a registered memfd region.
type region struct {
	fd   int
	mem  []byte
	base uint64
}

func (r region) seg(off, size int) Segment {
	return Segment{RegionBase: r.base, Offset: uint64(off), Size: uint64(size)}
}

func (r region) rng(off, size, objOff int) Range {
	return Range{RegionBase: r.base, Offset: uint64(off), Size: uint64(size), ObjectOffset: uint64(objOff)}
}

func hostRegion(t testing.TB, c *Conn, size int) region {
	t.Helper()
	fd, mem := memfd(t, size)
	if err := c.RegisterHost(context.Background(), fd, addr(mem), uint64(size)); err != nil {
		t.Fatalf("RegisterHost: %v", err)
	}
	return region{fd: fd, mem: mem, base: uint64(addr(mem))}
}

// pattern returns n bytes that depend on seed.
func pattern(seed, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(seed*131 + i*7 + i/251)
	}
	return b
}

// setup starts a v2 server and connects one client with one 1 MiB region.
func setup(t *testing.T) (*server.Server, *Conn, region) {
	t.Helper()
	srv := startServer(t, server.Options{})
	c := dial(t, srv.Endpoint())
	return srv, c, hostRegion(t, c, 1<<20)
}

// mustOK returns a check that ok is true and err nil, for a call's results.
func mustOK(t *testing.T, what string) func(ok bool, err error) {
	return func(ok bool, err error) {
		t.Helper()
		if !ok || err != nil {
			t.Fatalf("%s = %v, %v", what, ok, err)
		}
	}
}

func wantBools(t *testing.T, what string, got []bool, err error, want ...bool) {
	t.Helper()
	if err != nil || fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%s = %v, %v; want %v", what, got, err, want)
	}
}

func wantReason(t *testing.T, what string, err error, reason string) {
	t.Helper()
	var re *RefusedError
	if !errors.As(err, &re) || re.Reason != reason || !errors.Is(err, errdefs.ErrRefused) {
		t.Fatalf("%s: %v; want refusal %q", what, err, reason)
	}
}

func TestConformanceHostRegistration(t *testing.T) {
	srv, c, r := setup(t)
	ctx := context.Background()
	if caps := c.Capabilities(); !caps.Ready || !caps.RangedIO {
		t.Fatalf("v2 capabilities %+v", caps)
	}
	if st := srv.Stats(); st.Regions != 1 || st.Clients != 1 {
		t.Fatalf("stats %+v", st)
	}
	data := pattern(1, 4096)
	copy(r.mem[8192:], data)
	mustOK(t, "Put")(c.Put(ctx, "k", r.seg(8192, 4096)))
	mustOK(t, "Exists")(c.Exists(ctx, "k"))
	mustOK(t, "Get")(c.Get(ctx, "k", r.seg(0, 4096)))
	if !bytes.Equal(r.mem[:4096], data) {
		t.Fatal("Get wrote other bytes")
	}
	// A missing key: plain false, no reason.
	if ok, err := c.Exists(ctx, "missing"); ok || err != nil {
		t.Fatalf("Exists(missing) = %v, %v", ok, err)
	}
	if ok, err := c.Get(ctx, "missing", r.seg(0, 4096)); ok || err != nil {
		t.Fatalf("Get(missing) = %v, %v", ok, err)
	}
	// Get with another size: false, no text.
	if ok, err := c.Get(ctx, "k", r.seg(0, 4095)); ok || err != nil {
		t.Fatalf("Get with the wrong size = %v, %v", ok, err)
	}
	// Out of the region: refused with the protocol's text.
	_, err := c.Put(ctx, "k2", r.seg(1<<20-100, 200))
	wantReason(t, "Put out of range", err, server.MsgBadShmBuffer)
	_, err = c.Get(ctx, "k", Segment{RegionBase: r.base + 1<<30, Size: 4096})
	wantReason(t, "Get from an unknown region", err, server.MsgBadShmBuffer)
}

func TestConformanceLyingSize(t *testing.T) {
	srv := startServer(t, server.Options{})
	c := dial(t, srv.Endpoint())
	ctx := context.Background()
	fd, mem := memfd(t, 4096)
	// The Conn never sends a claim beyond the file's size.
	if err := c.RegisterHost(ctx, fd, addr(mem), 1<<20); !errors.Is(err, rpc.ErrInvalidArgument) {
		t.Fatalf("RegisterHost with a lying size = %v", err)
	}
	if st := srv.Stats(); st.FDHandoffs != 0 || st.Regions != 0 {
		t.Fatalf("a lying registration reached the server: %+v", st)
	}
	// Sent anyway, this server refuses it, and RegisterMemory finds nothing.
	reg := fdpass.Registration{ClientID: c.ClientID(), WorkerBase: uint64(addr(mem)), Size: 1 << 20}
	if err := fdpass.Send(ctx, c.FDSocketPath(), fd, reg, nil); !errors.Is(err, fdpass.ErrRejected) {
		t.Fatalf("raw handoff with a lying size = %v", err)
	}
	resp, err := c.Raw().RegisterMemory(ctx, &umbppb.RegisterMemoryRequest{ClientId: c.ClientID(), WorkerBase: reg.WorkerBase, Size: reg.Size})
	if err != nil || resp.GetOk() || resp.GetError() != server.MsgFDRegistrationNotFound {
		t.Fatalf("RegisterMemory after a rejected handoff = %v, %v", resp, err)
	}
}

func TestConformanceRegisterWithoutHandoff(t *testing.T) {
	srv := startServer(t, server.Options{})
	c := dial(t, srv.Endpoint())
	ctx := context.Background()
	fd, mem := memfd(t, 8192)
	resp, err := c.Raw().RegisterMemory(ctx, &umbppb.RegisterMemoryRequest{
		ClientId: c.ClientID(), WorkerBase: uint64(addr(mem)), Size: 8192, Kind: umbppb.MemoryKind_MEMORY_KIND_HOST_SHM,
	})
	if err != nil || resp.GetOk() || resp.GetError() != "fd handoff registration was not found" {
		t.Fatalf("RegisterMemory without a handoff = %v, %v", resp, err)
	}
	// A handoff of 4096 bytes does not cover a RegisterMemory of 8192.
	reg := fdpass.Registration{ClientID: c.ClientID(), WorkerBase: uint64(addr(mem)), Size: 4096}
	if err := fdpass.Send(ctx, c.FDSocketPath(), fd, reg, nil); err != nil {
		t.Fatal(err)
	}
	resp, err = c.Raw().RegisterMemory(ctx, &umbppb.RegisterMemoryRequest{ClientId: c.ClientID(), WorkerBase: reg.WorkerBase, Size: 8192})
	if err != nil || resp.GetOk() || resp.GetError() != server.MsgFDRegistrationNotFound {
		t.Fatalf("RegisterMemory larger than the handoff = %v, %v", resp, err)
	}
	// Another client id does not see this client's handoff.
	other := dial(t, srv.Endpoint())
	resp, err = other.Raw().RegisterMemory(ctx, &umbppb.RegisterMemoryRequest{ClientId: other.ClientID(), WorkerBase: reg.WorkerBase, Size: 4096})
	if err != nil || resp.GetOk() || resp.GetError() != server.MsgFDRegistrationNotFound {
		t.Fatalf("RegisterMemory of another client's handoff = %v, %v", resp, err)
	}
}

func TestConformanceMultiRegion(t *testing.T) {
	srv, c, a := setup(t)
	b := hostRegion(t, c, 64<<10)
	ctx := context.Background()
	if st := srv.Stats(); st.Regions != 2 || st.Clients != 1 {
		t.Fatalf("stats %+v", st)
	}
	copy(a.mem[100:], pattern(2, 1000))
	copy(b.mem[200:], pattern(3, 500))
	got, err := joined(c.BatchPut(ctx, []string{"ka", "kb"}, []Segment{a.seg(100, 1000), b.seg(200, 500)}))
	wantBools(t, "BatchPut across regions", got, err, true, true)
	// Read each into the other region.
	got, err = joined(c.BatchGet(ctx, []string{"ka", "kb"}, []Segment{b.seg(10_000, 1000), a.seg(50_000, 500)}))
	wantBools(t, "BatchGet across regions", got, err, true, true)
	if !bytes.Equal(b.mem[10_000:11_000], pattern(2, 1000)) || !bytes.Equal(a.mem[50_000:50_500], pattern(3, 500)) {
		t.Fatal("cross-region bytes differ")
	}
	// Offsets are relative to the region named: b's offset 64 KiB-1 + 2 is out of b.
	_, err = c.Put(ctx, "kc", b.seg(64<<10-1, 2))
	wantReason(t, "Put past the end of the second region", err, server.MsgBadShmBuffer)
	// Two clients: each sees only its own regions, both see every key.
	c2 := dial(t, srv.Endpoint())
	_, err = c2.Put(ctx, "kd", a.seg(0, 10))
	wantReason(t, "Put naming another client's region", err, server.MsgBadShmBuffer)
	r2 := hostRegion(t, c2, 4096)
	mustOK(t, "Get by another client")(c2.Get(ctx, "kb", r2.seg(0, 500)))
	if !bytes.Equal(r2.mem[:500], pattern(3, 500)) {
		t.Fatal("second client read other bytes")
	}
	if st := srv.Stats(); st.Regions != 3 || st.Clients != 2 {
		t.Fatalf("stats %+v", st)
	}
}

func TestConformanceReRegistration(t *testing.T) {
	srv, c, r := setup(t)
	ctx := context.Background()
	// The same region again: fine, still one region.
	if err := c.RegisterHost(ctx, r.fd, uintptr(r.base), uint64(len(r.mem))); err != nil {
		t.Fatalf("re-registration: %v", err)
	}
	if st := srv.Stats(); st.Regions != 1 {
		t.Fatalf("regions %d after re-registration", st.Regions)
	}
	// Another memfd under the same base replaces the server's mapping: a
	// put from that base now reads the new file.
	fd2, mem2 := memfd(t, 1<<20)
	copy(r.mem, pattern(4, 256))
	copy(mem2, pattern(5, 256))
	if err := c.RegisterHost(ctx, fd2, uintptr(r.base), 1<<20); err != nil {
		t.Fatalf("replacing registration: %v", err)
	}
	mustOK(t, "Put")(c.Put(ctx, "k", r.seg(0, 256)))
	mustOK(t, "Get")(c.Get(ctx, "k", r.seg(4096, 256)))
	if !bytes.Equal(mem2[4096:4096+256], pattern(5, 256)) {
		t.Fatal("the replaced mapping was not used")
	}
	if st := srv.Stats(); st.Regions != 1 {
		t.Fatalf("regions %d after replacement", st.Regions)
	}
}

func TestConformanceDeregistration(t *testing.T) {
	srv, c, r := setup(t)
	ctx := context.Background()
	copy(r.mem, pattern(6, 512))
	mustOK(t, "Put")(c.Put(ctx, "k", r.seg(0, 512)))
	if err := c.Deregister(ctx); err != nil {
		t.Fatalf("Deregister: %v", err)
	}
	if st := srv.Stats(); st.Regions != 0 || st.Objects != 1 {
		t.Fatalf("stats after Deregister %+v", st)
	}
	// The key stays; the memory is no longer usable.
	mustOK(t, "Exists after Deregister")(c.Exists(ctx, "k"))
	_, err := c.Get(ctx, "k", r.seg(0, 512))
	wantReason(t, "Get after Deregister", err, server.MsgBadShmBuffer)
	got, err := joined(c.BatchGet(ctx, []string{"k"}, []Segment{r.seg(0, 512)}))
	wantBools(t, "BatchGet after Deregister", got, err, false)
	// Unknown client ids deregister fine.
	other := dial(t, srv.Endpoint())
	if err := other.Deregister(ctx); err != nil {
		t.Fatalf("Deregister of an unknown client: %v", err)
	}
	// Registering again brings the data back.
	r = hostRegion(t, c, 4096)
	mustOK(t, "Get after re-registering")(c.Get(ctx, "k", r.seg(0, 512)))
	if !bytes.Equal(r.mem[:512], pattern(6, 512)) {
		t.Fatal("bytes differ after re-registering")
	}
}

func TestConformanceBatches(t *testing.T) {
	srv, c, r := setup(t)
	ctx := context.Background()
	const n, size = 16, 1000
	keys := make([]string, n)
	segs := make([]Segment, n)
	back := make([]Segment, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("b%02d", i)
		copy(r.mem[i*size:], pattern(10+i, size))
		segs[i] = r.seg(i*size, size)
		back[i] = r.seg(500_000+i*size, size)
	}
	got, err := joined(c.BatchPut(ctx, keys, segs))
	wantBools(t, "BatchPut", got, err, trues(n)...)
	got, err = joined(c.BatchGet(ctx, keys, back))
	wantBools(t, "BatchGet", got, err, trues(n)...)
	for i := range keys {
		if !bytes.Equal(r.mem[500_000+i*size:500_000+(i+1)*size], pattern(10+i, size)) {
			t.Fatalf("key %d: bytes differ", i)
		}
	}
	probe := []string{"b00", "b01", "nope", "b03"}
	got, err = joined(c.BatchExists(ctx, probe))
	wantBools(t, "BatchExists", got, err, true, true, false, true)
	if k, err := c.BatchExistsConsecutive(ctx, probe); k != 2 || err != nil {
		t.Fatalf("BatchExistsConsecutive = %d, %v", k, err)
	}
	if k, err := c.BatchExistsConsecutive(ctx, keys); k != n || err != nil {
		t.Fatalf("BatchExistsConsecutive(all) = %d, %v", k, err)
	}
	// A get of a missing key and one of the wrong size: only those false.
	got, err = joined(c.BatchGet(ctx, []string{"b00", "nope", "b02"}, []Segment{back[0], back[1], r.seg(0, size-1)}))
	wantBools(t, "BatchGet with misses", got, err, true, false, false)

	// Clear drops every object and keeps the registration.
	mustOK(t, "Clear")(c.Clear(ctx))
	got, err = joined(c.BatchExists(ctx, keys[:3]))
	wantBools(t, "BatchExists after Clear", got, err, false, false, false)
	mustOK(t, "Put after Clear")(c.Put(ctx, "again", r.seg(0, 10)))
	mustOK(t, "Flush")(c.Flush(ctx))
	if st := srv.Stats(); st.Objects != 1 || st.Regions != 1 {
		t.Fatalf("stats %+v", st)
	}
}

func trues(n int) []bool {
	b := make([]bool, n)
	for i := range b {
		b[i] = true
	}
	return b
}

func TestConformanceAllFalseBatches(t *testing.T) {
	srv, c, r := setup(t)
	ctx := context.Background()
	bad := map[string][]Segment{
		"out of range":   {r.seg(0, 10), r.seg(1<<20-5, 10)},
		"unknown region": {r.seg(0, 10), {RegionBase: r.base + 1<<30, Size: 10}},
	}
	for name, segs := range bad {
		got, err := joined(c.BatchPut(ctx, []string{"x1", "x2"}, segs))
		wantBools(t, "BatchPut "+name, got, err, false, false)
		got, err = joined(c.BatchExists(ctx, []string{"x1", "x2"}))
		wantBools(t, "nothing stored after "+name, got, err, false, false)
	}
	mustOK(t, "Put")(c.Put(ctx, "have", r.seg(0, 10)))
	got, err := joined(c.BatchGet(ctx, []string{"have", "have"}, []Segment{r.seg(0, 10), r.seg(1<<20, 10)}))
	wantBools(t, "BatchGet with one bad entry", got, err, false, false)
	// Mismatched array lengths, which the Conn never sends.
	resp, err := c.Raw().BatchPut(ctx, &umbppb.BatchDataRequest{
		Keys: []string{"y1", "y2"}, ClientId: c.ClientID(),
		ShmOffsets: []uint64{0, 10}, Sizes: []uint64{10}, RegionBases: []uint64{r.base, r.base},
	})
	if err != nil || fmt.Sprint(resp.GetOk()) != "[false false]" {
		t.Fatalf("mismatched BatchPut = %v, %v", resp, err)
	}
	// An unknown client: all false.
	other := dial(t, srv.Endpoint())
	got, err = joined(other.BatchPut(ctx, []string{"z1"}, []Segment{r.seg(0, 10)}))
	wantBools(t, "BatchPut of an unregistered client", got, err, false)
	if st := srv.Stats(); st.Objects != 1 {
		t.Fatalf("objects %d", st.Objects)
	}
}

func TestConformanceFirstWriterWins(t *testing.T) {
	_, c, r := setup(t)
	ctx := context.Background()
	copy(r.mem[0:], pattern(20, 100))
	copy(r.mem[1000:], pattern(21, 200))
	mustOK(t, "first Put")(c.Put(ctx, "k", r.seg(0, 100)))
	mustOK(t, "second Put (another size)")(c.Put(ctx, "k", r.seg(1000, 200)))
	got, err := joined(c.BatchPut(ctx, []string{"k"}, []Segment{r.seg(1000, 100)}))
	wantBools(t, "BatchPut of an existing key", got, err, true)
	if ok, err := c.Get(ctx, "k", r.seg(5000, 200)); ok || err != nil {
		t.Fatalf("Get with the second size = %v, %v", ok, err)
	}
	mustOK(t, "Get")(c.Get(ctx, "k", r.seg(5000, 100)))
	if !bytes.Equal(r.mem[5000:5100], pattern(20, 100)) {
		t.Fatal("the first value was not kept")
	}
	// The same key twice in one BatchPut keeps the later value.
	got, err = joined(c.BatchPut(ctx, []string{"d", "d"}, []Segment{r.seg(0, 100), r.seg(1000, 100)}))
	wantBools(t, "BatchPut of a repeated key", got, err, true, true)
	mustOK(t, "Get d")(c.Get(ctx, "d", r.seg(6000, 100)))
	if !bytes.Equal(r.mem[6000:6100], pattern(21, 100)) {
		t.Fatal("the repeated key did not keep the later value")
	}
}

func TestConformanceRanged(t *testing.T) {
	srv, c, a := setup(t)
	b := hostRegion(t, c, 64<<10)
	ctx := context.Background()
	obj := pattern(30, 3000)
	// The object is scattered: [0,1000) in a at 0, [1000,3000) in b at 100.
	copy(a.mem[0:], obj[:1000])
	copy(b.mem[100:], obj[1000:])
	good := Object{Key: "obj", Size: 3000, Ranges: []Range{a.rng(0, 1000, 0), b.rng(100, 2000, 1000)}}
	got, err := joined(c.BatchPutRanges(ctx, []Object{good}))
	wantBools(t, "BatchPutRanges", got, err, true)
	// Ranges in any order tile as well.
	rev := Object{Key: "rev", Size: 3000, Ranges: []Range{b.rng(100, 2000, 1000), a.rng(0, 1000, 0)}}
	got, err = joined(c.BatchPutRanges(ctx, []Object{rev}))
	wantBools(t, "BatchPutRanges in reverse order", got, err, true)

	// A ranged get may read any subset of the object, gathered anywhere.
	got, err = joined(c.BatchGetRanges(ctx, []Object{
		{Key: "obj", Ranges: []Range{a.rng(200_000, 3000, 0)}},
		{Key: "rev", Ranges: []Range{b.rng(10_000, 500, 2500), a.rng(300_000, 10, 999)}},
	}))
	wantBools(t, "BatchGetRanges", got, err, true, true)
	if !bytes.Equal(a.mem[200_000:203_000], obj) || !bytes.Equal(b.mem[10_000:10_500], obj[2500:]) ||
		!bytes.Equal(a.mem[300_000:300_010], obj[999:1009]) {
		t.Fatal("ranged get bytes differ")
	}
	// Contiguous ops see the ranged object.
	mustOK(t, "Get of a ranged object")(c.Get(ctx, "obj", a.seg(400_000, 3000)))
	if !bytes.Equal(a.mem[400_000:403_000], obj) {
		t.Fatal("contiguous get of a ranged object differs")
	}

	// Per-key false, through the Conn: the others succeed.
	perKey := map[string]Object{
		"gap":             {Size: 3000, Ranges: []Range{a.rng(0, 1000, 0), b.rng(100, 1000, 2000)}},
		"overlap":         {Size: 3000, Ranges: []Range{a.rng(0, 1500, 0), b.rng(100, 2000, 1000)}},
		"repeat":          {Size: 2000, Ranges: []Range{a.rng(0, 1000, 0), a.rng(0, 1000, 0)}},
		"short":           {Size: 3000, Ranges: []Range{a.rng(0, 1000, 0), b.rng(100, 1000, 1000)}},
		"past":            {Size: 1500, Ranges: []Range{a.rng(0, 1000, 0), b.rng(100, 1000, 1000)}},
		"not at 0":        {Size: 1000, Ranges: []Range{a.rng(0, 1000, 1)}},
		"past the object": {Size: 1000, Ranges: []Range{a.rng(0, 1000, 1000)}},
	}
	for name, o := range perKey {
		o.Key = "bad-" + name
		got, err := joined(c.BatchPutRanges(ctx, []Object{{Key: "ok-" + name, Size: 10, Ranges: []Range{a.rng(0, 10, 0)}}, o}))
		wantBools(t, "ranged put with "+name, got, err, true, false)
		got, err = joined(c.BatchExists(ctx, []string{"ok-" + name, o.Key}))
		wantBools(t, "stored after "+name, got, err, true, false)
	}
	// Per-key false that the Conn refuses locally, sent raw: a zero-size
	// range, object_size 0, no ranges.
	raw := func(put bool, req *umbppb.BatchRangeDataRequest) []bool {
		t.Helper()
		req.ClientId = c.ClientID()
		call := c.Raw().BatchGetRanges
		if put {
			call = c.Raw().BatchPutRanges
		}
		resp, err := call(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetOk()
	}
	for name, req := range map[string]*umbppb.BatchRangeDataRequest{
		"zero-size range": {Keys: []string{"r-ok1", "r-bad1"}, RangeCounts: []uint32{1, 2},
			ShmOffsets: []uint64{0, 0, 10}, RegionBases: []uint64{a.base, a.base, a.base}, Sizes: []uint64{10, 10, 0},
			ObjectOffsets: []uint64{0, 0, 10}, ObjectSizes: []uint64{10, 10}},
		"object size 0": {Keys: []string{"r-ok2", "r-bad2"}, RangeCounts: []uint32{1, 1},
			ShmOffsets: []uint64{0, 0}, RegionBases: []uint64{a.base, a.base}, Sizes: []uint64{10, 10},
			ObjectOffsets: []uint64{0, 0}, ObjectSizes: []uint64{10, 0}},
		"no ranges": {Keys: []string{"r-ok3", "r-bad3"}, RangeCounts: []uint32{1, 0},
			ShmOffsets: []uint64{0}, RegionBases: []uint64{a.base}, Sizes: []uint64{10},
			ObjectOffsets: []uint64{0}, ObjectSizes: []uint64{10, 10}},
	} {
		if got := raw(true, req); fmt.Sprint(got) != "[true false]" {
			t.Errorf("raw ranged put with %s = %v", name, got)
		}
	}
	for name, req := range map[string]*umbppb.BatchRangeDataRequest{
		"zero-size range": {Keys: []string{"obj", "obj"}, RangeCounts: []uint32{1, 1},
			ShmOffsets: []uint64{0, 0}, RegionBases: []uint64{a.base, a.base}, Sizes: []uint64{10, 0}, ObjectOffsets: []uint64{0, 0}},
		"no ranges": {Keys: []string{"obj", "obj"}, RangeCounts: []uint32{1, 0},
			ShmOffsets: []uint64{0}, RegionBases: []uint64{a.base}, Sizes: []uint64{10}, ObjectOffsets: []uint64{0}},
	} {
		if got := raw(false, req); fmt.Sprint(got) != "[true false]" {
			t.Errorf("raw ranged get with %s = %v", name, got)
		}
	}
	// Ranged get, per key false: past the object's end, a missing key.
	got, err = joined(c.BatchGetRanges(ctx, []Object{
		{Key: "obj", Ranges: []Range{a.rng(0, 10, 0)}},
		{Key: "obj", Ranges: []Range{a.rng(0, 10, 2995)}},
		{Key: "missing", Ranges: []Range{a.rng(0, 10, 0)}},
	}))
	wantBools(t, "ranged get per-key failures", got, err, true, false, false)

	// Whole batch false, through the Conn: a range outside registered memory
	// or naming an unknown region.
	for name, r := range map[string]Range{
		"outside":        a.rng(1<<20-5, 10, 0),
		"unknown region": {RegionBase: a.base + 1<<30, Size: 10},
	} {
		got, err := joined(c.BatchPutRanges(ctx, []Object{
			{Key: "w-ok", Size: 10, Ranges: []Range{a.rng(0, 10, 0)}},
			{Key: "w-bad", Size: 10, Ranges: []Range{r}},
		}))
		wantBools(t, "ranged put with a range "+name, got, err, false, false)
		got, err = joined(c.BatchGetRanges(ctx, []Object{
			{Key: "obj", Ranges: []Range{a.rng(0, 10, 0)}},
			{Key: "obj", Ranges: []Range{r}},
		}))
		wantBools(t, "ranged get with a range "+name, got, err, false, false)
	}
	// Whole batch false, raw: shapes the Conn never sends.
	base := func() *umbppb.BatchRangeDataRequest {
		return &umbppb.BatchRangeDataRequest{Keys: []string{"s1", "s2"}, RangeCounts: []uint32{1, 1},
			ShmOffsets: []uint64{0, 10}, RegionBases: []uint64{a.base, a.base}, Sizes: []uint64{10, 10},
			ObjectOffsets: []uint64{0, 0}, ObjectSizes: []uint64{10, 10}}
	}
	shapes := map[string]func(*umbppb.BatchRangeDataRequest){
		"counts not one per key":     func(r *umbppb.BatchRangeDataRequest) { r.RangeCounts = []uint32{2} },
		"counts not summing":         func(r *umbppb.BatchRangeDataRequest) { r.RangeCounts = []uint32{1, 2} },
		"shm_offsets length":         func(r *umbppb.BatchRangeDataRequest) { r.ShmOffsets = r.ShmOffsets[:1] },
		"sizes length":               func(r *umbppb.BatchRangeDataRequest) { r.Sizes = append(r.Sizes, 1) },
		"object_offsets length":      func(r *umbppb.BatchRangeDataRequest) { r.ObjectOffsets = nil },
		"no region_bases":            func(r *umbppb.BatchRangeDataRequest) { r.RegionBases = nil },
		"put without object_sizes":   func(r *umbppb.BatchRangeDataRequest) { r.ObjectSizes = r.ObjectSizes[:1] },
		"zero-size range outside":    func(r *umbppb.BatchRangeDataRequest) { r.ShmOffsets[1], r.Sizes[1] = 1<<21, 0 },
		"unknown client":             func(r *umbppb.BatchRangeDataRequest) {},
		"get with any object_sizes":  nil,
		"get with counts not summed": nil,
	}
	for name, mutate := range shapes {
		req := base()
		put := true
		switch name {
		case "get with any object_sizes":
			put, req.Keys = false, []string{"obj", "obj"}
			req.ObjectSizes = []uint64{3000}
		case "get with counts not summed":
			put, req.Keys, req.ObjectSizes = false, []string{"obj", "obj"}, nil
			req.RangeCounts = []uint32{1, 3}
		default:
			mutate(req)
		}
		req.ClientId = c.ClientID()
		if name == "unknown client" {
			req.ClientId = "nobody"
		}
		call := c.Raw().BatchGetRanges
		if put {
			call = c.Raw().BatchPutRanges
		}
		resp, err := call(ctx, req)
		if err != nil || fmt.Sprint(resp.GetOk()) != "[false false]" {
			t.Errorf("ranged call with %s = %v, %v", name, resp.GetOk(), err)
		}
	}
	if got, err := joined(c.BatchExists(ctx, []string{"s1", "s2", "w-ok", "w-bad"})); err != nil || fmt.Sprint(got) != "[false false false false]" {
		t.Fatalf("whole-batch failures stored something: %v, %v", got, err)
	}

	// Re-putting an existing key: valid ranges are ok and keep the first
	// value; non-tiling ranges are false and leave it intact.
	copy(a.mem[600_000:], pattern(31, 3000))
	got, err = joined(c.BatchPutRanges(ctx, []Object{{Key: "obj", Size: 3000, Ranges: []Range{a.rng(600_000, 3000, 0)}}}))
	wantBools(t, "ranged re-put", got, err, true)
	got, err = joined(c.BatchPutRanges(ctx, []Object{{Key: "obj", Size: 3000, Ranges: []Range{a.rng(600_000, 2000, 0)}}}))
	wantBools(t, "non-tiling ranged re-put", got, err, false)
	mustOK(t, "Get after re-puts")(c.Get(ctx, "obj", a.seg(700_000, 3000)))
	if !bytes.Equal(a.mem[700_000:703_000], obj) {
		t.Fatal("a re-put changed the stored object")
	}
	// The same new key twice in one ranged put: both false, nothing stored.
	got, err = joined(c.BatchPutRanges(ctx, []Object{
		{Key: "twice", Size: 10, Ranges: []Range{a.rng(0, 10, 0)}},
		{Key: "other", Size: 10, Ranges: []Range{a.rng(0, 10, 0)}},
		{Key: "twice", Size: 10, Ranges: []Range{a.rng(10, 10, 0)}},
	}))
	wantBools(t, "ranged put of a repeated new key", got, err, false, true, false)
	if ok, err := c.Exists(ctx, "twice"); ok || err != nil {
		t.Fatalf("repeated new key stored: %v, %v", ok, err)
	}
	_ = srv
}

func TestConformanceEviction(t *testing.T) {
	srv := startServer(t, server.Options{Capacity: 64 << 10})
	c := dial(t, srv.Endpoint())
	r := hostRegion(t, c, 1<<20)
	ctx := context.Background()
	const size = 16 << 10
	for i := range 8 {
		copy(r.mem[i*size:], pattern(40+i, size))
		mustOK(t, fmt.Sprintf("Put %d", i))(c.Put(ctx, fmt.Sprintf("e%d", i), r.seg(i*size, size)))
	}
	st := srv.Stats()
	if st.Evictions == 0 || st.BytesUsed > 64<<10 {
		t.Fatalf("no eviction: %+v", st)
	}
	// The oldest is gone (a Get fails), the newest is intact.
	if ok, err := c.Get(ctx, "e0", r.seg(512<<10, size)); ok || err != nil {
		t.Fatalf("Get of an evicted key = %v, %v", ok, err)
	}
	mustOK(t, "Get newest")(c.Get(ctx, "e7", r.seg(512<<10, size)))
	if !bytes.Equal(r.mem[512<<10:512<<10+size], pattern(47, size)) {
		t.Fatal("newest object differs")
	}
	// A Get refreshes a key: e4 outlives e5 after more puts.
	mustOK(t, "Get e4")(c.Get(ctx, "e4", r.seg(512<<10, size)))
	for i := 8; i < 10; i++ {
		mustOK(t, "Put")(c.Put(ctx, fmt.Sprintf("e%d", i), r.seg(0, size)))
	}
	if ok, _ := c.Get(ctx, "e4", r.seg(512<<10, size)); !ok {
		t.Fatal("a recently read key was evicted before older ones")
	}
	// An object larger than the tier is refused.
	if ok, _ := c.Put(ctx, "huge", r.seg(0, 128<<10)); ok {
		t.Fatal("an object larger than the tier was stored")
	}
	got, err := joined(c.BatchPut(ctx, []string{"huge2"}, []Segment{r.seg(0, 128<<10)}))
	wantBools(t, "BatchPut larger than the tier", got, err, false)
}

func TestConformanceV1Server(t *testing.T) {
	srv := startServer(t, server.Options{Version: 1})
	c := dial(t, srv.Endpoint())
	ctx := context.Background()
	if caps := c.Capabilities(); caps.RangedIO || !caps.Ready {
		t.Fatalf("v1 capabilities %+v", caps)
	}
	r := hostRegion(t, c, 64<<10)
	copy(r.mem, pattern(50, 100))
	mustOK(t, "v1 Put")(c.Put(ctx, "k", r.seg(0, 100)))
	mustOK(t, "v1 Get")(c.Get(ctx, "k", r.seg(1000, 100)))
	o := []Object{{Key: "k2", Size: 10, Ranges: []Range{r.rng(0, 10, 0)}}}
	got, err := joined(c.BatchPutRanges(ctx, o))
	if !errors.Is(err, rpc.ErrUnimplemented) || fmt.Sprint(got) != "[false]" {
		t.Fatalf("v1 BatchPutRanges = %v, %v", got, err)
	}
	got, err = joined(c.BatchGetRanges(ctx, o))
	if !errors.Is(err, rpc.ErrUnimplemented) || fmt.Sprint(got) != "[false]" {
		t.Fatalf("v1 BatchGetRanges = %v, %v", got, err)
	}
	// v1 ignores the GPU fields: a GPU registration looks like a host one
	// without its handoff.
	var h [IPCHandleSize]byte
	h[0] = 1
	err = c.RegisterGPU(ctx, GPURegion{Device: 0, Base: 0x7000_0000_0000, AllocBase: 0x7000_0000_0000, Size: 4096, Handle: h})
	wantReason(t, "v1 RegisterGPU", err, server.MsgFDRegistrationNotFound)
}

func TestConformanceGPURefusals(t *testing.T) {
	var h [IPCHandleSize]byte
	h[0] = 1
	gpu := GPURegion{Device: 0, Base: 0x7000_0000_1000, AllocBase: 0x7000_0000_0000, IPCOffset: 0x1000, Size: 4096, Handle: h}
	// SSD tier on: no ranged I/O, GPU registration refused with the reason.
	srv := startServer(t, server.Options{DisableRangedIO: true})
	c := dial(t, srv.Endpoint())
	if c.Capabilities().RangedIO {
		t.Fatal("ranged I/O with the SSD tier on")
	}
	err := c.RegisterGPU(context.Background(), gpu)
	wantReason(t, "RegisterGPU with SSD on", err, server.MsgGPUNeedsSSDDisabled)
	if !strings.HasPrefix(server.MsgGPUNeedsSSDDisabled, "GPU IPC registration requires SSD to be disabled") {
		t.Fatalf("reason %q", server.MsgGPUNeedsSSDDisabled)
	}
	// A server without a GPU runtime refuses with its reason.
	srv2 := startServer(t, server.Options{})
	c2 := dial(t, srv2.Endpoint())
	var re *RefusedError
	if err := c2.RegisterGPU(context.Background(), gpu); !errors.As(err, &re) || re.Reason == "" {
		t.Fatalf("RegisterGPU without a GPU runtime = %v", err)
	}
	// Invalid payloads the Conn never sends are refused with a reason.
	for name, req := range map[string]*umbppb.RegisterMemoryRequest{
		"empty client id": {WorkerBase: 1, Size: 1, AllocBase: 1, IpcHandle: h[:]},
		"handle length":   {ClientId: c2.ClientID(), WorkerBase: 1, Size: 1, AllocBase: 1, IpcHandle: h[:63]},
		"size 0":          {ClientId: c2.ClientID(), WorkerBase: 1, AllocBase: 1, IpcHandle: h[:]},
	} {
		req.Kind = umbppb.MemoryKind_MEMORY_KIND_GPU_IPC
		resp, err := c2.Raw().RegisterMemory(context.Background(), req)
		if err != nil || resp.GetOk() || resp.GetError() == "" {
			t.Errorf("GPU registration with %s = %v, %v", name, resp, err)
		}
	}
}

func TestConformanceExternalKv(t *testing.T) {
	srv := startServer(t, server.Options{})
	c := dial(t, srv.Endpoint())
	ctx := context.Background()
	mustOK(t, "Report")(c.ReportExternalKvBlocks(ctx, []string{"h1", "h2"}, umbppb.TierType_TIER_DRAM))
	mustOK(t, "Revoke")(c.RevokeExternalKvBlocks(ctx, []string{"h1"}, umbppb.TierType_TIER_DRAM))
	mustOK(t, "RevokeAll")(c.RevokeAllExternalKvBlocksAtTier(ctx, umbppb.TierType_TIER_DRAM))
	if m, err := c.MatchExternalKv(ctx, []string{"h1", "h2"}, true); err != nil || len(m) != 0 {
		t.Fatalf("Match on a local backend = %v, %v", m, err)
	}
	if _, err := c.GetExternalKvHitCounts(ctx, []string{"h1"}); err != nil {
		t.Fatalf("GetExternalKvHitCounts: %v", err)
	}
}

// TestConformanceSplitBatches runs split batches end to end, with a lowered
// limit, and one batch beyond the real 64 MiB limit.
func TestConformanceSplitBatches(t *testing.T) {
	_, c, r := setup(t)
	ctx := context.Background()
	func() {
		saved := maxRequestBytes
		maxRequestBytes = 1024
		defer func() { maxRequestBytes = saved }()
		n := 200
		keys := keysN(n)
		segs := make([]Segment, n)
		objs := make([]Object, n)
		for i := range keys {
			copy(r.mem[i*1000:], pattern(60+i, 1000))
			segs[i] = r.seg(i*1000, 1000)
			objs[i] = Object{Key: "r" + keys[i], Size: 1000, Ranges: []Range{r.rng(i*1000, 600, 0), r.rng(i*1000+600, 400, 600)}}
		}
		got, err := joined(c.BatchPut(ctx, keys, segs))
		wantBools(t, "split BatchPut", got, err, trues(n)...)
		got, err = joined(c.BatchPutRanges(ctx, objs))
		wantBools(t, "split BatchPutRanges", got, err, trues(n)...)
		for i := range objs {
			objs[i].Ranges = []Range{r.rng(500_000+i*1000, 1000, 0)}
		}
		got, err = joined(c.BatchGetRanges(ctx, objs))
		wantBools(t, "split BatchGetRanges", got, err, trues(n)...)
		for i := range keys {
			if !bytes.Equal(r.mem[500_000+i*1000:500_000+(i+1)*1000], pattern(60+i, 1000)) {
				t.Fatalf("object %d differs", i)
			}
		}
	}()
	if testing.Short() {
		return
	}
	// 1100 keys of 64 KiB: about 70 MiB of request, beyond one message.
	pad := strings.Repeat("x", 64<<10-8)
	keys := make([]string, 1100)
	for i := range keys {
		keys[i] = fmt.Sprintf("%08d", i) + pad
	}
	got, err := joined(c.BatchExists(ctx, keys))
	if err != nil || len(got) != len(keys) {
		t.Fatalf("BatchExists over 64 MiB = %d results, %v", len(got), err)
	}
	for i, ok := range got {
		if ok {
			t.Fatalf("key %d present", i)
		}
	}
}
