package umbp

// Where each kind of call runs, as the documents say it: they quote these
// (docs_test's figures), and TestWhereCallsRun checks each against what the
// calls do, so that neither can change alone.
const (
	// A Lookup, LookupPrefix and LookupTokens by default: a lock-step
	// call, ended at LookupTimeout by interrupting its connection.
	whereLookups = "on the caller's own goroutine"
	// Score, Clear and Ping, and every lookup with GRPCLookups: the caller
	// waits at most LookupTimeout (Score's prefix half is a lock-step
	// call all the same, on that goroutine).
	whereOtherCalls = "on a detached goroutine"
	// A transfer, which cannot be interrupted while the server may use its
	// memory: Store and Load return at once. A Wait that finds the
	// handle's one job queued runs its request itself (waited.go), and
	// hands it on, paused, to a goroutine of its own at its bound.
	whereTransfers = "on one of the handle's detached transfer goroutines, or on the goroutine of a Wait that finds it queued as the handle's one job"
	// RegisterBuffers and the external-KV calls, bounded by Timeout.
	whereWorkerCalls = "on the caller's own goroutine"
)
