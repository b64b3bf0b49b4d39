package hftokenizer

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/umbp-go/umbp-go/umbp"
	"github.com/umbp-go/umbp-go/umbp/umbptest"
	"github.com/umbp-go/umbp-go/umbp/vllmhash"
)

func testKeyer(t testing.TB) *umbp.TokenKeyer {
	t.Helper()
	h, err := vllmhash.NewHasher(vllmhash.SHA256, "0")
	if err != nil {
		t.Fatal(err)
	}
	k, err := umbp.NewTokenKeyer(umbp.TokenKeyConfig{
		Namespace: "hftokenizer-test",
		Topology:  umbp.RankTopology{TPSize: 2},
		Groups:    []umbp.KVCacheGroup{{ID: 0, BlockSize: 16}},
		Hasher:    h,
	})
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestRequestKeysMatchOracle checks, for every golden chat request and
// for completions of the corpus's longer strings, that the keys made from
// the request body are the keys the library makes from the oracle's ids,
// cache_salt included.
func TestRequestKeysMatchOracle(t *testing.T) {
	keyer := testKeyer(t)
	checked := 0
	for name, s := range chatSetups(t) {
		for _, c := range readJSONL[chatCase](t, "testdata/chat.jsonl.gz") {
			want, ok := c.IDs[name]
			if !ok {
				continue
			}
			// The salt goes in front, the request's own text (its key
			// order) kept.
			b := append([]byte(`{"cache_salt": "salt-`+c.Name+`", `), c.Request[1:]...)
			got, err := s.tok.RequestKeys(keyer, b, s.opts)
			if err != nil {
				t.Fatalf("%s/%s: %v", name, c.Name, err)
			}
			wantKeys, err := keyer.Keys(want, vllmhash.ExtraKeys{CacheSalt: "salt-" + c.Name})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || !slices.Equal(got[0].Keys, wantKeys.Keys) {
				t.Errorf("%s/%s: keys differ from the oracle's ids' keys", name, c.Name)
			}
			checked++
		}
	}
	toks := models(t)
	long := 0
	for _, c := range readJSONL[encodeCase](t, "testdata/encode.jsonl.gz") {
		if len(c.Text) < 200 || len(c.Text) > 5000 {
			continue
		}
		if long++; long%4 != 0 {
			continue // a quarter of them is enough here: TestEncodeGolden has them all
		}
		for _, name := range goldenModels {
			b, _ := json.Marshal(map[string]any{"model": "m", "prompt": []string{c.Text, c.Text + c.Text}})
			got, err := toks[name].RequestKeys(keyer, b, nil)
			if err != nil {
				t.Fatal(err)
			}
			want := c.IDs[name]
			if s, ok := c.Special[name]; ok {
				want = s // completions add special tokens by default
			}
			wantKeys, err := keyer.Keys(want, vllmhash.ExtraKeys{})
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != 2 || !slices.Equal(got[0].Keys, wantKeys.Keys) {
				t.Errorf("%s: completion of %q: keys differ from the oracle's ids' keys", name, trim(c.Text))
			}
			checked++
		}
	}
	if checked < 100 {
		t.Fatalf("only %d requests checked", checked)
	}
}

// TestRequestScore runs the path end to end: a node of the test master
// holds the blocks of the oracle's ids for a chat, and a router scores the
// chat's request body.
func TestRequestScore(t *testing.T) {
	keyer := testKeyer(t)
	s := chatSetups(t)["qwen3"]
	var c chatCase
	for _, cc := range readJSONL[chatCase](t, "testdata/chat.jsonl.gz") {
		if cc.Name == "tools-system-user" {
			c = cc
		}
	}
	held, err := keyer.Keys(c.IDs["qwen3"], vllmhash.ExtraKeys{})
	if err != nil {
		t.Fatal(err)
	}
	if len(held.Keys) < 4 {
		t.Fatalf("only %d keys", len(held.Keys))
	}
	m := umbptest.NewMaster(t, umbptest.MasterOptions{})
	umbptest.NewNode(t, m.Addr(), umbptest.NodeOptions{ID: "node-a", PeerAddress: "a:1",
		External: map[umbptest.Tier][]string{umbptest.TierDRAM: held.Keys[:len(held.Keys)/2]}})
	umbptest.NewNode(t, m.Addr(), umbptest.NodeOptions{ID: "node-b", PeerAddress: "b:1",
		External: map[umbptest.Tier][]string{umbptest.TierDRAM: held.Keys}})
	rt, err := umbp.NewClusterRuntime(umbp.ClusterConfig{Masters: []string{m.Addr()}, LookupTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	h, err := rt.NewSchedulerHandle(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	keys, err := s.tok.RequestKeys(keyer, c.Request, s.opts)
	if err != nil {
		t.Fatal(err)
	}
	sc, err := h.Score(ctx, umbp.ScoreRequest{Candidates: []string{"node-a", "node-b"}, Prompt: keys[0]})
	if err != nil {
		t.Fatal(err)
	}
	want := len(c.IDs["qwen3"]) / 16 * 16
	if !sc.Complete || sc.Best != 1 || sc.Nodes[1].Tokens != want || sc.Nodes[0].Tokens != held.Tokens(len(held.Keys)/2) {
		t.Fatalf("scores %+v, want node-b holding %d tokens", sc, want)
	}
}
