package main

import (
	"log/slog"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRouterDemo(t *testing.T) {
	var out strings.Builder
	if err := run("", &out, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{
		"-> node-a at node-a.local:7000: reuses 256 of 256 tokens", // all 16 on HBM
		"-> node-b at node-b.local:7000: reuses 192 of 256 tokens", // 12×0.8 beats c's 16×0.5 and a's 4
		"-> node-c at node-c.local:7000: reuses 160 of 256 tokens",
		"(round robin: no node holds its first block)",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
}
