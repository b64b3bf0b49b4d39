package hftokenizer

import "hash/maphash"

// tokenTable holds a vocabulary's tokens as the bytes each stands for,
// with a few large pointer-free arrays instead of a string per token, so
// that a loaded tokenizer costs the garbage collector next to nothing.
type tokenTable struct {
	blob  string   // every token's bytes, one after another
	offs  []uint32 // token id's bytes are blob[offs[id]:offs[id+1]]
	valid []bool   // the id is in the vocabulary
	index map[uint64]int32
	seed  maphash.Seed
	clash map[string]int32 // tokens whose hash another token has too
}

// newTokenTable indexes the tokens given by id ("" for an id not in the
// vocabulary). A token is its byte-level characters' bytes; one with a
// character outside the byte-level alphabet stands for its own UTF-8 bytes
// when decoded, and cannot come out of a byte-level word.
func newTokenTable(byID []string) tokenTable {
	t := tokenTable{
		offs:  make([]uint32, len(byID)+1),
		valid: make([]bool, len(byID)),
		index: make(map[uint64]int32, len(byID)),
		seed:  maphash.MakeSeed(),
	}
	var blob []byte
	for id, tok := range byID {
		t.offs[id] = uint32(len(blob))
		if tok == "" {
			continue
		}
		t.valid[id] = true
		raw, byteLevel := byteLevelDecode(tok)
		if !byteLevel {
			blob = append(blob, tok...)
			continue
		}
		blob = append(blob, raw...)
		h := maphash.Bytes(t.seed, raw)
		if _, dup := t.index[h]; dup {
			if t.clash == nil {
				t.clash = make(map[string]int32)
			}
			t.clash[string(raw)] = int32(id)
			continue
		}
		t.index[h] = int32(id)
	}
	t.offs[len(byID)] = uint32(len(blob))
	t.blob = string(blob)
	return t
}

// bytes returns what token id stands for, "" for an id not in the table.
func (t *tokenTable) bytes(id int32) string {
	if id < 0 || int(id) >= len(t.valid) || !t.valid[id] {
		return ""
	}
	return t.blob[t.offs[id]:t.offs[id+1]]
}

// lookup returns the byte-level token that stands for w.
func (t *tokenTable) lookup(w string) (int32, bool) {
	if id, ok := t.index[maphash.String(t.seed, w)]; ok && t.bytes(id) == w {
		return id, true
	}
	if t.clash != nil {
		id, ok := t.clash[w]
		return id, ok
	}
	return 0, false
}
