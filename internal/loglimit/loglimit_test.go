package loglimit

import (
	"testing"
	"time"
)

func TestAllowOncePerInterval(t *testing.T) {
	var l Limiter
	if !l.Allow(time.Hour) {
		t.Fatal("the first message was held back")
	}
	if l.Allow(time.Hour) {
		t.Fatal("a second message within the interval was let through")
	}
	if !l.Allow(0) {
		t.Fatal("a message after the interval was held back")
	}
}
