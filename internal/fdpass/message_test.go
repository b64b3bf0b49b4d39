package fdpass

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// golden is the registration of client "umbp-go-test" at base 0x7f0000001000
// with 2 MiB, as MORI's server expects it on the wire.
func goldenPath() string { return filepath.Join("..", "..", "testdata", "fdpass", "registration.bin") }

var goldenReg = Registration{ClientID: "umbp-go-test", WorkerBase: 0x7f0000001000, Size: 2 << 20}

func TestEncodeGolden(t *testing.T) {
	want, err := os.ReadFile(goldenPath())
	if err != nil {
		t.Fatal(err)
	}
	got, err := goldenReg.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("encoding differs from golden bytes:\n got %x\nwant %x", got, want)
	}
	// The layout, spelled out independently of the encoder.
	if len(got) != 88 ||
		binary.LittleEndian.Uint32(got[0:]) != 0x554d4250 ||
		binary.LittleEndian.Uint32(got[4:]) != 1 ||
		string(got[8:20]) != "umbp-go-test" || got[20] != 0 || got[71] != 0 ||
		binary.LittleEndian.Uint64(got[72:]) != 0x7f0000001000 ||
		binary.LittleEndian.Uint64(got[80:]) != 2<<20 {
		t.Fatalf("layout wrong: %x", got)
	}
	dec, err := Decode(want)
	if err != nil || dec != goldenReg {
		t.Fatalf("Decode(golden) = %+v, %v", dec, err)
	}
}

func TestEncodeRejects(t *testing.T) {
	for name, r := range map[string]Registration{
		"empty id":  {ClientID: "", WorkerBase: 1, Size: 1},
		"long id":   {ClientID: strings.Repeat("x", 64), WorkerBase: 1, Size: 1},
		"nul in id": {ClientID: "a\x00b", WorkerBase: 1, Size: 1},
		"size 0":    {ClientID: "a", WorkerBase: 1, Size: 0},
	} {
		if _, err := r.Encode(); !errors.Is(err, ErrInvalidMessage) {
			t.Errorf("%s: Encode err = %v, want ErrInvalidMessage", name, err)
		}
	}
	// 63 bytes is the longest id that fits with its NUL.
	r := Registration{ClientID: strings.Repeat("y", 63), WorkerBase: 1, Size: 1}
	b, err := r.Encode()
	if err != nil || b[71] != 0 {
		t.Fatalf("63-byte id: %v", err)
	}
	if got, err := Decode(b); err != nil || got != r {
		t.Fatalf("round trip of 63-byte id: %+v %v", got, err)
	}
}

func TestDecodeRejects(t *testing.T) {
	good, _ := goldenReg.Encode()
	mut := func(f func(b []byte) []byte) []byte {
		b := append([]byte(nil), good...)
		return f(b)
	}
	cases := map[string][]byte{
		"short":         good[:87],
		"long":          append(append([]byte(nil), good...), 0),
		"empty":         nil,
		"magic":         mut(func(b []byte) []byte { b[0] ^= 1; return b }),
		"version":       mut(func(b []byte) []byte { binary.LittleEndian.PutUint32(b[4:], 2); return b }),
		"no nul":        mut(func(b []byte) []byte { copy(b[8:72], bytes.Repeat([]byte{'a'}, 64)); return b }),
		"empty id":      mut(func(b []byte) []byte { b[8] = 0; return b }),
		"size zero":     mut(func(b []byte) []byte { binary.LittleEndian.PutUint64(b[80:], 0); return b }),
		"id fills 64 b": mut(func(b []byte) []byte { b[71] = 'z'; copy(b[8:71], bytes.Repeat([]byte{'q'}, 63)); return b }),
	}
	for name, b := range cases {
		if _, err := Decode(b); !errors.Is(err, ErrInvalidMessage) {
			t.Errorf("%s: Decode err = %v, want ErrInvalidMessage", name, err)
		}
	}
}

func TestSocketPaths(t *testing.T) {
	for _, c := range []struct{ in, grpc, fd string }{
		{"/run/u/n.grpc.sock", "/run/u/n.grpc.sock", "/run/u/n.fd.sock"},
		{"unix:///run/u/n.grpc.sock", "/run/u/n.grpc.sock", "/run/u/n.fd.sock"},
		{"unix:/tmp/x.sock", "/tmp/x.sock", "/tmp/x.sock.fd.sock"},
		{"/tmp/x.sock", "/tmp/x.sock", "/tmp/x.sock.fd.sock"},
	} {
		g, f, err := SocketPaths(c.in)
		if err != nil || g != c.grpc || f != c.fd {
			t.Errorf("SocketPaths(%q) = %q, %q, %v; want %q, %q", c.in, g, f, err, c.grpc, c.fd)
		}
	}
	for _, bad := range []string{"", "rel/x.sock", "unix://rel", "/" + strings.Repeat("a", 100)} {
		if _, _, err := SocketPaths(bad); err == nil {
			t.Errorf("SocketPaths(%q) accepted", bad)
		}
	}
}

func FuzzDecodeRegistration(f *testing.F) {
	good, _ := goldenReg.Encode()
	f.Add(good)
	f.Add(good[:40])
	f.Add(make([]byte, 88))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := Decode(b)
		if err != nil {
			if !errors.Is(err, ErrInvalidMessage) {
				t.Fatalf("error does not match ErrInvalidMessage: %v", err)
			}
			return
		}
		// Whatever decodes re-encodes to the same fields.
		enc, err := r.Encode()
		if err != nil {
			t.Fatalf("decoded %+v does not re-encode: %v", r, err)
		}
		r2, err := Decode(enc)
		if err != nil || r2 != r {
			t.Fatalf("round trip: %+v -> %+v, %v", r, r2, err)
		}
		if !bytes.Equal(enc[:8], b[:8]) || !bytes.Equal(enc[72:], b[72:]) {
			t.Fatalf("header or tail changed in round trip")
		}
	})
}
