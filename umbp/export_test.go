package umbp

import (
	"time"

	"github.com/umbp-go/umbp-go/internal/hip"
)

// SetGPURuntime makes the package use rt, or fail with err, instead of the
// process's GPU runtime, until restore is called.
func SetGPURuntime(rt *hip.Runtime, err error) (restore func()) {
	gpuLoader.mu.Lock()
	defer gpuLoader.mu.Unlock()
	old := gpuLoader.load
	gpuLoader.load = func() (*hip.Runtime, error) { return rt, err }
	return func() {
		gpuLoader.mu.Lock()
		defer gpuLoader.mu.Unlock()
		gpuLoader.load = old
	}
}

// SetStreamPendingHook makes f run each time a transfer finds that the
// engine's stream has not reached its AfterStream event yet, until restore
// is called. Set it before the transfers it watches are submitted, and
// restore it once they have ended.
func SetStreamPendingHook(f func()) (restore func()) {
	old := testHookStreamPending
	testHookStreamPending = f
	return func() { testHookStreamPending = old }
}

// SetStoreRetryBackoff makes stores pause for d before their retries until
// restore is called.
func SetStoreRetryBackoff(d []time.Duration) (restore func()) {
	old := storeRetryBackoff
	storeRetryBackoff = d
	return func() { storeRetryBackoff = old }
}

// StagingBuffers reports how many staging buffers w holds, and how many of
// them are free for the next transfer.
func StagingBuffers(w *WorkerHandle) (all, free int) {
	w.staging.mu.Lock()
	defer w.staging.mu.Unlock()
	return len(w.staging.all), len(w.staging.free)
}

// StagingMemory returns the memory of each staging buffer w holds: the
// memory no plan may name.
func StagingMemory(w *WorkerHandle) []Buffer {
	w.staging.mu.Lock()
	defer w.staging.mu.Unlock()
	out := make([]Buffer, len(w.staging.all))
	for i, b := range w.staging.all {
		out[i] = Buffer{Ptr: b.base(), Size: b.mappedSize(), Location: LocationHost}
	}
	return out
}

// SetWaitedRunHook makes f run each time a Wait runs a job's request on
// its own goroutine (waited.go), until restore is called. Set it before
// the jobs it watches are submitted, and restore it once they have ended.
func SetWaitedRunHook(f func()) (restore func()) {
	old := testHookWaitedRun.Swap(&f)
	return func() { testHookWaitedRun.Store(old) }
}

// SetPoolClaimHook makes f run on a transfer goroutine before it claims
// each job, until restore is called; it may hold the goroutine back, so
// that a Wait claims the job first. Set it before the jobs it watches are
// submitted, and restore it once they have ended.
func SetPoolClaimHook(f func(*TransferJob)) (restore func()) {
	var p *func(*TransferJob)
	if f != nil {
		p = &f
	}
	old := testHookPoolClaim.Swap(p)
	return func() { testHookPoolClaim.Store(old) }
}

// SetWaitClaimsHook makes f run as a Wait is about to claim each job it
// could run itself, until restore is called.
func SetWaitClaimsHook(f func(*TransferJob)) (restore func()) {
	old := testHookWaitClaims.Swap(&f)
	return func() { testHookWaitClaims.Store(old) }
}
