package umbp

import (
	"sync"
	"sync/atomic"

	"github.com/umbp-go/umbp-go/internal/conn"
)

// jobSet is a worker handle's jobs: those submitted and not yet ended, how
// many of them are blocked, and the job counters. A job tells the set it
// belongs to of its own transitions (job.go); the handle reads the set.
type jobSet struct {
	stats   *transferCounters
	blocked atomic.Int64 // jobs in phaseBlocked

	mu   sync.Mutex
	jobs map[*TransferJob]struct{}
}

func newJobSet(stats *transferCounters) *jobSet {
	return &jobSet{stats: stats, jobs: map[*TransferJob]struct{}{}}
}

// add counts a job being submitted, before it can run and so before it can
// end.
func (s *jobSet) add(j *TransferJob) {
	s.mu.Lock()
	s.jobs[j] = struct{}{}
	s.mu.Unlock()
	s.stats.submitted.Add(1)
}

// blockedDelta counts a job entering (+1) or leaving (-1) phaseBlocked.
func (s *jobSet) blockedDelta(d int) { s.blocked.Add(int64(d)) }

// count counts a job that ended from phase was, with status and the object
// bytes of its keys that succeeded. It runs before the job's Done closes
// (under the job's lock: it takes none), so that Stats counts a job once
// Wait has returned for it.
func (s *jobSet) count(kind jobKind, was phase, status JobStatus, bytes uint64) {
	switch {
	case was == phaseNew: // refused before submission
		if status != JobCompleted { // a job of no plans completes unsubmitted
			s.stats.refused.Add(1)
		}
		return
	case status == JobCompleted:
		s.stats.completed.Add(1)
	default:
		s.stats.failed.Add(1)
	}
	if kind == kindStore {
		s.stats.bytesStored.Add(bytes)
	} else {
		s.stats.bytesLoaded.Add(bytes)
	}
}

// forget drops a job that ended from phase was. (A job leaving phaseBlocked
// has left the blocked count already, before its Done.)
func (s *jobSet) forget(j *TransferJob, was phase) {
	if was == phaseNew { // never added
		return
	}
	s.mu.Lock()
	delete(s.jobs, j)
	s.mu.Unlock()
}

// alone reports whether j is the one job of the set that has not ended:
// nothing queued or running beside it, blocked or not. (A job that has
// ended leaves the set just after its Done.)
func (s *jobSet) alone(j *TransferJob) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, in := s.jobs[j]; !in {
		return false
	}
	for other := range s.jobs {
		if other != j && !other.ended() {
			return false
		}
	}
	return true
}

// on returns the jobs submitted on c, or every job for a nil c.
func (s *jobSet) on(c *conn.Conn) []*TransferJob {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]*TransferJob, 0, len(s.jobs))
	for j := range s.jobs {
		if c == nil || j.connection() == c {
			out = append(out, j)
		}
	}
	return out
}
