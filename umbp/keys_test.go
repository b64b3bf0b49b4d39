package umbp

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func mustCodec(t testing.TB, ns string, topo RankTopology) *KeyCodec {
	t.Helper()
	c, err := NewKeyCodec(ns, topo)
	if err != nil {
		t.Fatalf("NewKeyCodec(%q, %+v): %v", ns, topo, err)
	}
	return c
}

func TestKeyFormat(t *testing.T) {
	tests := []struct {
		ns    string
		topo  RankTopology
		group int
		hash  []byte
		want  string
	}{
		{"m", RankTopology{}, 0, []byte{0xab, 0x01}, "umbp:vllm:v1:m:tp0:pcp0:dcp0:pp0:g0:ab01"},
		{
			"llama-3/70b", RankTopology{TPRank: 3, TPSize: 8, PCPRank: 1, PCPSize: 2, DCPRank: 2, DCPSize: 4, PPRank: 1, PPSize: 2},
			12, []byte{0xde, 0xad, 0xBE, 0xEF, 0x00},
			"umbp:vllm:v1:llama-3/70b:tp3:pcp1:dcp2:pp1:g12:deadbeef00",
		},
		{"ns", RankTopology{}, 1, nil, "umbp:vllm:v1:ns:tp0:pcp0:dcp0:pp0:g1:"},
		{"ünï", RankTopology{}, 0, []byte{0xff}, "umbp:vllm:v1:ünï:tp0:pcp0:dcp0:pp0:g0:ff"},
	}
	for _, tt := range tests {
		c := mustCodec(t, tt.ns, tt.topo)
		if got := c.Key(tt.group, tt.hash); got != tt.want {
			t.Errorf("Key(%d, %x) = %q, want %q", tt.group, tt.hash, got, tt.want)
		}
		if got := c.groupPrefix(tt.group); !strings.HasPrefix(tt.want, got) || !strings.HasSuffix(got, ":") {
			t.Errorf("Prefix(%d) = %q, not the key %q without its hash", tt.group, got, tt.want)
		}
		p, err := ParseKey(tt.want)
		if err != nil {
			t.Fatalf("ParseKey(%q): %v", tt.want, err)
		}
		if p.Namespace != tt.ns || p.TPRank != tt.topo.TPRank || p.PCPRank != tt.topo.PCPRank ||
			p.DCPRank != tt.topo.DCPRank || p.PPRank != tt.topo.PPRank || p.Group != tt.group || !bytes.Equal(p.Hash, tt.hash) {
			t.Errorf("ParseKey(%q) = %+v", tt.want, p)
		}
	}
}

func TestKeyHex(t *testing.T) {
	c := mustCodec(t, "ns", RankTopology{TPRank: 1, TPSize: 2})
	got, err := c.KeyHex(3, "00FFaB")
	if err != nil {
		t.Fatal(err)
	}
	if want := c.Key(3, []byte{0x00, 0xff, 0xab}); got != want {
		t.Fatalf("KeyHex = %q, want %q", got, want)
	}
	for _, bad := range []string{"abc", "zz", "0x12", "ab cd"} {
		if _, err := c.KeyHex(0, bad); !errors.Is(err, ErrInvalidKey) || !strings.Contains(err.Error(), bad) {
			t.Errorf("KeyHex(%q) error = %v, want ErrInvalidKey naming the hash", bad, err)
		}
	}
}

func TestNewKeyCodecErrors(t *testing.T) {
	for _, tt := range []struct {
		ns     string
		topo   RankTopology
		target error
		substr string
	}{
		{"", RankTopology{}, ErrInvalidKey, "empty"},
		{"a:b", RankTopology{}, ErrInvalidKey, `"a:b" contains ':'`},
		{"\xff", RankTopology{}, ErrInvalidKey, "UTF-8"},
		{"ok", RankTopology{TPRank: 4, TPSize: 4}, ErrInvalidTopology, "TPRank 4"},
	} {
		_, err := NewKeyCodec(tt.ns, tt.topo)
		if !errors.Is(err, tt.target) || !strings.Contains(err.Error(), tt.substr) {
			t.Errorf("NewKeyCodec(%q, %+v) error = %v, want %v containing %q", tt.ns, tt.topo, err, tt.target, tt.substr)
		}
	}
	c := mustCodec(t, "ns", RankTopology{TPRank: 1, TPSize: 2})
	if c.namespace != "ns" || c.topo != (RankTopology{TPRank: 1, TPSize: 2, PPSize: 1, PCPSize: 1, DCPSize: 1}) {
		t.Errorf("accessors: %q %+v", c.namespace, c.topo)
	}
}

func TestParseKeyRejects(t *testing.T) {
	for _, key := range []string{
		"",
		"umbp:vllm:v2:ns:tp0:pcp0:dcp0:pp0:g0:ab",
		"umbp:vllm:v1:",
		"umbp:vllm:v1:ns",
		"umbp:vllm:v1::tp0:pcp0:dcp0:pp0:g0:ab",     // empty namespace
		"umbp:vllm:v1:\xff:tp0:pcp0:dcp0:pp0:g0:ab", // bad UTF-8
		"umbp:vllm:v1:ns:tp0:pcp0:dcp0:pp0:g0",      // no hash field
		"umbp:vllm:v1:ns:tp0:pcp0:dcp0:g0:ab",       // missing pp
		"umbp:vllm:v1:ns:pcp0:tp0:dcp0:pp0:g0:ab",   // out of order
		"umbp:vllm:v1:ns:tp:pcp0:dcp0:pp0:g0:ab",    // no digits
		"umbp:vllm:v1:ns:tp01:pcp0:dcp0:pp0:g0:ab",  // leading zero
		"umbp:vllm:v1:ns:tp+1:pcp0:dcp0:pp0:g0:ab",  // sign
		"umbp:vllm:v1:ns:tp-1:pcp0:dcp0:pp0:g0:ab",  // negative
		"umbp:vllm:v1:ns:tp0:pcp0:dcp0:pp0:g-1:ab",  // negative group
		"umbp:vllm:v1:ns:tp0:pcp0:dcp0:pp0:g99999999999999999999:ab",
		"umbp:vllm:v1:ns:tp0:pcp0:dcp0:pp0:g0:abc",   // odd hex
		"umbp:vllm:v1:ns:tp0:pcp0:dcp0:pp0:g0:AB",    // upper-case hex
		"umbp:vllm:v1:ns:tp0:pcp0:dcp0:pp0:g0:ab:cd", // extra field
		"umbp:vllm:v1:ns:tp0:pcp0:dcp0:pp0:g0:zz",
	} {
		if p, err := ParseKey(key); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("ParseKey(%q) = %+v, %v; want ErrInvalidKey", key, p, err)
		} else if key != "" && !strings.Contains(err.Error(), "umbp:vllm") {
			t.Errorf("ParseKey(%q) error %q does not quote the key", key, err)
		}
	}
}

// FuzzParseKey checks that ParseKey accepts exactly canonical keys: whatever
// it accepts re-encodes to the same string, and every key a codec makes from
// the fuzzed fields parses back to those fields.
func FuzzParseKey(f *testing.F) {
	f.Add("umbp:vllm:v1:ns:tp0:pcp0:dcp0:pp0:g0:ab01", "ns", uint8(0), uint8(0), uint8(0), uint8(0), 0, []byte{1})
	f.Add("umbp:vllm:v1:m:tp3:pcp1:dcp2:pp1:g12:deadbeef", "m", uint8(3), uint8(1), uint8(2), uint8(1), 12, []byte{})
	f.Add("umbp:vllm:v1:a:b:tp0:pcp0:dcp0:pp0:g0:", "a:b", uint8(1), uint8(0), uint8(0), uint8(0), -1, []byte(nil))
	f.Add("umbp:vllm:v1:ns:tp00:pcp0:dcp0:pp0:g0:AB", "", uint8(255), uint8(7), uint8(9), uint8(2), 1<<40, []byte{0xff, 0})
	f.Fuzz(func(t *testing.T, key, ns string, tp, pcp, dcp, pp uint8, group int, hash []byte) {
		// Direction 1: decode, then encode.
		if p, err := ParseKey(key); err == nil {
			if again := p.String(); again != key {
				t.Fatalf("ParseKey(%q) = %+v, String() = %q", key, p, again)
			}
			topo := RankTopology{
				TPRank: p.TPRank, TPSize: p.TPRank + 1, PCPRank: p.PCPRank, PCPSize: p.PCPRank + 1,
				DCPRank: p.DCPRank, DCPSize: p.DCPRank + 1, PPRank: p.PPRank, PPSize: p.PPRank + 1,
			}
			if topo.Validate() == nil { // sizes of rank+1 may overflow for huge ranks
				c, err := NewKeyCodec(p.Namespace, topo)
				if err != nil {
					t.Fatalf("ParseKey(%q) accepted namespace %q that NewKeyCodec rejects: %v", key, p.Namespace, err)
				}
				if again := c.Key(p.Group, p.Hash); again != key {
					t.Fatalf("ParseKey(%q) = %+v re-encodes to %q", key, p, again)
				}
			}
		} else if !errors.Is(err, ErrInvalidKey) {
			t.Fatalf("ParseKey(%q) error %v does not match ErrInvalidKey", key, err)
		}

		// Direction 2: encode, then decode.
		topo := RankTopology{
			TPRank: int(tp), TPSize: int(tp) + 1, PCPRank: int(pcp), PCPSize: int(pcp) + 1,
			DCPRank: int(dcp), DCPSize: int(dcp) + 1, PPRank: int(pp), PPSize: int(pp) + 1,
		}
		c, err := NewKeyCodec(ns, topo)
		if err != nil {
			if !errors.Is(err, ErrInvalidKey) {
				t.Fatalf("NewKeyCodec(%q): %v", ns, err)
			}
			return
		}
		k := c.Key(group, hash)
		p, err := ParseKey(k)
		if group < 0 {
			if err == nil {
				t.Fatalf("ParseKey(%q) accepted a negative group", k)
			}
			return
		}
		if err != nil {
			t.Fatalf("ParseKey(%q) of a codec's key: %v", k, err)
		}
		if p.Namespace != ns || p.TPRank != int(tp) || p.PCPRank != int(pcp) || p.DCPRank != int(dcp) ||
			p.PPRank != int(pp) || p.Group != group || !bytes.Equal(p.Hash, hash) {
			t.Fatalf("ParseKey(Key(...)) = %+v; encoded ns %q ranks %d %d %d %d group %d hash %x",
				p, ns, tp, pcp, dcp, pp, group, hash)
		}
	})
}

func BenchmarkKey(b *testing.B) {
	c := mustCodec(b, "llama-3-70b", RankTopology{TPRank: 3, TPSize: 8, PPRank: 1, PPSize: 2})
	hash := bytes.Repeat([]byte{0x5a}, 32)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		_ = c.Key(i&7, hash)
	}
}

func BenchmarkParseKey(b *testing.B) {
	c := mustCodec(b, "llama-3-70b", RankTopology{TPRank: 3, TPSize: 8, PPRank: 1, PPSize: 2})
	key := c.Key(2, bytes.Repeat([]byte{0x5a}, 32))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseKey(key); err != nil {
			b.Fatal(err)
		}
	}
}
