//go:build !amd64

package server

// haveNTCopy: no non-temporal copy on this architecture.
var haveNTCopy = false

// copyCold copies src to dst as copy does.
func copyCold(dst, src []byte) { copy(dst, src) }
