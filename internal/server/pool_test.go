package server

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
)

// TestPoolReaderKeepsEvictedBytes: an object evicted (or cleared) while a
// reader holds it keeps its extent until the reader releases it.
func TestPoolReaderKeepsEvictedBytes(t *testing.T) {
	p, err := newPool(8192, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	put := func(key string, size uint64, seed byte) *object {
		t.Helper()
		o, err := p.reserve(size, 0)
		if err != nil {
			t.Fatal(err)
		}
		fill(p.view(o, 0, size), seed)
		if !p.publish(key, o) {
			t.Fatal("publish refused")
		}
		return o
	}
	put("a", 4096, 1)
	put("b", 4096, 2)
	held := p.acquire("a") // a is now most recent; b least
	if held == nil {
		t.Fatal("acquire a")
	}
	// Needs all 8 KiB: evicts b, then a (held: its bytes stay reserved), and
	// still cannot fit.
	if _, err := p.reserve(8192, 0); err == nil {
		t.Fatal("reserve reused bytes a reader holds")
	}
	if p.contains("a") || p.contains("b") {
		t.Fatal("evicted objects still indexed")
	}
	o, err := p.reserve(4096, 0)
	if err != nil {
		t.Fatal(err)
	}
	if o.off == held.off {
		t.Fatal("new object placed over a held one")
	}
	fill(p.view(o, 0, 4096), 9)
	if string(p.view(held, 0, 4096)) != string(pattern(4096, 1)) {
		t.Fatal("held bytes overwritten")
	}
	p.abort(o)
	p.release(held)
	var st Stats
	p.stats(&st)
	if st.BytesUsed != 0 || st.Evictions != 2 {
		t.Fatalf("stats %+v", st)
	}
	if _, err := p.reserve(8192, 0); err != nil {
		t.Fatalf("after release: %v", err)
	}

}

func TestPoolClearWhileHeld(t *testing.T) {
	p, err := newPool(4096, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	o, _ := p.reserve(4096, 0)
	p.publish("k", o)
	held := p.acquire("k")
	p.clear()
	if _, err := p.reserve(64, 0); err == nil {
		t.Fatal("cleared but held bytes reused")
	}
	p.release(held)
	if _, err := p.reserve(4096, 0); err != nil {
		t.Fatal(err)
	}
}

// TestPoolRefusesWithoutEvicting: a reservation that eviction could never
// make room for is refused before any stored object is evicted.
func TestPoolRefusesWithoutEvicting(t *testing.T) {
	p, err := newPool(16384, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	for _, k := range []string{"a", "b"} {
		o, err := p.reserve(4096, 0)
		if err != nil {
			t.Fatal(err)
		}
		p.publish(k, o)
	}
	inFlight, err := p.reserve(8192, 0) // a transfer still filling its object
	if err != nil {
		t.Fatal(err)
	}
	for _, size := range []uint64{16385, 12288} {
		if _, err := p.reserve(size, 0); !errors.Is(err, errNoSpace) {
			t.Fatalf("reserve(%d): %v, want errNoSpace", size, err)
		}
		if !p.contains("a") || !p.contains("b") {
			t.Fatalf("reserve(%d) evicted objects and still failed", size)
		}
	}
	var st Stats
	p.stats(&st)
	if st.Evictions != 0 {
		t.Fatalf("%d evictions", st.Evictions)
	}
	// What eviction can serve still evicts.
	o, err := p.reserve(8192, 0)
	if err != nil {
		t.Fatal(err)
	}
	if p.contains("a") || p.contains("b") {
		t.Fatal("a and b should have made room")
	}
	p.abort(o)
	p.abort(inFlight)
}

// TestPoolPrefaultHugePages: a prefaulted pool is backed by transparent
// huge pages where the kernel offers them on request.
func TestPoolPrefaultHugePages(t *testing.T) {
	for _, f := range []string{"enabled", "defrag"} {
		b, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/" + f)
		if err != nil || !bytes.Contains(b, []byte("[always]")) && !bytes.Contains(b, []byte("[madvise]")) {
			t.Skipf("transparent huge pages %s: %q, %v", f, b, err)
		}
	}
	p, err := newPool(64<<20, true, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Skip(err)
	}
	// The arena's entry: the one whose address range holds the arena.
	base := uint64(p.base())
	var huge string
	in := false
	for _, line := range strings.Split(string(smaps), "\n") {
		var lo, hi uint64
		if n, _ := fmt.Sscanf(line, "%x-%x ", &lo, &hi); n == 2 {
			in = lo <= base && base < hi
			continue
		}
		if in && strings.HasPrefix(line, "AnonHugePages:") {
			huge = strings.TrimSpace(strings.TrimPrefix(line, "AnonHugePages:"))
		}
	}
	if huge == "" {
		t.Fatalf("no smaps entry for the arena at %#x", base)
	}
	if huge == "0 kB" {
		t.Fatalf("a prefaulted 64 MiB pool has no huge pages (AnonHugePages: %s)", huge)
	}
}

// TestEvictionReports: the first eviction is logged at once; the ones
// after it are summed into one line at most evictionReportEvery apart.
func TestEvictionReports(t *testing.T) {
	p, err := newPool(8192, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	var logged bytes.Buffer
	p.log = slog.New(slog.NewTextHandler(&logged, nil))
	store := func(key string) {
		t.Helper()
		o, err := p.reserve(4096, 0)
		if err != nil {
			t.Fatal(err)
		}
		p.publish(key, o)
	}
	store("a")
	store("b")
	if logged.Len() != 0 {
		t.Fatalf("logged before any eviction: %s", logged.String())
	}
	store("c") // evicts a
	if n := strings.Count(logged.String(), "evicted to make room"); n != 1 || !strings.Contains(logged.String(), "evicted=1 evicted_bytes=4096") {
		t.Fatalf("after the first eviction, logged %d lines: %s", n, logged.String())
	}
	for i := range 5 { // five more, within the interval: not said yet
		store(fmt.Sprint("d", i))
	}
	if n := strings.Count(logged.String(), "evicted to make room"); n != 1 {
		t.Fatalf("evictions within %v were logged %d times, want once", evictionReportEvery, n)
	}
	p.mu.Lock()
	r := p.evictionReportLocked(p.lastReport.Add(evictionReportEvery))
	p.mu.Unlock()
	if r.objects != 5 || r.bytes != 5*4096 || r.over != evictionReportEvery {
		t.Fatalf("the report an interval later = %+v, want the 5 evictions since the first, over %v", r, evictionReportEvery)
	}
}
