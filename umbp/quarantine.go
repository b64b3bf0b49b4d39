package umbp

import (
	"sync"
	"time"
)

// quarantine holds keys whose load failed: until their time is up they
// answer as misses, so that a scheduler does not schedule a load the pool
// just failed (vLLM's load_failure_quarantine_ms). A nil quarantine holds
// nothing.
type quarantine struct {
	ttl time.Duration
	now func() time.Time

	mu    sync.Mutex
	until map[string]time.Time
	next  time.Time // the earliest expiry; a sweep before it finds nothing
}

func newQuarantine(ttl time.Duration) *quarantine {
	if ttl <= 0 {
		return nil
	}
	return &quarantine{ttl: ttl, now: time.Now, until: make(map[string]time.Time)}
}

// add quarantines keys from now; it reports how many it could not take.
func (q *quarantine) add(keys []string) int {
	if q == nil {
		return 0
	}
	now := q.now()
	end := now.Add(q.ttl)
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.until)+len(keys) > quarantineMax {
		q.sweepLocked(now)
	}
	dropped := 0
	for _, k := range keys {
		if _, ok := q.until[k]; !ok && len(q.until) >= quarantineMax {
			dropped++
			continue
		}
		q.until[k] = end
	}
	if q.next.IsZero() || q.next.After(now.Add(q.ttl)) {
		q.next = end
	}
	return dropped
}

func (q *quarantine) sweepLocked(now time.Time) {
	if now.Before(q.next) {
		return
	}
	q.next = time.Time{}
	for k, t := range q.until {
		if !now.Before(t) {
			delete(q.until, k)
		} else if q.next.IsZero() || t.Before(q.next) {
			q.next = t
		}
	}
}

// first returns the index of the first quarantined key, or len(keys).
func (q *quarantine) first(keys []string) int {
	if q == nil {
		return len(keys)
	}
	now := q.now()
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.until) == 0 {
		return len(keys)
	}
	for i, k := range keys {
		if t, ok := q.until[k]; ok {
			if now.Before(t) {
				return i
			}
			delete(q.until, k)
		}
	}
	return len(keys)
}

// mask clears hits[i] for every quarantined keys[i]; it returns how many.
func (q *quarantine) mask(keys []string, hits []bool) int {
	if q == nil {
		return 0
	}
	now := q.now()
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.until) == 0 {
		return 0
	}
	n := 0
	for i, k := range keys {
		if !hits[i] {
			continue
		}
		if t, ok := q.until[k]; ok {
			if now.Before(t) {
				hits[i] = false
				n++
			} else {
				delete(q.until, k)
			}
		}
	}
	return n
}
