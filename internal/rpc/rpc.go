// Package rpc is the gRPC call plumbing the module's clients share: the
// protocol's limits, how a batch is cut into requests, requests encoded on
// the caller's goroutine, and what a failed call means (Error).
//
// Errors name the operation and what happened, never the server nor the
// package: the caller, which knows which server it asked, says that once.
package rpc

// The protocol's limits, one constant each.
const (
	// MaxMessageSize is the gRPC message limit of MORI's standalone server
	// and master alike, each way.
	MaxMessageSize = 64 << 20
	// MaxHashes is the most block hashes one external-KV request carries:
	// the master's batch limit (MORI's kMaxExternalKvBatch).
	MaxHashes = 4096
	// MaxNodes bounds the nodes one external-KV match may name.
	MaxNodes = 4096
	// MaxKeyBytes bounds a key: a longer one is refused alone, before
	// anything is sent (a lookup answers it as a miss, a transfer fails
	// it). vLLM's keys are under 200 bytes.
	MaxKeyBytes = 64 << 10
)
