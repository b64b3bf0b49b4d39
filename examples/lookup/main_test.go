package main

import (
	"log/slog"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestLookupDemo(t *testing.T) {
	if err := run("", time.Second, nil, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
}
