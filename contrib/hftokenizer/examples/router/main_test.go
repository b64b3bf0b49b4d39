package main

import (
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestRouterDemo(t *testing.T) {
	in := strings.Join([]string{
		`{"messages": [{"role": "system", "content": "You are a travel agent: short answers, prices in euros."}, {"role": "user", "content": "Plan a weekend in Lyon."}, {"role": "assistant", "content": "Day one: the old town."}, {"role": "user", "content": "And day two?"}]}`,
		`{"prompt": "Once upon a time"}`,
		`{"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}`,
	}, "\n")
	var out strings.Builder
	c := config{tokenizer: "../../testdata/qwen3", namespace: "router-demo", hash: "sha256", seed: "0", blockSize: 16}
	if err := run(c, strings.NewReader(in), &out); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	for _, want := range []string{
		"request 1 prompt 0 -> node-a at node-a.local:8000: holds 32 of its first tokens",
		"request 2 prompt 0 -> node-a (round robin: no node holds its first block)",
		"request 3: hftokenizer: request: content part of type \"image_url\"",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("output lacks %q:\n%s", want, got)
		}
	}
}
