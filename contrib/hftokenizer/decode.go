package hftokenizer

import "strings"

// Decode returns the text of ids as tokenizers' decode(ids,
// skip_special_tokens) gives it with a ByteLevel decoder: each token's
// bytes, added tokens as written, and bytes that are not UTF-8 as U+FFFD.
// An id the tokenizer does not have is skipped.
func (t *Tokenizer) Decode(ids []int32, skipSpecialTokens bool) string {
	var b []byte
	for _, id := range ids {
		if skipSpecialTokens && t.special[id] {
			continue
		}
		if tok, ok := t.addedContent[id]; ok {
			// A token whose characters are not all byte-level stands
			// for its own UTF-8 bytes (tokenizers'
			// ByteLevel::decode_chain).
			if raw, ok := byteLevelDecode(tok); ok {
				b = append(b, raw...)
			} else {
				b = append(b, tok...)
			}
			continue
		}
		b = append(b, t.vocab.bytes(id)...)
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}
