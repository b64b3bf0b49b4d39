package umbp_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"unsafe"

	"github.com/umbp-go/umbp-go/internal/hip"
	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
)

// Go heap memory given to RegisterBuffers with the default location is an
// invalid buffer, as ErrInvalidBuffer's doc says (host memory outside a
// HostBuffer), whether or not the host has a GPU runtime: not a host that
// lacks something (ErrNotSupported).
func TestRegisterGoHeapIsInvalidBuffer(t *testing.T) {
	goHeap := make([]byte, 4096)
	heap := map[string]umbp.Buffer{"heap": {Ptr: uintptr(unsafe.Pointer(&goHeap[0])), Size: 4096}}
	register := func(t *testing.T) error {
		srv := newServer(t, umbptest.Options{})
		e := newEngine(t, newRuntime(t, testConfig(t, srv.Endpoint())), 1, 4, 4096)
		return e.w.RegisterBuffers(context.Background(), heap)
	}
	check := func(t *testing.T, err error, text string) {
		t.Helper()
		if !errors.Is(err, umbp.ErrInvalidBuffer) || errors.Is(err, umbp.ErrNotSupported) {
			t.Errorf("Go heap memory: %v; want ErrInvalidBuffer, not ErrNotSupported", err)
		}
		if err == nil || !strings.Contains(err.Error(), text) {
			t.Errorf("Go heap memory: %v; want it to say %q", err, text)
		}
	}
	t.Run("no GPU runtime", func(t *testing.T) {
		_, loadErr := hip.Open(hip.Options{HIPLibraries: []string{filepath.Join(t.TempDir(), "libamdhip64.so.7")}})
		if loadErr == nil {
			t.Fatal("a missing library loaded")
		}
		t.Cleanup(umbp.SetGPURuntime(nil, loadErr))
		check(t, register(t), `"heap": invalid buffer: memory at 0x`)
		check(t, register(t), "lies in no HostBuffer (host memory must come from NewHostBuffer), and it cannot be GPU memory: no GPU runtime")
	})
	t.Run("a GPU runtime", func(t *testing.T) {
		useFakeGPU(t)
		check(t, register(t), "is host memory, not GPU memory: the server can map host memory only from a memfd, so host memory must come from NewHostBuffer")
	})
}
