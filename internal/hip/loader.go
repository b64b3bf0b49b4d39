package hip

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"unsafe"
)

// LoadError is the error of a load that found no usable runtime. It
// matches ErrNotSupported; its text is one short line, and Tried says what
// each library gave (for logs at debug level).
type LoadError struct {
	// Tried holds one entry per library tried: its path and why it could
	// not be used.
	Tried []string
}

// Error says that no runtime was usable and how many libraries were tried.
func (e *LoadError) Error() string {
	if len(e.Tried) == 0 {
		return "hip: GPU runtime not supported: no candidate libraries"
	}
	if len(e.Tried) == 1 {
		return "hip: GPU runtime not supported: the one library tried is not a usable HIP or CUDA runtime"
	}
	return fmt.Sprintf("hip: GPU runtime not supported: no usable HIP or CUDA runtime among %d libraries tried", len(e.Tried))
}

// Is reports whether target is ErrNotSupported.
func (e *LoadError) Is(target error) bool { return target == ErrNotSupported }

// Details returns what each library tried gave, on one line.
func (e *LoadError) Details() string { return strings.Join(e.Tried, "; ") }

// Environment variables naming a runtime library to try before the default
// names.
const (
	// EnvHIPLibrary names a libamdhip64 to try first.
	EnvHIPLibrary = "UMBP_HIP_LIBRARY"
	// EnvCUDARuntimeLibrary names a libcudart to try first.
	EnvCUDARuntimeLibrary = "UMBP_CUDART_LIBRARY"
)

// Options says which libraries [Open] tries, in order. Empty lists try
// nothing for that library.
type Options struct {
	// HIPLibraries are candidate libamdhip64 paths or sonames.
	HIPLibraries []string
	// CUDARuntimeLibraries are candidate libcudart paths or sonames, tried
	// when no HIP library is usable.
	CUDARuntimeLibraries []string
	// CUDADriverLibraries are candidate libcuda paths or sonames, opened
	// after the CUDA runtime has initialised.
	CUDADriverLibraries []string
}

// DefaultOptions returns the search order [Load] uses: the library named by
// UMBP_HIP_LIBRARY, then libamdhip64.so.7, .so.6 and libamdhip64.so by
// soname, under $ROCM_PATH/lib and under /opt/rocm/lib; then the one named by
// UMBP_CUDART_LIBRARY, libcudart.so.13 and .so.12 by soname, in Python
// site-packages (nvidia/cu13/lib, nvidia/cuda_runtime/lib), under
// $CUDA_HOME/lib64 and /usr/local/cuda/lib64; and libcuda.so.1.
func DefaultOptions() Options {
	return defaultOptions(os.Getenv, filepath.Glob)
}

func defaultOptions(getenv func(string) string, glob func(string) ([]string, error)) Options {
	return Options{
		HIPLibraries:         hipCandidates(getenv),
		CUDARuntimeLibraries: cudartCandidates(getenv, glob),
		CUDADriverLibraries:  cudaDriverCandidates(),
	}
}

var hipNames = []string{"libamdhip64.so.7", "libamdhip64.so.6", "libamdhip64.so"}

func hipCandidates(getenv func(string) string) []string {
	var out []string
	if p := getenv(EnvHIPLibrary); p != "" {
		out = append(out, p)
	}
	dirs := []string{""}
	if r := getenv("ROCM_PATH"); r != "" {
		dirs = append(dirs, filepath.Join(r, "lib"))
	}
	dirs = append(dirs, "/opt/rocm/lib")
	for _, d := range dirs {
		for _, n := range hipNames {
			out = append(out, joinLib(d, n))
		}
	}
	return dedupe(out)
}

var cudartNames = []string{"libcudart.so.13", "libcudart.so.12"}

func cudartCandidates(getenv func(string) string, glob func(string) ([]string, error)) []string {
	var out []string
	if p := getenv(EnvCUDARuntimeLibrary); p != "" {
		out = append(out, p)
	}
	out = append(out, cudartNames...)
	// Python wheels (nvidia-cuda-runtime): found only where they exist.
	var roots []string
	for _, env := range []string{"VIRTUAL_ENV", "CONDA_PREFIX"} {
		if r := getenv(env); r != "" {
			roots = append(roots, r)
		}
	}
	if h := getenv("HOME"); h != "" {
		roots = append(roots, filepath.Join(h, ".local"))
	}
	roots = append(roots, "/usr/local", "/usr", "/opt/conda")
	for _, root := range roots {
		for _, pkgs := range []string{"site-packages", "dist-packages"} {
			for _, sub := range []string{"cu13", "cuda_runtime"} {
				for _, n := range cudartNames {
					matches, err := glob(filepath.Join(root, "lib", "python3*", pkgs, "nvidia", sub, "lib", n))
					if err == nil {
						out = append(out, matches...)
					}
				}
			}
		}
	}
	var dirs []string
	for _, env := range []string{"CUDA_HOME", "CUDA_PATH"} {
		if r := getenv(env); r != "" {
			dirs = append(dirs, filepath.Join(r, "lib64"))
		}
	}
	dirs = append(dirs, "/usr/local/cuda/lib64")
	for _, d := range dirs {
		for _, n := range cudartNames {
			out = append(out, joinLib(d, n))
		}
	}
	return dedupe(out)
}

func cudaDriverCandidates() []string {
	// The runtime has already loaded the driver by soname when this list is
	// tried, so the soname finds that same copy.
	return []string{
		"libcuda.so.1",
		"/usr/lib/x86_64-linux-gnu/libcuda.so.1",
		"/usr/lib/aarch64-linux-gnu/libcuda.so.1",
		"/usr/lib64/libcuda.so.1",
		"/usr/local/nvidia/lib64/libcuda.so.1",
	}
}

func joinLib(dir, name string) string {
	if dir == "" {
		return name
	}
	return filepath.Join(dir, name)
}

func dedupe(in []string) []string {
	seen := make(map[string]bool, len(in))
	out := in[:0]
	for _, s := range in {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

var (
	loadOnce sync.Once
	loadRT   *Runtime
	loadErr  error
)

// Load returns the process's GPU runtime, loading it on first use with
// [DefaultOptions]. Later calls return the same result, success or failure.
// When no runtime is usable the error wraps [ErrNotSupported] and says what
// was tried and why each attempt failed.
func Load() (*Runtime, error) {
	loadOnce.Do(func() {
		loadRT, loadErr = Open(DefaultOptions())
	})
	return loadRT, loadErr
}

// Available reports whether [Load] succeeds.
func Available() bool {
	_, err := Load()
	return err == nil
}

// Open loads a runtime from the libraries opts names, without caching: HIP
// first, used only when hipInit(0) succeeds and a device is counted; else
// CUDA, used when a device is counted. Most callers want [Load]; Open is for
// tests and unusual deployments. Each successful Open keeps its libraries
// loaded for the life of the process.
func Open(opts Options) (*Runtime, error) {
	if !cgoEnabled {
		return nil, fmt.Errorf("hip: GPU runtime %w: built without cgo or not on Linux", ErrNotSupported)
	}
	var why []string
	if r := openHIP(opts.HIPLibraries, &why); r != nil {
		return r, nil
	}
	if r := openCUDA(opts.CUDARuntimeLibraries, opts.CUDADriverLibraries, &why); r != nil {
		return r, nil
	}
	return nil, &LoadError{Tried: why}
}

// minCUDAVersion is CUDA 11.0: earlier runtimes laid out
// cudaPointerAttributes differently.
const minCUDAVersion = 11000

// Slots of the function table, one per runtime function. trampolines.h
// numbers them the same way.
const (
	fnInit = iota
	fnRuntimeVersion
	fnDeviceCount
	fnSetDevice
	fnGetDevice
	fnMalloc
	fnFree
	fnHostRegister
	fnHostUnregister
	fnMemcpy
	fnMemcpyAsync
	fnStreamCreate
	fnStreamSynchronize
	fnStreamDestroy
	fnEventCreate
	fnEventRecord
	fnEventSynchronize
	fnEventQuery
	fnEventDestroy
	fnPointerAttributes
	fnAddressRange
	fnIpcGet
	fnIpcOpen
	fnIpcClose
	fnErrorString
	fnDeviceSynchronize
	fnGetLastError
	fnDriverErrorString
	fnMemcpyBatchAsync
	fnCount
)

// symbol names the function behind one table slot for each vendor.
type symbol struct {
	hip  string // empty: not used with HIP
	cuda string // empty: not used with CUDA
	// optional symbols may be missing; calls check for NULL first.
	optional bool
	// cudaDriver symbols come from libcuda rather than libcudart.
	cudaDriver bool
}

// symbols are bound in slot order.
var symbols = [fnCount]symbol{
	fnInit:              {hip: "hipInit"},
	fnRuntimeVersion:    {hip: "hipRuntimeGetVersion", cuda: "cudaRuntimeGetVersion"},
	fnDeviceCount:       {hip: "hipGetDeviceCount", cuda: "cudaGetDeviceCount"},
	fnSetDevice:         {hip: "hipSetDevice", cuda: "cudaSetDevice"},
	fnGetDevice:         {hip: "hipGetDevice", cuda: "cudaGetDevice"},
	fnMalloc:            {hip: "hipMalloc", cuda: "cudaMalloc"},
	fnFree:              {hip: "hipFree", cuda: "cudaFree"},
	fnHostRegister:      {hip: "hipHostRegister", cuda: "cudaHostRegister"},
	fnHostUnregister:    {hip: "hipHostUnregister", cuda: "cudaHostUnregister"},
	fnMemcpy:            {hip: "hipMemcpy", cuda: "cudaMemcpy"},
	fnMemcpyAsync:       {hip: "hipMemcpyAsync", cuda: "cudaMemcpyAsync"},
	fnStreamCreate:      {hip: "hipStreamCreateWithFlags", cuda: "cudaStreamCreateWithFlags"},
	fnStreamSynchronize: {hip: "hipStreamSynchronize", cuda: "cudaStreamSynchronize"},
	fnStreamDestroy:     {hip: "hipStreamDestroy", cuda: "cudaStreamDestroy"},
	fnEventCreate:       {hip: "hipEventCreateWithFlags", cuda: "cudaEventCreateWithFlags"},
	fnEventRecord:       {hip: "hipEventRecord", cuda: "cudaEventRecord"},
	fnEventSynchronize:  {hip: "hipEventSynchronize", cuda: "cudaEventSynchronize"},
	fnEventQuery:        {hip: "hipEventQuery", cuda: "cudaEventQuery"},
	fnEventDestroy:      {hip: "hipEventDestroy", cuda: "cudaEventDestroy"},
	fnPointerAttributes: {hip: "hipPointerGetAttributes", cuda: "cudaPointerGetAttributes"},
	fnAddressRange:      {hip: "hipMemGetAddressRange", cuda: "cuMemGetAddressRange_v2", cudaDriver: true},
	fnIpcGet:            {hip: "hipIpcGetMemHandle", cuda: "cudaIpcGetMemHandle"},
	fnIpcOpen:           {hip: "hipIpcOpenMemHandle", cuda: "cudaIpcOpenMemHandle"},
	fnIpcClose:          {hip: "hipIpcCloseMemHandle", cuda: "cudaIpcCloseMemHandle"},
	fnErrorString:       {hip: "hipGetErrorString", cuda: "cudaGetErrorString"},
	fnDeviceSynchronize: {hip: "hipDeviceSynchronize", cuda: "cudaDeviceSynchronize"},
	fnGetLastError:      {hip: "hipGetLastError", cuda: "cudaGetLastError", optional: true},
	fnDriverErrorString: {cuda: "cuGetErrorString", optional: true, cudaDriver: true},
	// HIP's hipMemcpyBatchAsync (7.1 and later) is left out: it refuses
	// attributes in some releases and was slower than single copies.
	fnMemcpyBatchAsync: {cuda: "cudaMemcpyBatchAsync", optional: true},
}

func (s symbol) name(v Vendor) string {
	if v == VendorCUDA {
		return s.cuda
	}
	return s.hip
}

// library is a handle dlopen returned. Libraries are never closed.
type library unsafe.Pointer

func newRuntime(v Vendor, library string) *Runtime {
	r := &Runtime{tab: newTable(v), vendor: v, library: library}
	if r.tab == nil {
		panic("hip: out of memory allocating the function table")
	}
	for fn, s := range symbols {
		r.names[fn] = s.name(v)
		r.driverFn[fn] = v == VendorCUDA && s.cudaDriver
	}
	return r
}

// release frees the table of a runtime that failed to load. Its libraries
// stay loaded.
func (r *Runtime) release() {
	freeTable(r.tab)
	r.tab = nil
}

// bind resolves, from the library h, the symbols of r's vendor that live in
// that library (the driver's when driver is set). It returns the names of
// the required symbols that are missing.
func (r *Runtime) bind(h library, driver bool) (missing []string) {
	for fn, s := range symbols {
		name := s.name(r.vendor)
		if name == "" || (r.vendor == VendorCUDA && s.cudaDriver != driver) {
			continue
		}
		if !r.tab.bind(fn, h, name) && !s.optional {
			missing = append(missing, name)
		}
	}
	return missing
}

// openHIP uses the first HIP library that loads with every symbol, if it
// initialises and counts a device.
func openHIP(paths []string, why *[]string) *Runtime {
	return openFirst(VendorHIP, paths, why)
}

// openCUDA uses the first CUDA runtime that loads with every symbol and
// counts a device, with the first driver library that has the driver
// symbols. The driver is opened after the runtime has initialised, so that
// its soname finds the copy the runtime loaded.
func openCUDA(rtPaths, drvPaths []string, why *[]string) *Runtime {
	r := openFirst(VendorCUDA, rtPaths, why)
	if r == nil {
		return nil
	}
	for _, d := range drvPaths {
		dh, err := dlopen(d)
		if err != nil {
			*why = append(*why, "CUDA driver "+err.Error())
			continue
		}
		if missing := r.bind(dh, true); len(missing) > 0 {
			*why = append(*why, fmt.Sprintf("CUDA driver %s: missing symbols %s", d, strings.Join(missing, ", ")))
			continue
		}
		r.driver = d
		return r
	}
	*why = append(*why, "CUDA: no usable driver library")
	r.release()
	return nil
}

// openFirst returns a runtime of vendor on the first of paths that loads
// with every symbol of its own library, once it has initialised and counted
// a device; a library that loads but fails that ends the search. Why each
// candidate was passed over goes to why.
func openFirst(v Vendor, paths []string, why *[]string) *Runtime {
	label := strings.ToUpper(string(v))
	for _, p := range paths {
		h, err := dlopen(p)
		if err != nil {
			*why = append(*why, label+" "+err.Error())
			continue
		}
		r := newRuntime(v, p)
		if missing := r.bind(h, false); len(missing) > 0 {
			*why = append(*why, fmt.Sprintf("%s %s: missing symbols %s", label, p, strings.Join(missing, ", ")))
			r.release()
			continue
		}
		if err := r.probe(); err != nil {
			*why = append(*why, fmt.Sprintf("%s %s: %v", label, p, err))
			r.release()
			return nil
		}
		return r
	}
	return nil
}

// probe initialises the runtime, reads its version and requires a device.
func (r *Runtime) probe() error {
	if r.vendor == VendorHIP {
		if err := r.err(r.tab.initialize()); err != nil {
			return err
		}
	}
	n, err := r.DeviceCount()
	if err != nil {
		return err
	}
	if n <= 0 {
		return fmt.Errorf("%s: no devices", r.names[fnDeviceCount])
	}
	v, rc := r.tab.runtimeVersion()
	if err := r.err(rc); err != nil {
		return err
	}
	r.version = v
	if r.vendor == VendorCUDA && r.version < minCUDAVersion {
		return fmt.Errorf("CUDA runtime version %d is older than %d", r.version, minCUDAVersion)
	}
	return nil
}
