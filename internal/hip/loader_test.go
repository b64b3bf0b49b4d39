package hip

import (
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func envMap(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestHIPCandidates(t *testing.T) {
	got := hipCandidates(envMap(map[string]string{
		EnvHIPLibrary: "/custom/libamdhip64.so",
		"ROCM_PATH":   "/opt/rocm-6.2.0",
	}))
	want := []string{
		"/custom/libamdhip64.so",
		"libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so",
		"/opt/rocm-6.2.0/lib/libamdhip64.so.7", "/opt/rocm-6.2.0/lib/libamdhip64.so.6", "/opt/rocm-6.2.0/lib/libamdhip64.so",
		"/opt/rocm/lib/libamdhip64.so.7", "/opt/rocm/lib/libamdhip64.so.6", "/opt/rocm/lib/libamdhip64.so",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("hipCandidates =\n%q\nwant\n%q", got, want)
	}

	// ROCM_PATH=/opt/rocm must not list the same paths twice.
	got = hipCandidates(envMap(map[string]string{"ROCM_PATH": "/opt/rocm"}))
	if len(got) != 6 || got[0] != "libamdhip64.so.7" {
		t.Errorf("hipCandidates with ROCM_PATH=/opt/rocm = %q", got)
	}
}

func TestCUDARuntimeCandidates(t *testing.T) {
	wheel := "/venv/lib/python3.12/site-packages/nvidia/cu13/lib/libcudart.so.13"
	var patterns []string
	glob := func(pattern string) ([]string, error) {
		patterns = append(patterns, pattern)
		if ok, _ := filepath.Match(pattern, wheel); ok {
			return []string{wheel}, nil
		}
		return nil, nil
	}
	got := cudartCandidates(envMap(map[string]string{
		EnvCUDARuntimeLibrary: "/custom/libcudart.so",
		"VIRTUAL_ENV":         "/venv",
		"CUDA_HOME":           "/usr/local/cuda-13.0",
	}), glob)
	want := []string{
		"/custom/libcudart.so",
		"libcudart.so.13", "libcudart.so.12",
		wheel,
		"/usr/local/cuda-13.0/lib64/libcudart.so.13", "/usr/local/cuda-13.0/lib64/libcudart.so.12",
		"/usr/local/cuda/lib64/libcudart.so.13", "/usr/local/cuda/lib64/libcudart.so.12",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("cudartCandidates =\n%q\nwant\n%q", got, want)
	}
	var sawCuda12Wheel bool
	for _, p := range patterns {
		if strings.Contains(p, "nvidia/cuda_runtime/lib/libcudart.so.12") {
			sawCuda12Wheel = true
		}
	}
	if !sawCuda12Wheel {
		t.Errorf("no glob for the CUDA 12 wheel layout among %q", patterns)
	}
	if d := cudaDriverCandidates(); d[0] != "libcuda.so.1" {
		t.Errorf("driver candidates start with %q, want the soname", d[0])
	}
}

func TestDefaultOptionsFromEnv(t *testing.T) {
	t.Setenv(EnvHIPLibrary, "/env/libamdhip64.so")
	t.Setenv(EnvCUDARuntimeLibrary, "/env/libcudart.so")
	o := DefaultOptions()
	if len(o.HIPLibraries) == 0 || o.HIPLibraries[0] != "/env/libamdhip64.so" {
		t.Errorf("HIPLibraries = %q, want the override first", o.HIPLibraries)
	}
	if len(o.CUDARuntimeLibraries) == 0 || o.CUDARuntimeLibraries[0] != "/env/libcudart.so" {
		t.Errorf("CUDARuntimeLibraries = %q, want the override first", o.CUDARuntimeLibraries)
	}
	if len(o.CUDADriverLibraries) == 0 {
		t.Errorf("no driver candidates")
	}
}

func TestOpenBogusPaths(t *testing.T) {
	hipPath := filepath.Join(t.TempDir(), "no-such-libamdhip64.so")
	cudaPath := filepath.Join(t.TempDir(), "no-such-libcudart.so")
	rt, err := Open(Options{HIPLibraries: []string{hipPath}, CUDARuntimeLibraries: []string{cudaPath}})
	if err == nil {
		t.Fatalf("Open with bogus paths loaded %v", rt)
	}
	if !errors.Is(err, ErrNotSupported) {
		t.Errorf("error %v does not match ErrNotSupported", err)
	}
	if cgoEnabled {
		for _, p := range []string{hipPath, cudaPath} {
			if !strings.Contains(loadErrText(err), p) {
				t.Errorf("error %q does not name %s", err, p)
			}
		}
	}
	if _, err := Open(Options{}); !errors.Is(err, ErrNotSupported) {
		t.Errorf("Open with no candidates: %v", err)
	}
}

func TestOpenBogusOverrideFromEnv(t *testing.T) {
	bogus := filepath.Join(t.TempDir(), "bogus-libamdhip64.so")
	t.Setenv(EnvHIPLibrary, bogus)
	rt, err := Open(DefaultOptions())
	if err == nil {
		// A real runtime further down the search order was usable.
		t.Logf("loaded %s %s after the bogus override", rt.Vendor(), rt.Library())
		return
	}
	if !errors.Is(err, ErrNotSupported) {
		t.Fatalf("error %v does not match ErrNotSupported", err)
	}
	if cgoEnabled && !strings.Contains(loadErrText(err), bogus) {
		t.Errorf("error %q does not name the override %s", err, bogus)
	}
}

func TestLoadIsCached(t *testing.T) {
	rt1, err1 := Load()
	rt2, err2 := Load()
	t.Logf("Load: %v", err1)
	if rt1 != rt2 || err1 != err2 {
		t.Errorf("Load returned %p, %v then %p, %v", rt1, err1, rt2, err2)
	}
	if Available() != (err1 == nil) {
		t.Errorf("Available() = %v with Load error %v", Available(), err1)
	}
	if err1 != nil && !errors.Is(err1, ErrNotSupported) {
		t.Errorf("Load error %v does not match ErrNotSupported", err1)
	}
}

// loadErrText is an error's text with, for a failed load, what each library
// tried gave.
func loadErrText(err error) string {
	var le *LoadError
	if errors.As(err, &le) {
		return err.Error() + ": " + le.Details()
	}
	return fmt.Sprint(err)
}

func TestSymbolsNameEverySlot(t *testing.T) {
	for fn, s := range symbols {
		if s.hip == "" && s.cuda == "" {
			t.Errorf("slot %d names no symbol for either vendor", fn)
		}
	}
}
