// Package errdefs holds the error values that several of the module's
// packages return, so that one value matches with errors.Is wherever an
// error was made.
package errdefs

import "errors"

// ErrNotSupported means an operation needs something this host or server
// lacks: a GPU runtime, a batched-copy entry point, a server with ranged
// I/O. Errors wrap it with the reason ("hip: GPU runtime not supported: …").
var ErrNotSupported = errors.New("not supported")
