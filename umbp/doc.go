// Package umbp is the Go client of MORI UMBP's node-local KV-cache server,
// umbp_standalone_server.
//
// Every engine, data-parallel rank and worker on a host attaches to one
// server that owns a host DRAM pool: KV blocks stored by one engine are
// reusable by the others and survive engine restarts. A [StandaloneRuntime]
// validates the configuration once and yields handles:
//
//   - a [SchedulerHandle] answers which blocks exist ([SchedulerHandle.Lookup]);
//   - a [WorkerHandle] registers the engine's KV memory with the server and
//     moves blocks between that memory and the pool as asynchronous
//     [TransferJob]s.
//
// The package's promise, above every other property: the pool can only make
// the engine faster. A stalled, slow, crashed or missing server shows up as
// cache misses within a deadline — never as a hung engine step, never as
// wrong bytes, never as memory freed while the server still uses it. Every
// server call runs on a detached goroutine pool, and callers wait for it at
// most a configured bound.
package umbp
