// Package loglimit lets a repeated warning through at most once an
// interval, so that an operator reads a fault once, not once a call.
package loglimit

import (
	"sync"
	"time"
)

// Limiter lets one message through per interval. Its zero value is ready
// to use, and it is safe for concurrent use.
type Limiter struct {
	mu   sync.Mutex
	last time.Time
}

// Allow reports whether a message may be logged now, none having been in
// the last interval, and if so records it.
func (l *Limiter) Allow(interval time.Duration) bool {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.last.IsZero() && now.Sub(l.last) < interval {
		return false
	}
	l.last = now
	return true
}
