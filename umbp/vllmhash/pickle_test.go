package vllmhash

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"
)

// pickleInts are pickle.dumps(v, protocol=5) for ints, as CPython 3.11
// writes them.
var pickleInts = []struct {
	v    int64
	want string
}{
	{0, "80054b002e"},
	{255, "80054bff2e"},
	{256, "80059504000000000000004d00012e"},
	{65535, "80059504000000000000004dffff2e"},
	{65536, "80059506000000000000004a000001002e"},
	{-1, "80059506000000000000004affffffff2e"},
	{-256, "80059506000000000000004a00ffffff2e"},
	{2147483647, "80059506000000000000004affffff7f2e"},
	{-2147483648, "80059506000000000000004a000000802e"},
	{2147483648, "80059508000000000000008a0500000080002e"},
	{-2147483649, "80059508000000000000008a05ffffff7fff2e"},
	{4294967296, "80059508000000000000008a0500000000012e"},
	{-4294967296, "80059508000000000000008a0500000000ff2e"},
	{549755813888, "80059509000000000000008a060000000080002e"},
	{-549755813888, "80059508000000000000008a0500000000802e"},
	{-549755813889, "80059509000000000000008a06ffffffff7fff2e"},
	{9223372036854775807, "8005950b000000000000008a08ffffffffffffff7f2e"},
	{-9223372036854775808, "8005950b000000000000008a0800000000000000802e"},
	{-128, "80059506000000000000004a80ffffff2e"},
	{-129, "80059506000000000000004a7fffffff2e"},
	{1099511627775, "80059509000000000000008a06ffffffffff002e"},
}

func TestPickleInts(t *testing.T) {
	for _, c := range pickleInts {
		var p pickler
		p.begin()
		p.saveInt(c.v)
		if got := hex.EncodeToString(p.end()); got != c.want {
			t.Errorf("pickle(%d) = %s, want %s", c.v, got, c.want)
		}
		var p2 pickler
		p2.begin()
		p2.saveInt(c.v)
		v, err := unpickle(p2.end())
		if err != nil || v != c.v {
			t.Errorf("unpickle(pickle(%d)) = %v, %v", c.v, v, err)
		}
	}
}

// unpickle decodes the subset of protocol 5 that pickler writes into Go
// values: []byte, string, int64, nil and []any for tuples, and memo lookups
// of strings. It checks the
// framing as CPython's reader does, and more: frames hold whole opcodes,
// are at least frameMin bytes, and only a large payload is unframed after
// the first frame.
func unpickle(b []byte) (any, error) {
	if len(b) < 3 || b[0] != opProto || b[1] != pickleProtocol {
		return nil, fmt.Errorf("no protocol 5 header")
	}
	var (
		stack    []any
		marks    []int
		memo     []any
		pos      = 2
		frameEnd = -1 // end of the current frame, -1 when unframed
	)
	need := func(n int) ([]byte, error) {
		if pos+n > len(b) {
			return nil, fmt.Errorf("truncated at %d", pos)
		}
		if frameEnd >= 0 && pos+n > frameEnd {
			return nil, fmt.Errorf("opcode at %d crosses the frame end %d", pos, frameEnd)
		}
		s := b[pos : pos+n]
		pos += n
		return s, nil
	}
	pop := func(n int) ([]any, error) {
		if n < 0 || len(stack) < n {
			return nil, fmt.Errorf("stack underflow at %d", pos)
		}
		t := append([]any(nil), stack[len(stack)-n:]...)
		stack = stack[:len(stack)-n]
		return t, nil
	}
	for {
		if frameEnd >= 0 && pos == frameEnd {
			frameEnd = -1
		}
		start := pos
		op, err := need(1)
		if err != nil {
			return nil, err
		}
		// An unframed opcode is a large payload, or ends the pickle in
		// a last tail too small for a frame.
		if frameEnd < 0 && op[0] != opFrame {
			switch op[0] {
			case opBinBytes, opBinBytes8, opBinUnicode, opBinUnicode8:
			default:
				if len(b)-start >= frameMin {
					return nil, fmt.Errorf("opcode %#x at %d outside a frame", op[0], start)
				}
			}
		}
		switch op[0] {
		case opFrame:
			if frameEnd >= 0 {
				return nil, fmt.Errorf("frame at %d inside a frame", start)
			}
			n, err := need(8)
			if err != nil {
				return nil, err
			}
			size := binary.LittleEndian.Uint64(n)
			if size < frameMin || size > uint64(len(b)-pos) {
				return nil, fmt.Errorf("frame of %d bytes at %d", size, start)
			}
			frameEnd = pos + int(size)
		case opStop:
			if pos != len(b) || len(stack) != 1 || len(marks) != 0 {
				return nil, fmt.Errorf("STOP at %d with %d bytes after, stack %d, marks %d", start, len(b)-pos, len(stack), len(marks))
			}
			return stack[0], nil
		case opNone:
			stack = append(stack, nil)
		case opBinInt1:
			x, err := need(1)
			if err != nil {
				return nil, err
			}
			stack = append(stack, int64(x[0]))
		case opBinInt2:
			x, err := need(2)
			if err != nil {
				return nil, err
			}
			stack = append(stack, int64(binary.LittleEndian.Uint16(x)))
		case opBinInt:
			x, err := need(4)
			if err != nil {
				return nil, err
			}
			stack = append(stack, int64(int32(binary.LittleEndian.Uint32(x))))
		case opLong1:
			x, err := need(1)
			if err != nil {
				return nil, err
			}
			d, err := need(int(x[0]))
			if err != nil {
				return nil, err
			}
			if len(d) == 0 || len(d) > 8 {
				return nil, fmt.Errorf("LONG1 of %d bytes", len(d))
			}
			var v uint64
			for i := len(d) - 1; i >= 0; i-- {
				v = v<<8 | uint64(d[i])
			}
			shift := 64 - 8*len(d)
			stack = append(stack, int64(v<<shift)>>shift)
		case opShortBinBytes, opBinBytes, opBinBytes8, opShortBinUnicode, opBinUnicode, opBinUnicode8:
			var n uint64
			switch op[0] {
			case opShortBinBytes, opShortBinUnicode:
				x, err := need(1)
				if err != nil {
					return nil, err
				}
				n = uint64(x[0])
			case opBinBytes, opBinUnicode:
				x, err := need(4)
				if err != nil {
					return nil, err
				}
				n = uint64(binary.LittleEndian.Uint32(x))
			default:
				x, err := need(8)
				if err != nil {
					return nil, err
				}
				n = binary.LittleEndian.Uint64(x)
			}
			if n > uint64(len(b)) {
				return nil, fmt.Errorf("payload of %d bytes", n)
			}
			short := op[0] == opShortBinBytes || op[0] == opShortBinUnicode
			if !short && n <= 0xff || (op[0] == opBinBytes8 || op[0] == opBinUnicode8) && n <= 0xffffffff {
				return nil, fmt.Errorf("payload of %d bytes with a longer header than needed", n)
			}
			if frameEnd < 0 && n < frameTarget && len(b)-start >= frameMin {
				return nil, fmt.Errorf("unframed payload of %d bytes at %d", n, start)
			}
			d, err := need(int(n))
			if err != nil {
				return nil, err
			}
			if op[0] == opShortBinBytes || op[0] == opBinBytes || op[0] == opBinBytes8 {
				stack = append(stack, bytes.Clone(d))
			} else {
				if !utf8.Valid(d) {
					return nil, fmt.Errorf("str at %d is not UTF-8", start)
				}
				stack = append(stack, string(d))
			}
		case opEmptyTuple:
			stack = append(stack, []any{})
		case opMark:
			marks = append(marks, len(stack))
		case opTuple:
			if len(marks) == 0 {
				return nil, fmt.Errorf("TUPLE without MARK at %d", start)
			}
			m := marks[len(marks)-1]
			marks = marks[:len(marks)-1]
			t, err := pop(len(stack) - m)
			if err != nil {
				return nil, err
			}
			stack = append(stack, t)
		case opTuple1, opTuple2, opTuple3:
			t, err := pop(int(op[0]-opTuple1) + 1)
			if err != nil {
				return nil, err
			}
			stack = append(stack, t)
		case opMemoize:
			if len(stack) == 0 {
				return nil, fmt.Errorf("MEMOIZE on an empty stack")
			}
			memo = append(memo, stack[len(stack)-1])
		case opBinGet, opLongBinGet:
			n := 1
			if op[0] == opLongBinGet {
				n = 4
			}
			x, err := need(n)
			if err != nil {
				return nil, err
			}
			idx := int(x[0])
			if n == 4 {
				idx = int(binary.LittleEndian.Uint32(x))
				if idx < 256 {
					return nil, fmt.Errorf("LONG_BINGET of %d at %d", idx, start)
				}
			}
			if idx >= len(memo) {
				return nil, fmt.Errorf("memo %d of %d at %d", idx, len(memo), start)
			}
			if _, ok := memo[idx].(string); !ok {
				return nil, fmt.Errorf("memo %d at %d is not a str", idx, start)
			}
			stack = append(stack, memo[idx])
		default:
			return nil, fmt.Errorf("unexpected opcode %#x at %d", op[0], start)
		}
	}
}

// blockValue is the value a chain pickles for one block, as unpickle
// returns it.
func blockValue(parent []byte, tokens []int32, items []extraItem) any {
	toks := make([]any, len(tokens))
	for i, t := range tokens {
		toks[i] = int64(t)
	}
	var extra any
	if len(items) > 0 {
		e := make([]any, len(items))
		for i, it := range items {
			if it.kind == itemPair {
				e[i] = []any{it.str, int64(it.offset)}
			} else {
				e[i] = it.str
			}
		}
		extra = e
	}
	return []any{bytes.Clone(parent), toks, extra}
}

// TestSharedStrings checks which strings the pickler treats as CPython's
// shared singletons, and that a repeat of one is a memo lookup of the
// first, as CPython writes pickle.dumps(("a", ("a", 0), "a", "ab", "ab"),
// protocol=5) when the strings were decoded from UTF-8 each on its own.
func TestSharedStrings(t *testing.T) {
	for s, want := range map[string]bool{
		"": true, "a": true, "\x00": true, "\x7f": true, "\u0080": true, "é": true, "ÿ": true,
		"Ā": false, "盐": false, "🚀": false, "ab": false, "aa": false,
	} {
		key, got := sharedKey(s)
		if got != want {
			t.Errorf("sharedKey(%q) = %v, want %v", s, got, want)
		}
		if r, _ := utf8.DecodeRuneInString(s); got && s != "" && key != r {
			t.Errorf("sharedKey(%q) = %d, want %d", s, key, r)
		}
	}
	var p pickler
	p.begin()
	p.startTuple(5)
	p.saveStr("a")
	p.startTuple(2)
	p.saveStr("a")
	p.saveInt(0)
	p.endTuple(2)
	p.saveStr("a")
	p.saveStr("ab")
	p.saveStr("ab")
	p.endTuple(5)
	// From CPython 3.11.2: BINGET 0 twice for "a", "ab" written twice.
	const want = "8005951a0000000000000028" + "8c016194" + "6800" + "4b00" + "8694" + "6800" +
		"8c02616294" + "8c02616294" + "7494" + "2e"
	if got := hex.EncodeToString(p.end()); got != want {
		t.Errorf("pickle:\n got %s\nwant %s", got, want)
	}
}

// FuzzPickle encodes block values built from the input and decodes them
// again: the value must survive and the frames must follow CPython's rules.
func FuzzPickle(f *testing.F) {
	f.Add([]byte{1, 2, 3}, uint16(3), "lora", "salt", int64(-5), uint32(0))
	f.Add(bytes.Repeat([]byte{0xff}, 64), uint16(32), "", "", int64(1<<40), uint32(13100))
	f.Add([]byte{0}, uint16(16), "x", "", int64(-1<<63), uint32(70000))
	f.Add([]byte{9, 9, 9, 9}, uint16(32), "é", "é", int64(0), uint32(7))
	f.Fuzz(func(t *testing.T, raw []byte, parentLen uint16, lora, salt string, offset int64, big uint32) {
		if !utf8.ValidString(lora) || !utf8.ValidString(salt) {
			t.Skip()
		}
		parent := bytes.Repeat([]byte{0xa5}, int(parentLen%300))
		tokens := make([]int32, 0, len(raw)/4+int(big%70000))
		for i := 0; i+4 <= len(raw); i += 4 {
			tokens = append(tokens, int32(binary.LittleEndian.Uint32(raw[i:])))
		}
		// A long run of one token, so that some inputs cross the
		// frame target inside the token tuple.
		for range big % 70000 {
			tokens = append(tokens, int32(big))
		}
		if len(tokens) == 0 {
			tokens = append(tokens, 0)
		}
		if n := frameTarget + int(big%5) - 2 - len(lora); big%3 == 0 && lora != "" && n > 0 {
			lora += strings.Repeat("z", n) // around the large-payload threshold
		}
		var items []extraItem
		if lora != "" {
			items = append(items, extraItem{kind: itemLoRA, str: lora})
		}
		for i := range int(big % 4) {
			id := fmt.Sprint("mm", i)
			if big>>2%2 == 1 {
				id = salt // repeats, shared when of one Latin-1 character
			}
			items = append(items, extraItem{kind: itemPair, str: id, offset: int(offset) + i})
		}
		if salt != "" {
			items = append(items, extraItem{kind: itemSalt, str: salt})
		}
		c := &Chain{items: items}
		enc := c.encodePickle(parent, tokens)
		got, err := unpickle(enc)
		if err != nil {
			t.Fatalf("%v\n%x", err, enc[:min(len(enc), 256)])
		}
		if want := blockValue(parent, tokens, items); !reflect.DeepEqual(got, want) {
			t.Fatalf("round trip changed the value")
		}
	})
}

// FuzzUnpickle feeds the test decoder arbitrary bytes: it must answer an
// error or a value, never panic; an int it accepts must survive encoding
// and decoding again.
func FuzzUnpickle(f *testing.F) {
	for _, c := range pickleInts {
		b, _ := hex.DecodeString(c.want)
		f.Add(b)
	}
	f.Add([]byte("\x80\x05\x95\x32\x00\x00\x00\x00\x00\x00\x00C\x20" + strings.Repeat("\x01", 32) + "\x94(K\x01K\x02K\x03K\x04t\x94N\x87\x94."))
	f.Fuzz(func(t *testing.T, b []byte) {
		v, err := unpickle(b)
		if err != nil {
			return
		}
		if x, ok := v.(int64); ok {
			var p pickler
			p.begin()
			p.saveInt(x)
			if y, err := unpickle(p.end()); err != nil || y != x {
				t.Fatalf("int %d: decoded from %x, round trip gives %v, %v", x, b, y, err)
			}
		}
	})
}
