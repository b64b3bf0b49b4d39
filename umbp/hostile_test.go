package umbp_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/umbp-go/umbp-go/umbp"
)

// A hostile server: it answers Ping ready, then answers everything else
// with what a script says — replies of the wrong length, counts beyond the
// keys, refusals with strange reasons, gRPC errors of every code, garbage
// fd-handoff statuses. Every such reply must come out of the public API as
// misses and failed keys, within the configured bounds, never as a panic or
// a hang.

// How a call answers: 0 answers normally, 1 to 16 fail with that gRPC code,
// and the rest are stranger still.
const (
	howOK          = 0
	howNil         = 17 // the handler returns (nil, nil)
	howUnknownCode = 18 // a code gRPC does not define
	howOddMessage  = 19 // codes.Unknown with a message that is not text
	howCount       = 20
)

// hostileErr is what a handler answering how returns, and whether it
// returns no message at all.
func hostileErr(how uint8) (err error, nilReply bool) {
	switch {
	case how == howOK:
		return nil, false
	case how <= 16:
		return status.Errorf(codes.Code(how), "hostile: %s", codes.Code(how)), false
	case how == howNil:
		return nil, true
	case how == howUnknownCode:
		return status.Error(codes.Code(99), "hostile: code 99"), false
	default:
		return status.Error(codes.Unknown, "hostile:\xff\xfe\n%00\x00 \u202e"), false
	}
}

// hostileEnv is a hostile server with a scheduler handle and a worker
// handle attached once (the worker's memory registered while the script
// was good), and memory for workers attached afresh under each script.
type hostileEnv struct {
	srv     *hostileServer
	stopSrv func()
	rt      *umbp.StandaloneRuntime
	sched   *umbp.SchedulerHandle
	w       *umbp.WorkerHandle
	wbuf    *umbp.HostBuffer
	wplans  []umbp.BlockTransferPlan
	scratch *umbp.HostBuffer // registered by each fresh worker

	closeOnce sync.Once
}

func newHostileEnv(tb testing.TB) *hostileEnv {
	tb.Helper()
	srv, endpoint, stop := startHostileServer(tb)
	e := &hostileEnv{srv: srv, stopSrv: stop}
	tb.Cleanup(func() { e.close(tb) })
	e.rt = newRuntime(tb, umbp.Config{
		Endpoint:       endpoint,
		NumWorkers:     2,
		Timeout:        hostileTimeout,
		LookupTimeout:  hostileLookupTimeout,
		StartupTimeout: 5 * time.Second,
		Logger:         testLogger(tb),
	})
	ctx := context.Background()
	var err error
	if e.sched, err = e.rt.NewSchedulerHandle(ctx); err != nil {
		tb.Fatal(err)
	}
	if e.wbuf, err = umbp.NewHostBuffer(2 * hostileBlocks * 512); err != nil {
		tb.Fatal(err)
	}
	layout := hostileLayout(e.wbuf, false)
	if e.w, err = e.rt.NewWorkerHandle(ctx, layout); err != nil {
		tb.Fatal(err)
	}
	if err := e.w.RegisterBuffers(ctx, map[string]umbp.Buffer{"kv": e.wbuf.Buffer()}); err != nil {
		tb.Fatal(err)
	}
	if e.wplans, err = hostilePlans(layout); err != nil {
		tb.Fatal(err)
	}
	if e.scratch, err = umbp.NewHostBuffer(2 * hostileBlocks * 512); err != nil {
		tb.Fatal(err)
	}
	return e
}

// close closes the handles under a good script, then the server. Nothing
// may be abandoned: no hostile reply is slow.
func (e *hostileEnv) close(tb testing.TB) {
	e.closeOnce.Do(func() {
		e.srv.set(goodScript)
		if e.sched != nil {
			if err := e.sched.Close(); err != nil {
				tb.Errorf("close scheduler: %v", err)
			}
		}
		if e.w != nil {
			if err := e.w.Close(); err != nil {
				tb.Errorf("close worker: %v", err)
			}
		}
		for _, b := range []*umbp.HostBuffer{e.wbuf, e.scratch} {
			if b != nil {
				if err := b.Close(); err != nil {
					tb.Errorf("close host buffer: %v", err)
				}
			}
		}
		e.stopSrv()
	})
}

// hostileLayout lays hostileBlocks blocks of 1 KiB objects over buf: two
// layers of 512-byte halves, or one layer of whole blocks.
func hostileLayout(buf *umbp.HostBuffer, oneLayer bool) *umbp.KVLayoutDescriptor {
	base := buf.Buffer().Ptr
	if oneLayer {
		return &umbp.KVLayoutDescriptor{Regions: []umbp.KVRegion{
			{LayerName: "kv", BaseAddress: base, NumBlocks: hostileBlocks, BlockBytes: 1024, Stride: 1024},
		}}
	}
	return &umbp.KVLayoutDescriptor{Regions: []umbp.KVRegion{
		{LayerName: "k", BaseAddress: base, NumBlocks: hostileBlocks, BlockBytes: 512, Stride: 512},
		{LayerName: "v", BaseAddress: base + hostileBlocks*512, NumBlocks: hostileBlocks, BlockBytes: 512, Stride: 512},
	}}
}

func hostilePlans(layout *umbp.KVLayoutDescriptor) ([]umbp.BlockTransferPlan, error) {
	planner, err := umbp.NewLayoutPlanner(layout)
	if err != nil {
		return nil, err
	}
	plans := make([]umbp.BlockTransferPlan, hostileBlocks)
	for i := range plans {
		if plans[i], err = planner.PlanForBlock(hostileKeys[i], 0, i); err != nil {
			return nil, err
		}
	}
	return plans, nil
}

// within fails t when a call took longer than bound and the margin.
func within(t *testing.T, what string, start time.Time, bound time.Duration) {
	t.Helper()
	if d := time.Since(start); d > bound+hostileMargin {
		t.Errorf("%s took %v, bound %v", what, d, bound)
	}
}

// check runs one script through the public API.
func (e *hostileEnv) check(t *testing.T, sc hostileScript) {
	t.Helper()
	e.srv.set(sc)
	defer e.srv.set(goodScript)
	for _, h := range []interface{ State() umbp.HandleState }{e.sched, e.w} {
		if st := h.State(); st != umbp.StateConnected {
			t.Fatalf("a handle is %s: hostile replies over a healthy transport must not make it reattach", st)
		}
	}
	if sc.parts == partsAll || sc.parts == partsLookups {
		e.checkLookups(t, sc)
	}
	if sc.parts == partsAll || sc.parts == partsTransfers {
		e.checkTransfers(t, e.w, e.wplans, sc, true)
	}
	if sc.parts == partsAll || sc.parts == partsFresh {
		e.checkFreshWorker(t, sc)
	}
	for _, h := range []interface{ State() umbp.HandleState }{e.sched, e.w} {
		if st := h.State(); st != umbp.StateConnected {
			t.Errorf("a handle is %s: hostile replies over a healthy transport must not make it reattach", st)
		}
	}
}

func (e *hostileEnv) checkLookups(t *testing.T, sc hostileScript) {
	t.Helper()
	ctx := context.Background()
	keys := hostileKeys
	n := len(keys)
	timeouts := func() uint64 { return e.sched.Stats().Lookups.Timeouts }

	before := timeouts()
	start := time.Now()
	got := e.sched.Lookup(ctx, keys)
	within(t, "Lookup", start, hostileLookupTimeout)
	want := make([]bool, n)
	if sc.exists.valid() {
		for i := range want {
			want[i] = sc.exists.bit(i)
		}
	}
	// A call that overran LookupTimeout on a busy machine answers misses.
	late := timeouts() > before
	if !slices.Equal(got, want) && !(late && allEqual(got, false) && len(got) == n) {
		t.Errorf("Lookup: got %v, want %v (reply %+v)", got, want, sc.exists)
	}

	before = timeouts()
	start = time.Now()
	prefix := e.sched.LookupPrefix(ctx, keys)
	within(t, "LookupPrefix", start, hostileLookupTimeout)
	wantPrefix := 0
	if sc.count.how == howOK {
		if c := sc.count.value(n); c <= uint64(n) {
			wantPrefix = int(c)
		}
	}
	if prefix != wantPrefix && !(timeouts() > before && prefix == 0) {
		t.Errorf("LookupPrefix: got %d, want %d (reply %+v)", prefix, wantPrefix, sc.count)
	}

	before = timeouts()
	start = time.Now()
	cleared := e.sched.Clear(ctx) == nil
	within(t, "Clear", start, hostileLookupTimeout)
	if cleared != sc.clear.yes() && !(timeouts() > before && !cleared) {
		t.Errorf("Clear: got %v, want %v (reply %+v)", cleared, sc.clear.yes(), sc.clear)
	}
}

// checkTransfers stores then loads plans through w and checks each key's
// outcome against the script. registered says whether w's memory (and, on
// the staging path, its staging buffer) is registered; with exact false
// the outcome of each key is not predicted, only its form.
func (e *hostileEnv) checkTransfers(t *testing.T, w *umbp.WorkerHandle, plans []umbp.BlockTransferPlan, sc hostileScript, registered bool) {
	t.Helper()
	n := len(plans)
	// A store keeps a key that its batch refused if the one-key retry
	// (whose reply is bit 0) succeeds. On a server without ranged I/O the
	// retry follows a Flush, and none comes when the Flush finds the server
	// unavailable (one with ranged I/O has no SSD tier to flush, and is not
	// asked). No store waits for a Flush otherwise.
	ranged := w.Stats().Capabilities.RangedIO // as the handle attached
	retried := ranged || sc.flush.how != uint8(codes.Unavailable)
	putOK := func(i int) bool {
		return registered && sc.put.valid() && (sc.put.bit(i) || (retried && sc.put.bit(0)))
	}
	getOK := func(i int) bool { return registered && sc.get.valid() && sc.get.bit(i) }

	start := time.Now()
	job := hostileSubmit(t, w, plans, "store", sc.bulk)
	within(t, "Store", start, 0)
	e.settle(t, w, job, "store", n, registered, putOK)

	start = time.Now()
	job = hostileSubmit(t, w, plans, "load", sc.bulk)
	within(t, "Load", start, 0)
	e.settle(t, w, job, "load", n, registered, getOK)
}

// hostileSubmit stores or loads plans, on the bulk path when bulk.
func hostileSubmit(t *testing.T, w *umbp.WorkerHandle, plans []umbp.BlockTransferPlan, what string, bulk bool) *umbp.TransferJob {
	t.Helper()
	switch {
	case !bulk && what == "store":
		return w.Store(plans)
	case !bulk:
		return w.Load(plans)
	}
	bare := make([]umbp.Block, len(plans))
	for i, p := range plans {
		bare[i] = umbp.Block{Key: p.Key, BlockID: p.BlockID}
	}
	if what == "store" {
		return w.StoreBlocks(bare)
	}
	return w.LoadBlocks(bare)
}

// settle waits for job and checks its outcome; want predicts each key.
func (e *hostileEnv) settle(t *testing.T, w *umbp.WorkerHandle, job *umbp.TransferJob, what string, n int, registered bool, want func(int) bool) {
	t.Helper()
	start := time.Now()
	err := w.Wait(context.Background(), job)
	within(t, what+" Wait", start, hostileTimeout)
	if errors.Is(err, umbp.ErrBuffersInUse) {
		// Every hostile reply is immediate: nothing may be left blocked.
		t.Fatalf("%s: Wait: %v", what, err)
	}
	select {
	case <-job.Done():
	default:
		t.Fatalf("%s: Wait returned %v but the job has not ended (%s)", what, err, job.Status())
	}
	if (err == nil) != (job.Status() == umbp.JobCompleted) || (err != nil && err.Error() != job.Err().Error()) {
		t.Fatalf("%s: Wait = %v for a %s job with error %v", what, err, job.Status(), job.Err())
	}
	if !w.Poll(job) {
		t.Errorf("%s: Poll says an ended job has not ended", what)
	}
	st := job.Status()
	if st != umbp.JobCompleted && st != umbp.JobFailed {
		t.Fatalf("%s: job ended %s: %s", what, st, job.Err())
	}
	if c, f := len(job.CompletedKeys()), len(job.FailedKeys()); c+f != n {
		t.Fatalf("%s: %d keys completed and %d failed, of %d", what, c, f, n)
	}
	for i := range n {
		keyErr := job.KeyErr(i)
		if !registered {
			if !errors.Is(keyErr, umbp.ErrNotAttempted) {
				t.Errorf("%s of unregistered memory: key %d: %v, want ErrNotAttempted", what, i, keyErr)
			}
			continue
		}
		if keyErr != nil && !matchesKeySentinel(keyErr) {
			t.Errorf("%s: key %d: %v matches none of the package's sentinels", what, i, keyErr)
		}
		if want == nil {
			continue
		}
		if ok := keyErr == nil; ok != want(i) {
			t.Errorf("%s: key %d ok=%v, want %v (%s %v)", what, i, ok, want(i), st, keyErr)
		}
	}
	if (st == umbp.JobFailed) != (len(job.FailedKeys()) > 0) || (st == umbp.JobFailed) != (job.Err() != nil) {
		t.Errorf("%s: status %s with failed keys %v and error %v", what, st, job.FailedKeys(), job.Err())
	}
}

// matchesKeySentinel reports whether a key's error matches one of the
// sentinels of the package doc's table, as the doc promises.
func matchesKeySentinel(err error) bool {
	for _, s := range []error{umbp.ErrNotAttempted, umbp.ErrNotInPool, umbp.ErrRefused, umbp.ErrUnavailable,
		umbp.ErrCancelled, umbp.ErrBuffersInUse, umbp.ErrNotSupported, umbp.ErrUntrustedServer, umbp.ErrClosed} {
		if errors.Is(err, s) {
			return true
		}
	}
	return false
}

// checkFreshWorker attaches a worker under the script (Ping decides ranged
// I/O), registers memory through the hostile handoff and RegisterMemory,
// transfers, and closes.
func (e *hostileEnv) checkFreshWorker(t *testing.T, sc hostileScript) {
	t.Helper()
	ctx := context.Background()
	layout := hostileLayout(e.scratch, sc.oneLayer)
	start := time.Now()
	w, err := e.rt.NewWorkerHandle(ctx, layout)
	within(t, "NewWorkerHandle", start, 5*time.Second)
	if err != nil {
		t.Fatalf("NewWorkerHandle: %v", err)
	}
	defer func() {
		start := time.Now()
		if err := w.Close(); err != nil {
			t.Errorf("close fresh worker: %v", err)
		}
		within(t, "Close", start, 2*hostileTimeout)
	}()
	if got := w.Stats().Capabilities.RangedIO; got == sc.plain {
		t.Errorf("ranged I/O %v after a Ping that said %v", got, !sc.plain)
	}
	start = time.Now()
	err = w.RegisterBuffers(ctx, map[string]umbp.Buffer{"scratch": e.scratch.Buffer()})
	within(t, "RegisterBuffers", start, hostileTimeout)
	wantReg := sc.fd.accepts() && sc.register.yes()
	// A status written before the message was read may or may not reach
	// the client: the kernel resets a socket closed with unread data.
	if sc.fd.mode != fdUnread && (err == nil) != wantReg {
		t.Errorf("RegisterBuffers: %v, want success %v (handoff %+v, RegisterMemory %+v)", err, wantReg, sc.fd, sc.register)
	}
	if err != nil {
		t.Logf("RegisterBuffers under handoff %+v, RegisterMemory %+v: %v", sc.fd, sc.register, err)
	}
	if err != nil && !strings.Contains(err.Error(), "scratch") {
		t.Errorf("RegisterBuffers error does not name the buffer: %v", err)
	}
	plans, perr := hostilePlans(layout)
	if perr != nil {
		t.Fatal(perr)
	}
	registered := err == nil
	predict := true
	if !sc.oneLayer && sc.plain && sc.fd.mode == fdUnread {
		// Multi-range plans on a server without ranged I/O go through a
		// staging buffer whose own registration is just as uncertain.
		predict = false
	}
	if predict {
		e.checkTransfers(t, w, plans, sc, registered)
		return
	}
	for _, what := range []string{"store", "load"} {
		start := time.Now()
		job := hostileSubmit(t, w, plans, what, sc.bulk)
		within(t, what, start, 0)
		e.settle(t, w, job, what, len(plans), registered, nil)
	}
}

// hostileCases are named scripts: the seeds of the fuzz target and the
// cases of TestHostileServer.
func hostileCases() []struct {
	name string
	sc   hostileScript
} {
	type c = struct {
		name string
		sc   hostileScript
	}
	with := func(f func(*hostileScript)) hostileScript {
		s := goodScript
		f(&s)
		return s
	}
	cases := []c{
		{"good", goodScript},
		{"good plain", with(func(s *hostileScript) { s.plain = true })},
		{"good plain one layer", with(func(s *hostileScript) { s.plain, s.oneLayer = true, true })},
		{"good bulk", with(func(s *hostileScript) { s.bulk = true })},
		{"good plain bulk", with(func(s *hostileScript) { s.plain, s.bulk = true, true })},
		{"bulk get longer", with(func(s *hostileScript) { s.bulk, s.get.delta, s.get.bits = true, 2, 0b1001 })},
		{"hits", with(func(s *hostileScript) {
			s.exists.bits = 0b10110
			s.count.count = 3
			s.get.bits = 0b0101
			s.put.bits = 0b1110
		})},
		{"exists shorter", with(func(s *hostileScript) { s.exists = hostileBatch{delta: -1, bits: 0xff} })},
		{"exists longer", with(func(s *hostileScript) { s.exists = hostileBatch{delta: 3, bits: 0xff} })},
		{"exists far longer", with(func(s *hostileScript) { s.exists = hostileBatch{delta: 127, bits: 0xff} })},
		{"exists empty", with(func(s *hostileScript) { s.exists = hostileBatch{delta: -128, bits: 0xff} })},
		{"count keys+1", with(func(s *hostileScript) { s.count = hostileCount{relative: true, count: 1} })},
		{"count 2^64-1", with(func(s *hostileScript) { s.count = hostileCount{count: math.MaxUint64} })},
		{"count 2^63", with(func(s *hostileScript) { s.count = hostileCount{count: 1 << 63} })},
		{"count 2^31", with(func(s *hostileScript) { s.count = hostileCount{count: 1 << 31} })},
		{"count keys-1 wraps", with(func(s *hostileScript) { s.count = hostileCount{relative: true, count: math.MaxUint64} })},
		{"put shorter", with(func(s *hostileScript) { s.put.delta = -1 })},
		{"put longer", with(func(s *hostileScript) { s.put.delta = 5 })},
		{"put empty", with(func(s *hostileScript) { s.put.delta = -128 })},
		{"put half", with(func(s *hostileScript) { s.put.bits = 0b1010 })},
		{"get shorter", with(func(s *hostileScript) { s.get.delta = -2 })},
		{"get longer", with(func(s *hostileScript) { s.get.delta = 1 })},
		{"get empty", with(func(s *hostileScript) { s.get.delta = -128 })},
		{"plain put shorter get longer", with(func(s *hostileScript) { s.plain, s.put.delta, s.get.delta = true, -1, 1 })},
		{"plain one layer put empty", with(func(s *hostileScript) { s.plain, s.oneLayer, s.put.delta = true, true, -128 })},
		{"refusals", with(func(s *hostileScript) {
			s.clear = hostileBool{msg: "pool on fire"}
			s.flush = hostileBool{msg: "\x00\x01\x02 flush?"}
			s.register = hostileBool{msg: strings.Repeat("é", 20)}
		})},
		{"refusals not UTF-8", with(func(s *hostileScript) {
			s.clear = hostileBool{msg: "\xff\xfe"}
			s.flush = hostileBool{ok: true, msg: "\xc3\x28"}
			s.register = hostileBool{ok: true, msg: "\xed\xa0\x80"}
		})},
		{"ok with an error", with(func(s *hostileScript) {
			s.clear = hostileBool{ok: true, msg: "but also no"}
			s.register = hostileBool{ok: true, msg: "registered, sort of"}
		})},
		{"plain flush refused", with(func(s *hostileScript) { s.plain, s.flush = true, hostileBool{msg: "no"} })},
		{"fd status 1", with(func(s *hostileScript) { s.fd = hostileFD{status: 1} })},
		{"fd status 7", with(func(s *hostileScript) { s.fd = hostileFD{status: 7} })},
		{"fd status -1", with(func(s *hostileScript) { s.fd = hostileFD{status: math.MaxUint32} })},
		{"fd status 0x7fffffff", with(func(s *hostileScript) { s.fd = hostileFD{status: 0x7fffffff} })},
		{"fd short", with(func(s *hostileScript) { s.fd = hostileFD{mode: fdShort} })},
		{"fd nothing", with(func(s *hostileScript) { s.fd = hostileFD{mode: fdSilent} })},
		{"fd hang-up", with(func(s *hostileScript) { s.fd = hostileFD{mode: fdHangUp} })},
		{"fd long", with(func(s *hostileScript) { s.fd = hostileFD{mode: fdLong} })},
		{"fd unread", with(func(s *hostileScript) { s.fd = hostileFD{mode: fdUnread} })},
		{"plain fd status 7", with(func(s *hostileScript) { s.plain, s.fd = true, hostileFD{status: 7} })},
		{"plain fd short", with(func(s *hostileScript) { s.plain, s.fd = true, hostileFD{mode: fdShort} })},
		{"plain fd unread", with(func(s *hostileScript) { s.plain, s.fd = true, hostileFD{mode: fdUnread} })},
		{"register refused plain", with(func(s *hostileScript) { s.plain, s.register = true, hostileBool{} })},
	}
	// Every way a call can fail, for every call at once.
	for how := uint8(1); how < howCount; how++ {
		for _, plain := range []bool{false, true} {
			name := fmt.Sprintf("how %d", how)
			if how <= 16 {
				name = "code " + codes.Code(how).String()
			}
			if plain {
				name += " plain"
			}
			cases = append(cases, c{name, hostileScript{
				plain:      plain,
				exists:     hostileBatch{how: how, bits: 0xff},
				count:      hostileCount{how: how, count: 2},
				clear:      hostileBool{how: how, ok: true},
				put:        hostileBatch{how: how, bits: 0xff},
				get:        hostileBatch{how: how, bits: 0xff},
				flush:      hostileBool{how: how, ok: true},
				register:   hostileBool{how: how, ok: true},
				deregister: how,
			}})
		}
	}
	return cases
}

// TestHostileServer runs every named hostile script through the public
// API, then checks that nothing leaked.
func TestHostileServer(t *testing.T) {
	for _, c := range hostileCases() {
		if got := decodeHostile(encodeHostile(c.sc)); got != c.sc {
			t.Fatalf("%s: script does not survive encoding: %+v, got %+v", c.name, c.sc, got)
		}
	}
	fds0 := openFDs(t)
	e := newHostileEnv(t)
	for _, c := range hostileCases() {
		t.Run(c.name, func(t *testing.T) { e.check(t, c.sc) })
	}
	e.close(t)
	// Every memfd (staging buffers included) and socket was closed.
	if fds := openFDs(t); fds > fds0+2 {
		t.Errorf("%d open descriptors after the hostile server, %d before", fds, fds0)
	}
}

func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skipf("cannot count descriptors: %v", err)
	}
	return len(ents)
}

// FuzzHostileServer lets the input write the hostile server's replies,
// and pick the checks that run under them (all, or one kind of call: bits
// 3 and 4 of the first byte). The server and the long-lived handles start
// once per process, and a refused store is retried without the pauses a
// real server gets (what a retry does is the same; only the time goes), so
// that it tries a few thousand inputs a second.
func FuzzHostileServer(f *testing.F) {
	for _, c := range hostileCases() {
		f.Add(encodeHostile(c.sc))
		for parts := uint8(partsLookups); parts <= partsFresh; parts++ {
			sc := c.sc
			sc.parts = parts
			f.Add(encodeHostile(sc))
		}
	}
	f.Add([]byte{})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Cleanup(umbp.SetStoreRetryBackoff([]time.Duration{0, 0}))
	e := newHostileEnv(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		e.check(t, decodeHostile(data))
	})
}
