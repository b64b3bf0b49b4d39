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
// Beyond one node, a [ClusterRuntime] yields the same [SchedulerHandle] on
// MORI's UMBP master, for a scheduler's view of a distributed pool and a
// router's [SchedulerHandle.Score] of where a prompt lives
// (docs/CLUSTER.md).
//
// The package's promise, above every other property: the pool can only make
// the engine faster. A stalled, slow, crashed or missing server shows up as
// cache misses within a deadline — never as a hung engine step, never as
// wrong bytes, never as memory freed while the server still uses it. Every
// server call is bounded, and runs where its bound can hold it:
//   - a lookup runs on the caller's own goroutine, as a lock-step call ended at LookupTimeout;
//   - Score, Clear, Ping (and lookups with GRPCLookups) run on a detached goroutine, waited for at most LookupTimeout;
//   - a transfer runs on one of the handle's detached transfer goroutines, or on the goroutine of a Wait that finds it queued as the handle's one job (the server may use its memory until it answers, so it is never cut off: at the Wait's bound it goes on on a goroutine of its own), waited for at most its deadline;
//   - RegisterBuffers and the external-KV calls run on the caller's own goroutine, bounded by Timeout.
//
// A caller's doing costs that caller alone: its context that ends answers
// it at once (misses, or the context's error) and holds nothing off for
// anyone else; a batch of any size is answered within LookupTimeout of the
// call, as far as it got ([SchedulerHandle.LookupAnswers]); and a key that
// cannot be in the pool (empty, not UTF-8, over [MaxKeyBytes]) fails alone.
//
// # Errors
//
// Every key of a [TransferJob] has its own outcome: [TransferJob.KeyErr] is
// nil for a key that succeeded, else an error that matches one or more of
// the package's sentinels with errors.Is and keeps the server's words and
// the connection's classification in its chain. [WorkerHandle.Wait] answers
// for the whole job — nil only when it COMPLETED — so an engine's decision
// is one errors.Is:
//
//	sentinel             when                                         what the engine does
//	ErrNotAttempted      the key never reached the server: bad plan,  reuse the blocks at once; recompute
//	                     unregistered memory, a blocked or closed
//	                     handle, a reconnect, the stream was late
//	ErrNotInPool         a load found no such object (a miss)         recompute; the destination is untouched
//	ErrRefused           the server would not take a store (pool      the key is not stored; the blocks are free
//	                     full, object too large) or a registration
//	ErrUnavailable       the transport failed or the server went      a load that failed so may have written part
//	                     away; with ErrNotAttempted: it was never     of its destination: recompute those blocks;
//	                     sent                                         the buffers are free once the job ended
//	ErrCancelled         the job was withdrawn before it started      nothing was touched
//	ErrBuffersInUse      Wait: the job is past its deadline (or ctx   do not reuse or free its memory; new
//	                     ended) and the server may still use it       transfers are refused until it returns
//	ErrBuffersAbandoned  Close left buffers registered behind a       keep the memory until its Stats say
//	                     transfer still in flight                     Transfers.AbandonedBytes is zero
//	                                                                  (HostBuffer.Close then succeeds)
//	ErrClosed            the handle was closed                        nothing to do
//	ErrNoReply           a scheduler call got no answer within        treat its unanswered keys as misses
//	                     LookupTimeout, or was held off after one
//	                     that got none (LookupResult.Err)
//	ErrBatchTooLarge     LookupTimeout passed while the server was    ask fewer keys at once, or give a longer
//	                     answering a batch part by part               LookupTimeout; the rest are misses
//	ErrNotSupported      no GPU runtime, or a server without ranged   register host memory, or use another server
//	                     I/O for GPU memory
//	ErrUntrustedServer   the server's socket or process failed the    fix the deployment; nothing was shared
//	                     identity check
//	ErrInvalid…          bad configuration, key, layout, plan,        fix the caller; the error says what is wrong
//	                     topology or buffer, refused before any I/O
//
// Every error a function or method returns is an [*OpError]: the
// operation, the server it asked, and what happened ("umbp: load at
// unix:///run/umbp/node0.grpc.sock: 1 of 4 keys failed: not in the pool:
// ..."). errors.As gives the operation and the server; errors.Is matches
// the sentinels below what happened.
//
// [TransferJob.Err] joins a failed job's distinct key errors, each matched
// by errors.Is and errors.As. Its text says the misses (or a store's
// refusals) as one, naming their first three keys, spells out the first
// three kinds of failure and counts the rest; [TransferJob.KeyErr] gives
// one key's. A
// not-attempted key's text starts with "transfer not attempted", as vLLM's
// runtime prints it.
//
// # Sharp edges of the protocol
//
// First writer wins: a store of a key the pool already holds succeeds and
// keeps the first value; the new bytes are not written. Keys must therefore
// name their content — [KeyCodec] builds them from the namespace, the rank,
// the KV cache group and the block hash, so two engines that store the same
// key store the same bytes.
//
// A ranged load reads exactly the bytes its plan names: a plan smaller than
// the stored object reads a prefix of it without error. An engine whose KV
// layout changed (another block size, other layers) must not load keys
// stored under the old layout: put the layout in the namespace (or let
// [KeyCodec] keys differ), so that such loads miss instead.
package umbp
