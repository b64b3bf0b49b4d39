package main

import (
	"log/slog"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestDemo runs the whole demonstration, small: the round trip must be
// byte-exact and the stall and recovery must go as the demo says.
func TestDemo(t *testing.T) {
	err := run("", 16, 4, 1024, 100*time.Millisecond, 300*time.Millisecond, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
}
