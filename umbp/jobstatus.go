package umbp

import "fmt"

// A job's status, as the engine sees it, and its kind.

// JobStatus is the state of a [TransferJob] as the engine sees it.
type JobStatus int

const (
	// JobRunning is a job queued for, or running on, the handle's transfer
	// goroutines. Its buffers may be in use.
	JobRunning JobStatus = iota + 1
	// JobCompleted is a job whose every key succeeded.
	JobCompleted
	// JobFailed is a job whose every key has an outcome, one at least failed.
	JobFailed
	// JobCancelled is a job withdrawn before it started.
	JobCancelled
)

// String returns the status in upper case, as the reference runtime prints it.
func (s JobStatus) String() string {
	switch s {
	case JobRunning:
		return "RUNNING"
	case JobCompleted:
		return "COMPLETED"
	case JobFailed:
		return "FAILED"
	case JobCancelled:
		return "CANCELLED"
	}
	return fmt.Sprintf("JobStatus(%d)", int(s))
}

type jobKind int

const (
	kindLoad jobKind = iota
	kindStore
)

func (k jobKind) String() string {
	if k == kindStore {
		return "store"
	}
	return "load"
}
