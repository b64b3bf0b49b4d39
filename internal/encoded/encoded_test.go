package encoded

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"google.golang.org/grpc/encoding"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/umbp-go/umbp-go/proto/umbppb"
)

// messages are the requests Strings encodes, each with its field.
var messages = []struct {
	name string
	num  protowire.Number
	msg  func(keys []string) proto.Message
}{
	{"BatchKeysRequest", 1, func(k []string) proto.Message { return &umbppb.BatchKeysRequest{Keys: k} }},
	{"BatchLookupRequest", 2, func(k []string) proto.Message { return &umbppb.BatchLookupRequest{Keys: k} }},
}

// sent takes m's bytes as a call would.
func sent(t testing.TB, m *Message) []byte {
	t.Helper()
	c := codec{proto: encoding.GetCodecV2("proto")}
	data, err := c.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	defer data.Free()
	return data.Materialize()
}

// TestStringsAsProto: Strings' bytes are proto.Marshal's for the same
// request, below and above the pooling threshold, with keys long enough
// for two-byte lengths; the codec hands them over once.
func TestStringsAsProto(t *testing.T) {
	for _, mt := range messages {
		for _, n := range []int{0, 1, 64, 4096} {
			keys := make([]string, n)
			for i := range keys {
				keys[i] = strings.Repeat("k", 90+i%80) + string(rune('a'+i%26)) + "é"
			}
			want, err := proto.Marshal(mt.msg(keys))
			if err != nil {
				t.Fatal(err)
			}
			m, err := Strings(mt.num, keys)
			if err != nil {
				t.Fatal(err)
			}
			if m.Len() != len(want) {
				t.Fatalf("%s, %d keys: Len %d, want %d", mt.name, n, m.Len(), len(want))
			}
			if got := sent(t, m); !bytes.Equal(got, want) {
				t.Fatalf("%s, %d keys: the bytes differ from proto.Marshal's", mt.name, n)
			}
			c := codec{proto: encoding.GetCodecV2("proto")}
			if _, err := c.Marshal(m); !errors.Is(err, errSent) {
				t.Fatalf("sent twice: %v, want errSent", err)
			}
			m.Free() // sent: nothing to give back
		}
	}
}

// TestStringsRefusesBadUTF8: as the encoder does, naming the string.
func TestStringsRefusesBadUTF8(t *testing.T) {
	m, err := Strings(1, []string{"a", "b", "\xff"})
	var bad *NotUTF8Error
	if !errors.As(err, &bad) || bad.Index != 2 || m != nil {
		t.Fatalf("Strings = %v, %v; want NotUTF8Error at 2", m, err)
	}
}

// FuzzStrings: for any keys, Strings and proto.Marshal agree, on the bytes
// or on the refusal.
func FuzzStrings(f *testing.F) {
	f.Add("a\x00b", "", "\xff")
	f.Add(strings.Repeat("x", 200), "é", "k")
	f.Fuzz(func(t *testing.T, a, b, c string) {
		keys := []string{a, b, c}
		want, werr := proto.Marshal(&umbppb.BatchKeysRequest{Keys: keys})
		m, err := Strings(1, keys)
		if (werr != nil) != (err != nil) {
			t.Fatalf("proto.Marshal: %v, Strings: %v", werr, err)
		}
		if err != nil {
			return
		}
		if got := sent(t, m); !bytes.Equal(got, want) {
			t.Fatalf("bytes differ for %q", keys)
		}
	})
}

// TestCodecPassesOtherMessages: anything but a *Message, and every reply,
// goes through gRPC's protobuf codec.
func TestCodecPassesOtherMessages(t *testing.T) {
	c := codec{proto: encoding.GetCodecV2("proto")}
	req := &umbppb.BatchKeysRequest{Keys: []string{"x", "y"}}
	data, err := c.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	var back umbppb.BatchKeysRequest
	if err := c.Unmarshal(data, &back); err != nil || !proto.Equal(&back, req) {
		t.Fatalf("round trip: %v, %v", &back, err)
	}
	data.Free()
}

// TestFreeUnsent: a message never sent gives its buffer back, once.
func TestFreeUnsent(t *testing.T) {
	k := Keys{N: 2}
	for range 2 {
		m, err := Strings(1, []string{strings.Repeat("z", 1<<16)})
		if err != nil {
			t.Fatal(err)
		}
		k.Parts = append(k.Parts, Part{Msg: m})
	}
	k.Free()
	k.Free() // again: nothing left
	for i, p := range k.Parts {
		if p.Msg.Len() != 0 {
			t.Fatalf("part %d still holds %d bytes", i, p.Msg.Len())
		}
	}
}
