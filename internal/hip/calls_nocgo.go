//go:build !cgo || !linux

package hip

import "errors"

// This file stands in for calls_cgo.go where there is no cgo, or not Linux:
// no library can be opened ([Open] says so before trying), so no Runtime
// holds a table, and these methods are reached only through the zero
// Runtime, whose calls fail with ErrNotSupported.

const cgoEnabled = false

// table stands in for the C function table this build cannot have.
type table struct{}

// noRuntime is every call's result: a failure that is no runtime's code,
// which Runtime.err reports as ErrNotSupported.
var noRuntime = rc{code: -1}

var errNoDlopen = errors.New("built without cgo or not on Linux: cannot dlopen")

func newTable(Vendor) *table                                       { return nil }
func freeTable(*table)                                             {}
func dlopen(string) (library, error)                               { return nil, errNoDlopen }
func (*table) bind(int, library, string) bool                      { return false }
func (*table) has(int) bool                                        { return false }
func (*table) errorString(bool, int) string                        { return "" }
func (*table) initialize() rc                                      { return noRuntime }
func (*table) runtimeVersion() (int, rc)                           { return 0, noRuntime }
func (*table) deviceCount() (int, rc)                              { return 0, noRuntime }
func (*table) setDevice(int) rc                                    { return noRuntime }
func (*table) getDevice() (int, rc)                                { return 0, noRuntime }
func (*table) malloc(int, uint64) (uintptr, rc)                    { return 0, noRuntime }
func (*table) free(int, uintptr) rc                                { return noRuntime }
func (*table) hostRegister(uintptr, uint64, uint32) rc             { return noRuntime }
func (*table) hostUnregister(uintptr) rc                           { return noRuntime }
func (*table) memcpy(int, uintptr, uintptr, uint64, MemcpyKind) rc { return noRuntime }
func (*table) memcpyAsync(int, uintptr, uintptr, uint64, MemcpyKind, Stream) rc {
	return noRuntime
}
func (*table) memcpyToDevice(int, uintptr, []byte) rc   { return noRuntime }
func (*table) memcpyFromDevice(int, []byte, uintptr) rc { return noRuntime }
func (*table) memcpyBatchAsync(int, int, []uintptr, []uintptr, []uint64, MemcpyKind, uint32, Stream) rc {
	return noRuntime
}
func (*table) streamCreate(int, uint32) (Stream, rc)                      { return 0, noRuntime }
func (*table) eventCreate(int, uint32) (Event, rc)                        { return 0, noRuntime }
func (*table) eventRecord(int, Event, Stream) rc                          { return noRuntime }
func (*table) handleOp(int, int, uintptr) rc                              { return noRuntime }
func (*table) deviceSynchronize(int) rc                                   { return noRuntime }
func (*table) pointerAttributes(uintptr, *[pointerAttributesSize]byte) rc { return noRuntime }
func (*table) addressRange(int, uintptr) (uintptr, uint64, rc)            { return 0, 0, noRuntime }
func (*table) ipcGet(int, uintptr) (IpcMemHandle, rc)                     { return IpcMemHandle{}, noRuntime }
func (*table) ipcOpen(int, *IpcMemHandle, uint32) (uintptr, rc)           { return 0, noRuntime }
