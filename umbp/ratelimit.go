package umbp

import (
	"sync"
	"time"
)

// logLimiter lets one message through per interval.
type logLimiter struct {
	mu   sync.Mutex
	last time.Time
}

// allow reports whether a message may be logged now, and if so records it.
func (l *logLimiter) allow() bool {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.last.IsZero() && now.Sub(l.last) < failureLogInterval {
		return false
	}
	l.last = now
	return true
}
